"""The activations' sharding constraints, decided by the platform the step is traced for.

Tunix's models constrain their activations (`shard(x, cfg.shd_config.act_btd)` ...) only when JAX's default
backend is not a CPU: on a CPU host it drops every constraint, whatever the mesh. The preflight lowers the
trainer's step on a CPU host for a TPU topology's devices, so it compiled a program without them while the TPU
runs one with them (the lowered programs of the 31B's 2-layer step differed by exactly these ops, host against
a v5e chip; docs/performance.md). `shard` here asks the mesh instead (`attention.target_platform`: a TPU
topology's compile-only devices count as TPU), and `install` puts it in place of the one a Tunix model module
calls. On a CPU mesh nothing changes: no constraint, as before.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.interpreters import pxla

from tpuforge_workloads.families import attention


def shard(x: Any, axes: tuple[Any, ...], eager: bool = False) -> Any:
    """`x` constrained to the partition `axes` over the current mesh, where the step is traced for an
    accelerator (`eager`: placed there, as Tunix's models place a new KV cache); `x` itself on a CPU mesh or
    without one."""
    mesh = pxla.thread_resources.env.physical_mesh
    if mesh.empty or attention.target_platform() == "cpu":
        return x
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))  # type: ignore[no-untyped-call]
    return jax.device_put(x, sharding) if eager else jax.lax.with_sharding_constraint(x, sharding)  # type: ignore[no-untyped-call]


def install(tunix_model_module: Any) -> None:
    """Make a Tunix model module's `shard` this one (its functions look the name up when they run)."""
    if not callable(getattr(tunix_model_module, "shard", None)):
        raise TypeError(f"{tunix_model_module.__name__} has no shard function to replace")
    tunix_model_module.shard = shard
