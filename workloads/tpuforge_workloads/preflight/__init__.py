"""Preflight: the trainer's own train step compiled for a job's TPU slice on a CPU host (libtpu compiles for
a TPU topology with no TPU attached), to learn HBM per chip, FLOPs and the compile time before a TPU is
rented."""
