"""The (fsdp, tp) device mesh of a training or evaluation run, laid out for the slice's hosts.

Tensor parallelism all-reduces activations inside every layer, so each tp group must be chips of one host
(one TPU VM), where the interconnect needs no hop through another host's chips; FSDP is the axis that spans
hosts. `jax.make_mesh` orders devices for the physical torus, which on v5p 2x4x4 and 4x4x4 and v6e 4x4 and
4x8 puts a tp group of 4 across two hosts. So the layout is built here: host-major over the slice (hosts in
process order), each host's chips in ICI order (by their torus coordinates), cut into tp groups.

The layout is a pure function of the devices (`device_grid`), so it is tested on the real TPU topologies
through `jax.experimental.topologies` on a CPU machine, and used as is by the trainer on a real slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tpuforge_workloads.families.decoder import ModelError

if TYPE_CHECKING:
    import jax
    import numpy as np

MESH_AXES = ("fsdp", "tp")


def _ici_key(device: Any) -> tuple[int, ...]:
    """A device's place in its host's interconnect: torus coordinates (z, y, x) then core, where the
    platform has them (TPU); the device id otherwise (CPU)."""
    coords = getattr(device, "coords", None)
    core = getattr(device, "core_on_chip", 0)
    if coords is not None:
        return (*reversed(tuple(coords)), core, device.id)
    return (device.id,)


def device_grid(devices: Sequence[Any], fsdp: int, tp: int) -> np.ndarray:
    """`devices` as an (fsdp, tp) array whose rows are tp groups within one host each: hosts in process
    order, each host's chips in ICI order. Raises ModelError naming the fix when fsdp x tp does not cover
    the devices, or tp does not divide a host's chip count."""
    import numpy as np

    need = fsdp * tp
    by_host: dict[int, list[Any]] = {}
    for d in devices:
        by_host.setdefault(d.process_index, []).append(d)
    hosts = len(by_host)
    where = f"this slice's {hosts} hosts have" if hosts > 1 else "this host has"
    platform = devices[0].platform if devices else "none"
    if len(devices) < need or (hosts > 1 and len(devices) != need):
        raise ModelError(
            f"mesh fsdp={fsdp} x tp={tp} needs {need} devices but {where} {len(devices)} ({platform}); "
            f"make fsdp x tp = {len(devices)}"
        )
    per_host = {len(v) for v in by_host.values()}
    local = min(per_host)
    if hosts > 1 and (len(per_host) > 1 or local % tp):
        raise ModelError(
            f"mesh.tp={tp} spans hosts ({local} devices per host); use a tp that divides {local} (e.g. tp={local})"
        )
    ordered = [d for host in sorted(by_host) for d in sorted(by_host[host], key=_ici_key)]
    return np.array(ordered[:need], dtype=object).reshape(fsdp, tp)


def make_mesh(fsdp: int, tp: int, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    """The run's (fsdp, tp) mesh over `devices` (default: every device of every host), laid out by
    `device_grid`. Auto axes: the model code shards with constraints."""
    import jax

    grid = device_grid(list(jax.devices() if devices is None else devices), fsdp, tp)
    return jax.sharding.Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)


def placed_shapes(tree: Any, mesh: Any) -> Any:
    """Abstract values placed as the run places them: each by its partition spec on `mesh`."""
    import jax
    from flax import nnx

    specs = nnx.get_partition_spec(tree)

    def place(x: Any, spec: Any) -> Any:
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if not isinstance(spec, jax.sharding.PartitionSpec):
            spec = jax.sharding.PartitionSpec()  # type: ignore[no-untyped-call]
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.NamedSharding(mesh, spec))  # type: ignore[no-untyped-call]

    return jax.tree.map(place, tree, specs, is_leaf=lambda v: isinstance(v, jax.ShapeDtypeStruct))
