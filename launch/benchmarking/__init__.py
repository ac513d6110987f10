"""What `launch.benchmark`, `launch.memory_benchmark` and `launch.check_devices` time and
measure: the contenders of a round, how they are timed and reported, the resources a process
uses, and where a round's ops run."""
