"""Where TFF computations run: TFF's C++ workers (`cpp_worker`) or this process (`in_process`)."""
