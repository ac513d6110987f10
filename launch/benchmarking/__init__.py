"""What `launch.benchmark` and `launch.memory_benchmark` time and measure: the contenders
of a round, how they are timed and reported, and the resources a process uses."""
