"""The kernel benchmark: time every decode kernel plugin across block sizes, batches and
contexts on a GPU, and turn the timings into calibration files (``kvbench bench-kernels``)."""
