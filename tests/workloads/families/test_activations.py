"""The activations' sharding constraints follow the platform a step is traced for (families/activations.py):
lowered on this CPU host for a TPU topology, the trainer's step constrains its activations as it does on the
TPU (Tunix's own `shard` dropped them on any CPU host, so the preflight compiled another program than the
chips run); on the CPU devices themselves, no constraint, as before."""

from __future__ import annotations

from typing import Any

import jax

from tests.fixtures.models import tiny_train_config
from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import tiny
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import lower_train_step
from tpuforge_workloads.preflight.topology import slice_devices


def _constraints(devices: list[Any]) -> int:
    text = gemma4_config.parse_config(tiny.hf_config(model_shape("gemma4-tiny")))
    config = tiny_train_config("gs://m", "gs://d", "gs://c")
    mesh = make_mesh(1, 4, devices)
    with jax.set_mesh(mesh), mesh:
        lowered = lower_train_step(text, config, mesh, 16)[0].as_text()
    btd = '[{"fsdp"}, {}, {"tp"}]>'  # Tunix's act_btd: a [rows, tokens, embed] activation
    return sum(1 for line in lowered.splitlines() if "sdy.sharding_constraint" in line and btd in line)


def test_a_step_lowered_here_for_a_tpu_topology_constrains_its_activations(jax_devices: Any) -> None:
    on_tpu = _constraints(slice_devices(TPU_SLICES["v5p-8"]))
    on_cpu = _constraints(jax_devices[:4])
    assert on_cpu == 0
    assert on_tpu >= 2 * model_shape("gemma4-tiny").num_layers, on_tpu  # each layer's attention and MLP at least
