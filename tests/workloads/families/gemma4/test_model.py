"""The tiny Gemma 4 checkpoint, loading it with Tunix on the mesh, and LoRA on it with Qwix."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tpuforge.api import LoraSpec
from tpuforge.api.catalog import model_shape
from tpuforge_workloads.families import decoder
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import model as gemma4_model
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.families.gemma4.config import Gemma4Text
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def text(tiny_model_dir: Path) -> gemma4_config.Gemma4Text:
    return gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))


def test_tiny_model_has_the_catalog_shape_and_is_reproducible(
    tiny_model_dir: Path, text: Gemma4Text, tmp_path: Path
) -> None:
    gemma4_config.check_against_catalog(text, model_shape("gemma4-tiny"), "tiny")  # raises on any difference
    assert text.layer_types == ("sliding_attention", "full_attention") and text.k_eq_v
    tiny_model.write(str(tmp_path))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_every_parameter_is_random_norms_included(tiny_model_dir: Path) -> None:
    from safetensors.numpy import load_file

    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    for name, w in weights.items():
        assert not np.isin(w, [0.0, 1.0]).any(), name  # nothing left at a default 0 or 1
        assert w.size == 1 or w.std() > 0.01, name


def test_transformers_and_tunix_compute_the_same_logits(
    tiny_model_dir: Path, text: Gemma4Text, jax_devices: Any
) -> None:
    """The tiny checkpoint is a real Gemma 4 checkpoint: transformers' Gemma4ForCausalLM and our Tunix load
    of it agree, over a sequence longer than the sliding window."""
    import torch
    from transformers import AutoModelForCausalLM

    tokens = np.random.default_rng(0).integers(7, text.vocab_size, (2, text.sliding_window + 16))
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor(tokens)).logits.numpy()
    mesh = make_mesh(1, 4)
    with jax.set_mesh(mesh):
        model = checkpoint_read.load_model(tiny_model_dir, text, gemma4_model.tunix_config(text), mesh)
        got = lora.logits(model, tokens)
    np.testing.assert_allclose(got, want, atol=2e-4)


def test_a_multimodal_config_nests_the_decoder_under_text_config(tiny_model_dir: Path) -> None:
    flat = json.loads((tiny_model_dir / "config.json").read_text())
    nested = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": flat}
    parsed = gemma4_config.parse_config(nested)
    assert parsed.multimodal and parsed.hf_prefix == "model.language_model."
    assert parsed.num_heads == 8 and parsed.global_head_dim == 128


@pytest.mark.parametrize("multimodal", [False, True])
def test_tunix_key_mapping_maps_every_decoder_tensor_of_both_layouts(text: Gemma4Text, multimodal: bool) -> None:
    """The loader widens a private Tunix mapping: if Tunix changes it, this fails instead of the loader
    silently skipping tensors. Each decoder tensor maps to exactly one parameter; vision tensors to none."""
    import dataclasses

    from tunix.utils.torch_utils import torch_key_to_jax_key

    layout = dataclasses.replace(text, multimodal=multimodal)
    mapping = gemma4_model.key_mapping(gemma4_model.tunix_config(layout))
    targets = {name: torch_key_to_jax_key(mapping, name)[0] for name in gemma4_model.expected_hf_tensors(layout)}
    assert targets[f"{layout.hf_prefix}layers.1.mlp.down_proj.weight"] == "layers.1.mlp.down_proj.kernel"
    assert targets[f"{layout.hf_prefix}embed_tokens.weight"] == "embedder.input_embedding"
    assert len(set(targets.values())) == len(targets)
    for other in ("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", "lm_head.weight"):
        with pytest.raises(ValueError):
            torch_key_to_jax_key(mapping, other)


def test_mesh_checks_name_what_does_not_divide() -> None:
    shape = model_shape("gemma4-31b")
    text = gemma4_config.Gemma4Text(
        num_layers=shape.num_layers, embed_dim=shape.embed_dim, hidden_dim=shape.hidden_dim,
        num_heads=shape.num_heads, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
        global_head_dim=shape.global_head_dim, num_global_kv_heads=shape.num_global_kv_heads, k_eq_v=True,
        sliding_window=shape.sliding_window, layer_types=("sliding_attention",) * 5 + ("full_attention",),
        vocab_size=shape.vocab_size, final_logit_softcap=30.0, local_rope_theta=1e4, global_rope_theta=1e6,
        global_rope_proportion=0.25, dtype="bfloat16", multimodal=True,
    )  # fmt: skip
    assert decoder.mesh_errors(text, fsdp=1, tp=4) == []
    (error,) = decoder.mesh_errors(text, fsdp=1, tp=8)
    assert error == "mesh.tp=8 does not divide the model's 4 global kv heads; use tp in [1, 2, 4]"


def test_a_checkpoint_missing_tensors_is_refused_before_loading(tiny_model_dir: Path, text: Gemma4Text) -> None:
    names = gemma4_model.expected_hf_tensors(text)
    gemma4_model.check_tensors(names, text, "ok")
    with pytest.raises(
        decoder.ModelError, match=re.escape("1 decoder tensors missing, e.g. model.layers.1.mlp.up_proj.weight")
    ):
        gemma4_model.check_tensors([n for n in names if n != "model.layers.1.mlp.up_proj.weight"], text, "ckpt")
    renamed = [n.replace("model.", "model.language_model.", 1) for n in names]
    with pytest.raises(decoder.ModelError, match=re.escape("config.json and the weights disagree on the layout")):
        gemma4_model.check_tensors(renamed, text, "ckpt")


def test_lora_adapters_are_sharded_by_their_weights_and_never_on_the_rank(
    tiny_model_dir: Path, text: Gemma4Text, jax_devices: Any
) -> None:
    mesh = make_mesh(1, 4)
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, gemma4_model.tunix_config(text), mesh)
    model = lora.apply_lora(base, LoraSpec(rank=8, alpha=16.0, dropout=0.1), mesh, seed=0)
    specs = {
        "/".join(map(str, path)): (v.value.shape, v.value.sharding.spec)
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    }
    assert len(specs) == 2 * 6 * 2  # 2 layers x 6 adapted modules (kv_einsum or k_einsum) x A and B
    assert specs["layers/0/attn/q_einsum/w_lora_b"] == ((8, 8, 64), jax.sharding.PartitionSpec(None, "tp", None))
    assert specs["layers/1/attn/k_einsum/w_lora_b"] == ((8, 4, 128), jax.sharding.PartitionSpec(None, "tp", None))
    assert specs["layers/0/mlp/down_proj/kernel_lora_a"] == ((256, 8), jax.sharding.PartitionSpec("tp", None))
    for name, (shape, spec) in specs.items():
        rank_axis = len(shape) - 1 if "_lora_a" in name else 0
        padded = tuple(spec) + (None,) * (len(shape) - len(spec))
        assert padded[rank_axis] is None, name
    # B starts at zero: the adapted model computes exactly what the base does.
    assert all(
        not np.asarray(v.value).any()
        for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
        if "lora_b" in p[-1]
    )
    # Dropout draws from one stream whose counter is model state (checkpointed with the adapters).
    assert jax.tree.leaves(nnx.state(model, nnx.RngCount))


def test_the_lora_build_holds_the_base_once(tiny_model_dir: Path, text: Gemma4Text, jax_devices: Any) -> None:
    """Adding the adapters (lora.AdapterBuild) reads the base as the program's argument and returns only the
    adapters: XLA's memory analysis of the compiled build says so, and the LoRA model holds the base's own
    arrays (Qwix's insertion alone, jitted, returned a second copy of the base)."""
    mesh = make_mesh(1, 1, jax_devices[:1])
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, gemma4_model.tunix_config(text), mesh)
    spec = LoraSpec(rank=8, alpha=16.0, dropout=0.0)
    build = lora.AdapterBuild(base, spec, mesh, seed=0, adapter_dtype=lora.ADAPTER_DTYPE)
    mem = build.lower(nnx.state(base)).compile().memory_analysis()
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(base)))
    adapter_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(build.adapters))
    assert 0 < adapter_bytes < base_bytes / 4
    assert mem.argument_size_in_bytes == pytest.approx(base_bytes, rel=0.01)
    assert mem.output_size_in_bytes - mem.alias_size_in_bytes <= adapter_bytes + 64 * 1024
    model = lora.apply_lora(base, spec, mesh, seed=0)
    held = {path: x for path, x in nnx.to_flat_state(nnx.state(model, nnx.Not(nnx.LoRAParam)))}
    for path, x in nnx.to_flat_state(nnx.state(base)):
        assert held[path].get_value() is x.get_value(), path  # the same array, not a copy


def test_the_trained_lora_model_is_rebuilt_from_base_and_checkpoint(tiny_training_run: Any, jax_devices: Any) -> None:
    """What the merge's verification uses: load_lora_model(base URI, checkpoint URI) on the CPU."""
    config = tiny_training_run.config
    model, step = lora.load_lora_model(config.model_uri, config.checkpoint.uri)
    assert step == 16
    tokens = np.arange(7, 7 + 24)[None]
    base_state = nnx.state(model, nnx.LoRAParam)
    trained = lora.logits(model, tokens)
    nnx.update(model, jax.tree.map(lambda x: x * 0, base_state))
    untrained = lora.logits(model, tokens)
    assert np.abs(trained - untrained).max() > 1e-3
