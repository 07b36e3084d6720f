"""kvbench's commands, one module each: a thin parser that calls the engine, the product and
the studies (``kvbench``, ``kvbench compare``, ``kvbench paper``, ``kvbench slo-batch``,
``kvbench slo-search``, ``kvbench calibrate``, ``kvbench bench-kernels``)."""
