"""A catalog TPU slice as compile-only devices: the chips, hosts and torus coordinates of the real slice,
from libtpu's topology description, on a machine with no TPU.

libtpu describes v6e 2x4 as two hosts of four chips by default; GKE's v6e-8 is one ct6e-standard-8t VM of
eight, so the chips per host are given from the catalog for every slice.
"""

from __future__ import annotations

import os
from typing import Any

from tpuforge.api.catalog import TpuSlice

# libtpu's name for each GKE accelerator family.
_PLATFORM_PREFIX = {"tpu-v5p-slice": "v5p", "tpu-v6e-slice": "v6e", "tpu-v5-lite-podslice": "v5e"}
# A host's chips as a (x, y, z) box: one chip is 1x1, four are 2x2, eight are 2x4.
_HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


class TopologyError(ValueError):
    """A slice this machine cannot describe (no libtpu, or a shape libtpu does not know)."""


def topology_name(slc: TpuSlice) -> str:
    """libtpu's topology name for a catalog slice, e.g. v5p-64 -> 'v5p:2x4x4'."""
    try:
        return f"{_PLATFORM_PREFIX[slc.accelerator]}:{slc.topology}"
    except KeyError as e:
        raise TopologyError(f"{slc.id}: no libtpu topology is known for accelerator {slc.accelerator}") from e


def slice_devices(slc: TpuSlice) -> list[Any]:
    """The slice's devices, compile-only (each with process_index and coords), in libtpu's order."""
    # libtpu takes a machine-wide lock file unless told that several processes may load it: compiles here
    # touch no TPU, and two preflights (or a test beside one) must not refuse each other.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            topology_name=topology_name(slc), platform="tpu", chips_per_host_bounds=_HOST_BOUNDS[slc.chips_per_host]
        )
    except (RuntimeError, KeyError) as e:
        raise TopologyError(
            f"{slc.id}: cannot describe TPU topology {topology_name(slc)} here ({e}); install the `tpu` extra "
            "(libtpu) to compile for TPU on this machine"
        ) from e
    devices = list(topo.devices)
    if len(devices) != slc.chips:
        raise TopologyError(f"{slc.id}: libtpu describes {len(devices)} chips, the catalog {slc.chips}")
    return devices
