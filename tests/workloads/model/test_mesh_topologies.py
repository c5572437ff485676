"""The trainer's mesh on every catalog slice's real TPU topology (libtpu's compile-only devices, no TPU):
each tp group is one host's chips, and fsdp x tp covers the slice."""

from __future__ import annotations

import jax
import pytest

from tpuforge.api.catalog import TPU_SLICES
from tpuforge_workloads.families.decoder import ModelError
from tpuforge_workloads.model.mesh import MESH_AXES, device_grid, make_mesh
from tpuforge_workloads.preflight.topology import slice_devices


@pytest.mark.parametrize("slice_id", sorted(TPU_SLICES))
def test_default_mesh_keeps_tp_within_a_host(slice_id: str) -> None:
    slc = TPU_SLICES[slice_id]
    devices = slice_devices(slc)
    assert len({d.process_index for d in devices}) == slc.hosts

    mesh = make_mesh(slc.default_fsdp, slc.default_tp, devices)

    assert mesh.axis_names == MESH_AXES
    assert dict(mesh.shape) == {"fsdp": slc.default_fsdp, "tp": slc.default_tp}
    assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}
    for group in mesh.devices:
        assert len({d.process_index for d in group}) == 1, [(d.id, d.process_index) for d in group]


def test_jax_default_layout_would_split_tp_groups_across_hosts_on_v5p_64() -> None:
    # Why the layout is ours: jax.make_mesh orders v5p 2x4x4 for the torus, and a tp group of 4 lands on
    # two hosts, which the trainer used to refuse.
    devices = slice_devices(TPU_SLICES["v5p-64"])
    torus = jax.make_mesh((8, 4), MESH_AXES, devices=devices)
    assert any(len({d.process_index for d in group}) > 1 for group in torus.devices)


def test_tp_groups_follow_the_chips_interconnect_order() -> None:
    # Within a host, adjacent tp ranks are torus neighbours: a v6e-8 host (2x4 chips) cut into tp=2 groups
    # pairs chips that differ in x only.
    grid = device_grid(slice_devices(TPU_SLICES["v6e-8"]), 4, 2)
    for a, b in grid:
        assert a.coords[1:] == b.coords[1:] and abs(a.coords[0] - b.coords[0]) == 1


def test_tp_that_cannot_stay_within_a_host_is_refused_with_the_fix() -> None:
    with pytest.raises(ModelError, match=r"mesh.tp=8 spans hosts \(4 devices per host\); use a tp that divides 4"):
        device_grid(slice_devices(TPU_SLICES["v5p-16"]), 1, 8)
    with pytest.raises(ModelError, match=r"needs 12 devices .* make fsdp x tp = 8"):
        device_grid(slice_devices(TPU_SLICES["v5p-16"]), 3, 4)
