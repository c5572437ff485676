"""The training workload: `python -m tpuforge_workloads.train --config PATH` (see docs/training.md).

plan         checks and prepares everything before JAX starts (config, model config, data, steps)
loop         the JAX part: model, LoRA, optimizer, Tunix PeftTrainer, resume
checkpoints  Orbax checkpoints with the data iterator and dropout stream
preemption   SIGTERM -> checkpoint -> EXIT_PREEMPTED
hosts        one or several hosts of a slice: jax.distributed, the stop agreement
"""
