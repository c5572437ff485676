"""Synthetic inputs for merge tests and benchmarks: HF Gemma 4 checkpoints of any catalog shape and layer
count, written in streamed chunks (a 31B-shaped layer never sits in memory whole), and LoRA checkpoints
in the layout Tunix's PeftTrainer saves (Orbax item `model_params`, leaves
layers/<i>/<attn|mlp>/<module>/<w|kernel>_lora_<a|b>/value), with Qwix's factor shapes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads import storage
from tpuforge_workloads.families.gemma4.config import Gemma4Text
from tpuforge_workloads.families.gemma4.merge import LORA_MODULES as TUNIX_MODULES
from tpuforge_workloads.merge.safetensors_io import (
    FLOAT_DTYPES,
    INDEX_FILE,
    SINGLE_FILE,
    OutTensor,
    encode_header,
    index_json,
    plan_shards,
)
from tpuforge_workloads.model.adapter_checkpoint import PARAMS_ITEM
from tpuforge_workloads.model.lora import LoraManifest, write_manifest
from tpuforge_workloads.storage import staged as staged_write

_ROWS_PER_BLOCK_BYTES = 16 << 20
# Tensors of the multimodal checkpoint outside the text decoder; a vision q_proj checks that only decoder
# weights are matched.
VISION_TENSORS = {
    "model.vision_tower.encoder.layers.0.self_attn.q_proj.weight": (64, 64),
    "model.embed_vision.embedding_projection.weight": (128, 64),
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal" (std 1/sqrt(fan_in)) or "one" (around 1: norms, layer scalars)


def layer_types(num_layers: int, sliding_per_global: int) -> list[str]:
    """The catalog's pattern; the last layer is global, as transformers forces it to be."""
    period = sliding_per_global + 1
    return [
        "full_attention" if (i + 1) % period == 0 or i == num_layers - 1 else "sliding_attention"
        for i in range(num_layers)
    ]


def decoder_tensors(shape: ModelShape, prefix: str) -> list[TensorSpec]:
    d, f = shape.embed_dim, shape.hidden_dim
    specs = [TensorSpec(f"{prefix}embed_tokens.weight", (shape.vocab_size, d), "normal")]
    for i, kind in enumerate(layer_types(shape.num_layers, shape.sliding_per_global)):
        glob = kind == "full_attention"
        h = shape.global_head_dim if glob else shape.head_dim
        kv = shape.num_global_kv_heads if glob else shape.num_kv_heads
        a, m = f"{prefix}layers.{i}.self_attn.", f"{prefix}layers.{i}.mlp."
        specs += [
            TensorSpec(a + "q_proj.weight", (shape.num_heads * h, d), "normal"),
            TensorSpec(a + "k_proj.weight", (kv * h, d), "normal"),
        ]
        if not glob:  # keys = values on global layers
            specs.append(TensorSpec(a + "v_proj.weight", (kv * h, d), "normal"))
        specs += [
            TensorSpec(a + "o_proj.weight", (d, shape.num_heads * h), "normal"),
            TensorSpec(a + "q_norm.weight", (h,), "one"),
            TensorSpec(a + "k_norm.weight", (h,), "one"),
            TensorSpec(m + "gate_proj.weight", (f, d), "normal"),
            TensorSpec(m + "up_proj.weight", (f, d), "normal"),
            TensorSpec(m + "down_proj.weight", (d, f), "normal"),
        ]
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            specs.append(TensorSpec(f"{prefix}layers.{i}.{norm}.weight", (d,), "one"))
        specs.append(TensorSpec(f"{prefix}layers.{i}.layer_scalar", (1,), "one"))
    specs.append(TensorSpec(f"{prefix}norm.weight", (d,), "one"))
    return specs


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """config.json for the shape: Gemma4ForCausalLM, or Gemma4ForConditionalGeneration when multimodal."""
    from tpuforge_workloads.families.gemma4 import tiny as tiny_model

    text = tiny_model.hf_config(shape)
    text["layer_types"] = layer_types(shape.num_layers, shape.sliding_per_global)
    if not shape.multimodal:
        return text
    del text["architectures"]
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": shape.dtype,
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 64},
    }


def _blocks(spec: TensorSpec, dtype: np.dtype, rng: np.random.Generator) -> Iterator[bytes]:
    rows = spec.shape[0]
    cols = math.prod(spec.shape[1:])
    step = max(1, _ROWS_PER_BLOCK_BYTES // max(1, cols * 4))
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if spec.init == "one":
            block = rng.uniform(0.5, 1.5, (n, cols)).astype(np.float32)
        else:
            block = rng.standard_normal((n, cols), dtype=np.float32)
            block *= np.float32(max(cols, 1) ** -0.5)
        yield block.astype(dtype).tobytes()


def write_safetensors(
    uri: str, tensors: list[OutTensor], blocks: Callable[[OutTensor], Iterator[bytes]], shard_bytes: int | None
) -> None:
    """A checkpoint directory: one model.safetensors (shard_bytes None) or shards + index."""
    if shard_bytes is None:
        plans = [(SINGLE_FILE, tensors, encode_header(tensors))]
    else:
        shards = plan_shards(tensors, shard_bytes)
        plans = [(s.name, list(s.tensors), s.header) for s in shards]
        storage.write_bytes(storage.join(uri, INDEX_FILE), index_json(shards))
    for name, group, header in plans:
        path = storage.join(uri, name)
        size = len(header) + sum(t.nbytes for t in group)
        with staged_write.open_staged_write(path, path + ".partial", size) as w:
            w.write(header)
            for t in group:
                for block in blocks(t):
                    w.write(block)
        w.publish()


def write_base(
    uri: str, shape: ModelShape, *, dtype: str = "F32", shard_bytes: int | None = None, seed: int = 0
) -> list[TensorSpec]:
    """A random HF checkpoint of `shape` (its num_layers and multimodal layout) with config and
    tokenizer-side files; returns the tensors written."""
    specs = decoder_tensors(shape, shape.hf_prefix)
    if shape.multimodal:
        specs += [TensorSpec(n, s, "normal") for n, s in VISION_TENSORS.items()]
    by_name = {s.name: s for s in specs}
    rng = np.random.default_rng(seed)
    np_dtype = FLOAT_DTYPES[dtype]
    tensors = [OutTensor(s.name, dtype, s.shape) for s in specs]
    write_safetensors(uri, tensors, lambda t: _blocks(by_name[t.name], np_dtype, rng), shard_bytes)
    api_dtype = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    config = hf_config(dataclasses.replace(shape, dtype=api_dtype))  # type: ignore[arg-type]
    storage.write_text(storage.join(uri, "config.json"), json.dumps(config, indent=2))
    storage.write_text(storage.join(uri, "generation_config.json"), json.dumps({"bos_token_id": 2}))
    storage.write_text(storage.join(uri, "tokenizer_config.json"), json.dumps({"model_max_length": 4096}))
    return specs


def lora_shapes(text: Gemma4Text, layer: int, module: str, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Qwix's (A, B) shapes for one Tunix Gemma 4 module (einsum 'BTD,NDH' -> A 'Dr', B 'rNH', and so on)."""
    glob = text.layer_types[layer] == "full_attention"
    h = text.global_head_dim if glob else text.head_dim
    k = text.num_global_kv_heads if glob else text.num_kv_heads
    d, f, n = text.embed_dim, text.hidden_dim, text.num_heads
    return {
        "q_einsum": ((d, rank), (rank, n, h)),
        "kv_einsum": ((d, rank), (rank, 2, k, h)),
        "k_einsum": ((d, rank), (rank, k, h)),
        "attn_vec_einsum": ((n, h, rank), (rank, d)),
        "gate_proj": ((d, rank), (rank, f)),
        "up_proj": ((d, rank), (rank, f)),
        "down_proj": ((f, rank), (rank, d)),
    }[module]


def lora_modules(text: Gemma4Text, layer: int, targets: Collection[str]) -> list[str]:
    """The Tunix modules of a layer that get adapters: k_einsum replaces kv_einsum on keys = values layers."""
    keq = text.k_eq_v and text.layer_types[layer] == "full_attention"
    present = set(TUNIX_MODULES) - ({"kv_einsum"} if keq else {"k_einsum"})
    return [m for m in TUNIX_MODULES if m in targets and m in present]


def lora_tree(
    text: Gemma4Text,
    rank: int,
    targets: Collection[str],
    *,
    seed: int = 0,
    skip: Collection[tuple[int, str]] = (),
    b_scale: float = 0.05,
) -> dict[str, Any]:
    """LoRA parameters as PeftTrainer saves them. B is random too (Qwix starts it at zero), so that every
    delta is visible."""
    rng = np.random.default_rng(seed)
    layers: dict[str, Any] = {}
    for i in range(text.num_layers):
        for module in lora_modules(text, i, targets):
            if (i, module) in skip:
                continue
            a_shape, b_shape = lora_shapes(text, i, module, rank)
            fan_in = math.prod(a_shape[:-1])
            block = "attn" if TUNIX_MODULES[module][0] == "self_attn" else "mlp"
            param = "w" if module.endswith("einsum") else "kernel"
            layers.setdefault(str(i), {}).setdefault(block, {})[module] = {
                f"{param}_lora_a": {"value": (rng.standard_normal(a_shape) * fan_in**-0.5).astype(np.float32)},
                f"{param}_lora_b": {"value": (rng.standard_normal(b_shape) * b_scale).astype(np.float32)},
            }
    return {"layers": layers}


def write_lora_checkpoint(uri: str, tree: dict[str, Any], step: int = 10, manifest: LoraManifest | None = None) -> None:
    """Save `tree` as step `step` of an Orbax CheckpointManager directory, as PeftTrainer does, with the
    trainer's adapter manifest beside it when given."""
    import orbax.checkpoint as ocp

    if manifest is not None:
        write_manifest(uri, manifest)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    manager = ocp.CheckpointManager(uri, item_names=(PARAMS_ITEM,), options=options)
    try:
        manager.save(step, args=ocp.args.Composite(**{PARAMS_ITEM: ocp.args.PyTreeSave(tree)}), force=True)
        manager.wait_until_finished()
    finally:
        manager.close()
