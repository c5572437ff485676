"""Qwen3 through the model-family seam, on qwen3-tiny (Qwen3ForCausalLM's layout at a tiny size): the
catalog learns its shape from config.json, the loader puts it into Tunix's Qwen3 with the logits transformers
computes, LoRA training lowers the loss, and its chat template renders thinking as Qwen3's does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tpuforge.api import LoraSpec
from tpuforge.api.catalog import MODELS, QWEN3_LORA_TARGETS, shape_from_config
from tpuforge_workloads import families
from tpuforge_workloads.families.attention import dense_mask as attention_mask
from tpuforge_workloads.families.decoder import ModelError, mesh_errors, read_config
from tpuforge_workloads.families.qwen3 import attention as qwen3_attention
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.loss import nll_sum_and_count
from tpuforge_workloads.model.mesh import MESH_AXES

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_the_catalog_entry_is_what_its_config_json_gives(tiny_qwen3_model_dir: Path) -> None:
    raw = read_config(str(tiny_qwen3_model_dir))
    entry = MODELS["qwen3-tiny"]
    derived = shape_from_config(raw)
    assert {k: getattr(entry, k) for k in derived} == derived
    text = families.parse_config(raw)
    assert text.family == "qwen3" and families.of(text).name == "qwen3"
    families.check_against_catalog(text, entry, "config.json")
    with pytest.raises(ModelError, match="is a qwen3 model but catalog model 'gemma4-tiny' is gemma4"):
        families.check_against_catalog(text, MODELS["gemma4-tiny"], "config.json")
    assert mesh_errors(text, 1, 4) == ["mesh.tp=4 does not divide the model's 2 kv heads; use tp in [1, 2]"]
    with pytest.raises(ModelError, match="model_type 'llama' is not a supported family"):
        families.parse_config({**raw, "model_type": "llama"})


def _load(model_dir: Path) -> tuple[Any, Any]:
    text = families.read_decoder(str(model_dir))
    mesh = _mesh()
    with jax.set_mesh(mesh):
        model = checkpoint_read.load_model(model_dir, text, families.of(text).tunix_config(text), mesh)
    return text, model


def test_the_loaded_model_computes_transformers_logits(tiny_qwen3_model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import Qwen3ForCausalLM

    _, model = _load(tiny_qwen3_model_dir)
    tokens = np.random.default_rng(0).integers(5, 512, (2, 24))
    got = lora.logits(model, tokens)
    hf = Qwen3ForCausalLM.from_pretrained(str(tiny_qwen3_model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(tokens)).logits.numpy()
    assert np.max(np.abs(got - want)) < 1e-4 * max(1.0, float(np.max(np.abs(want))))


def test_lora_training_lowers_the_loss(tiny_qwen3_model_dir: Path) -> None:
    import optax

    _, base = _load(tiny_qwen3_model_dir)
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=list(QWEN3_LORA_TARGETS))
    model = lora.apply_lora(base, spec, _mesh(), seed=0)
    adapted = {str(path[-2]) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
    assert adapted >= set(QWEN3_LORA_TARGETS)
    # Two packed examples per row: the dense mask keeps them apart, as the trainer's batches do.
    tokens = jnp.asarray(np.tile(np.arange(5, 37), (2, 1)), jnp.int32)
    segments = jnp.asarray(np.repeat([[1, 2]], 16, axis=1).repeat(2, axis=0), jnp.int32)
    positions = jnp.asarray(np.tile(np.r_[np.arange(16), np.arange(16)], (2, 1)), jnp.int32)
    inputs = {"input_tokens": tokens, "input_mask": jnp.ones_like(tokens, bool), "positions": positions}
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.LoRAParam)

    @nnx.jit
    def step(model: Any, optimizer: Any) -> Any:
        def loss(m: Any) -> Any:
            total, count = nll_sum_and_count(m, attention_mask=attention_mask(segments), **inputs)
            return total / count

        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
        optimizer.update(model, grads)
        return value

    losses = [float(step(model, optimizer)) for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_splash_attention_with_segment_ids_gives_the_masked_path_s_loss(tiny_qwen3_model_dir: Path) -> None:
    """On TPU the trainer hands Qwen3 the segment ids and it runs splash attention (attention.py), not the dense
    T x T product; here the same kernel runs in Pallas interpret mode against the masked path, on packed and
    padded rows, with LoRA on (B randomised, so the adapters count)."""
    from tpuforge_workloads.families import attention

    _, base = _load(tiny_qwen3_model_dir)
    assert any(isinstance(m, qwen3_attention.Qwen3SegmentAttention) for _, m in base.iter_modules())
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=list(QWEN3_LORA_TARGETS))
    model = lora.apply_lora(base, spec, _mesh(), seed=0)
    rng = np.random.default_rng(0)
    nnx.update(
        model,
        jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), nnx.state(model, nnx.LoRAParam)),
    )
    t = 128
    segments = np.zeros((2, t), np.int32)
    segments[0, :50], segments[0, 50:120] = 1, 2  # two examples, then padding
    segments[1, :] = 1
    positions = np.zeros((2, t), np.int32)
    for row in range(2):
        for seg in (1, 2):
            at = segments[row] == seg
            positions[row, at] = np.arange(at.sum())
    tokens = jnp.asarray(rng.integers(5, 512, (2, t)), jnp.int32)
    inputs = {"input_tokens": tokens, "input_mask": jnp.asarray(segments > 0), "positions": jnp.asarray(positions)}
    ids = jnp.asarray(segments)

    @nnx.jit
    def nll(model: Any, mask: Any) -> Any:
        total, count = nll_sum_and_count(model, attention_mask=mask, **inputs)
        return total / count

    with jax.set_mesh(_mesh()):
        masked = float(nll(model, attention_mask(ids)))
        splash = float(nll(model, attention.Segments(ids)))
    np.testing.assert_allclose(splash, masked, rtol=1e-5)


def test_the_chat_template_renders_thinking_as_qwen3s(tiny_qwen3_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_model_dir))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    # Thinking of turns before the last user message is dropped; the final answer keeps its own.
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nagain\n</think>\n\n6<|im_end|>\n"
    )
    prompt = tok.apply_chat_template(messages[:4], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert json.loads((tiny_qwen3_model_dir / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


@pytest.mark.slow
def test_the_preflight_compiles_a_qwen3_8b_layer_for_its_slice() -> None:
    """The preflight's path for Qwen3: one Qwen3-8B layer, LoRA on Qwen3's targets, compiled for its slice's (v5e 2x2)
    topology (libtpu, no TPU) with its weights sharded over the chips, on splash attention with segment ids."""
    from tpuforge.api import CheckpointSpec, MeshSpec, TrainConfig, TrainingSpec
    from tpuforge.api.catalog import HF_CONFIGS, TPU_SLICES
    from tpuforge_workloads.model.mesh import make_mesh
    from tpuforge_workloads.preflight.step import GIB, compile_train_step, with_layers
    from tpuforge_workloads.preflight.topology import slice_devices

    entry = MODELS["qwen3-8b"]
    slc = TPU_SLICES[entry.train_slice]
    text = families.parse_config(HF_CONFIGS["qwen3-8b"])
    with pytest.raises(ValueError, match="full_attention"):
        with_layers(text, ("sliding_attention",))
    one = with_layers(text, ("full_attention",))
    config = TrainConfig(
        model_name="qwen3-8b",
        model_uri="gs://models/qwen3-8b",
        dataset_uri="gs://data/train.jsonl",
        lora=LoraSpec(rank=64, alpha=64, target_modules=list(QWEN3_LORA_TARGETS)),
        training=TrainingSpec(max_seq_len=256, warmup_steps=1),
        mesh=MeshSpec(fsdp=slc.default_fsdp, tp=slc.default_tp),
        checkpoint=CheckpointSpec(uri="gs://runs/checkpoints"),
    )
    step = compile_train_step(one, config, make_mesh(slc.default_fsdp, slc.default_tp, slice_devices(slc)), 10)
    assert step.platform == "tpu" and step.layers == 1 and step.attention == "splash"
    # The bfloat16 base: embedding and untied lm_head, one layer's attention and MLP, spread over the chips.
    d, f, v = text.embed_dim, text.hidden_dim, text.vocab_size
    attn = 2 * d * text.num_heads * text.head_dim + 2 * d * text.num_kv_heads * text.head_dim
    share = 2 * (2 * v * d + attn + 3 * d * f) / slc.chips
    assert share <= step.argument_bytes <= 2 * share, (step.argument_bytes / GIB, share / GIB)
    assert step.hbm_bytes < slc.hbm_gib_per_chip * GIB
