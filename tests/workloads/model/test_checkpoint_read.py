"""The checkpoint reader (each process reads its rows of each tensor, laid out on the devices) loads exactly
what Tunix's own safetensors loader does, parameter for parameter, in both checkpoint layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tpuforge_workloads.families import decoder
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import model as gemma4_model
from tpuforge_workloads.model import checkpoint_read
from tpuforge_workloads.model.mesh import make_mesh


def tunix_preprocess(text: gemma4_config.Gemma4Text) -> Any:
    """Tunix's loader's preprocess_fn: its per-projection attention tensors (tmp.layers.N.attn.q etc.) ->
    Tunix's einsum weights, by the same combination the reader applies on the devices."""

    def preprocess(tensors: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        per_layer: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            m = gemma4_model._TMP_QKV.match(key)
            if m:
                per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = value
            else:
                out[key] = value
        for i, qkv in per_layer.items():
            for name, w in gemma4_model.combine_layer_qkv(qkv, gemma4_model.keys_are_values(text, i), np).items():
                out[f"layers.{i}.attn.{name}"] = w
        return out

    return preprocess


@pytest.mark.parametrize("layout", ["text-only", "multimodal"])
def test_the_reader_loads_what_tunix_loads_bit_for_bit(
    layout: str, tiny_model_dir: Path, tiny_mm_model_dir: Path, jax_devices: Any
) -> None:
    from tunix.models import safetensors_loader
    from tunix.models.gemma4 import model as gm

    model_dir = tiny_mm_model_dir if layout == "multimodal" else tiny_model_dir
    text = gemma4_config.parse_config(decoder.read_config(str(model_dir)))
    cfg = gemma4_model.tunix_config(text)
    mesh = make_mesh(2, 2)
    stats: dict[str, float] = {}
    with jax.set_mesh(mesh):
        got = nnx.state(checkpoint_read.load_model(model_dir, text, cfg, mesh, stats))
        want = nnx.state(
            safetensors_loader.load_and_create_model(
                file_dir=str(model_dir),
                model_class=gm.Gemma4,
                config=cfg,
                key_mapping=gemma4_model.key_mapping,
                mesh=mesh,
                preprocess_fn=tunix_preprocess(text),
            )
        )
    got_flat, want_flat = dict(nnx.to_flat_state(got)), dict(nnx.to_flat_state(want))
    assert got_flat.keys() == want_flat.keys()
    for path, w in want_flat.items():
        g = got_flat[path]
        assert g[...].dtype == w[...].dtype and g[...].sharding == w[...].sharding, path
        np.testing.assert_array_equal(np.asarray(g[...]), np.asarray(w[...]), err_msg=str(path))
    # One process holds every device here, so it reads every decoder tensor once, and nothing else.
    assert stats["model_bytes_read"] == stats["model_bytes"] > 0
