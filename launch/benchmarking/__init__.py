"""What `launch.benchmark` and `launch.memory_benchmark` time and measure: the contenders
of a round and the resources a process uses."""
