"""Gemma 4 for the trainer: HF config.json -> Tunix ModelConfig, checks against the model catalog, the device
mesh, and the HF -> Tunix key mapping the checkpoint reader (checkpoint_read.py) lays tensors out by.

The checkpoint's config.json is the authority for the model's shape; the catalog entry named by the job must
agree with it (a wrong `model.name` or `model.uri` is caught here, before any weight is read).

JAX, Flax and Tunix are imported inside the functions that need them, so that config checks stay fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads.model import remat
from tpuforge_workloads.model.decoder import ModelError, check_sharding, mesh_errors, read_config

__all__ = ["ModelError", "check_sharding", "mesh_errors", "read_config"]  # shared by every family (decoder.py)

if TYPE_CHECKING:
    from tunix.models.gemma4 import model as gemma4_model

GEMMA4_MODEL_TYPES = ("gemma4", "gemma4_text")
# Where the text decoder's tensors are: the multimodal checkpoints (and Tunix's loader) use the first,
# text-only Gemma4ForCausalLM checkpoints the second.
HF_PREFIXES = ("model.language_model.", "model.")
_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Gemma4Text:
    """The text decoder's shape, as config.json states it (HF names in comments)."""

    num_layers: int  # num_hidden_layers
    embed_dim: int  # hidden_size
    hidden_dim: int  # intermediate_size
    num_heads: int  # num_attention_heads
    head_dim: int  # head_dim (sliding layers)
    num_kv_heads: int  # num_key_value_heads (sliding layers)
    global_head_dim: int  # global_head_dim
    num_global_kv_heads: int  # num_global_key_value_heads
    k_eq_v: bool  # attention_k_eq_v (global layers have keys = values)
    sliding_window: int
    layer_types: tuple[str, ...]  # "sliding_attention" | "full_attention" per layer
    vocab_size: int
    final_logit_softcap: float | None
    local_rope_theta: float
    global_rope_theta: float
    global_rope_proportion: float
    dtype: str
    multimodal: bool  # config.json nests the decoder under text_config
    family: str = "gemma4"

    @property
    def hf_prefix(self) -> str:
        return HF_PREFIXES[0] if self.multimodal else HF_PREFIXES[1]

    def head_counts(self) -> dict[str, int]:
        return {
            "query heads": self.num_heads,
            "kv heads": self.num_kv_heads,
            "global kv heads": self.num_global_kv_heads,
        }


def parse_config(raw: Mapping[str, Any], where: str = "config.json") -> Gemma4Text:
    """The text decoder's shape from a Gemma 4 config.json (multimodal or text-only)."""
    model_type = raw.get("model_type")
    if model_type not in GEMMA4_MODEL_TYPES:
        raise ModelError(f"{where}: model_type {model_type!r} is not Gemma 4 ({' or '.join(GEMMA4_MODEL_TYPES)})")
    multimodal = isinstance(raw.get("text_config"), Mapping)
    text: Mapping[str, Any] = raw["text_config"] if multimodal else raw

    def need(key: str) -> Any:
        if text.get(key) is None:
            raise ModelError(f"{where}: {'text_config.' if multimodal else ''}{key} is missing")
        return text[key]

    unsupported = {
        "enable_moe_block": bool(text.get("enable_moe_block")),
        "hidden_size_per_layer_input": bool(text.get("hidden_size_per_layer_input")),
        "num_kv_shared_layers": bool(text.get("num_kv_shared_layers")),
        "use_bidirectional_attention": bool(text.get("use_bidirectional_attention")),
    }
    bad = [k for k, on in unsupported.items() if on]
    if bad:
        raise ModelError(
            f"{where}: {', '.join(bad)} set: the trainer supports the dense Gemma 4 decoder (31B layout) only"
        )
    num_layers = int(need("num_hidden_layers"))
    layer_types = tuple(need("layer_types"))
    if len(layer_types) != num_layers or not set(layer_types) <= {"sliding_attention", "full_attention"}:
        raise ModelError(
            f"{where}: layer_types must list sliding_attention/full_attention for each of {num_layers} layers"
        )
    rope = text.get("rope_parameters") or {}
    sliding_rope = rope.get("sliding_attention", {"rope_type": "default", "rope_theta": 10_000.0})
    full_rope = rope.get(
        "full_attention", {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    )
    for name, params in (("sliding_attention", sliding_rope), ("full_attention", full_rope)):
        if params.get("rope_type", "default") not in ("default", "proportional") or params.get("factor", 1.0) != 1.0:
            raise ModelError(f"{where}: rope_parameters.{name} {params} is not supported (no RoPE scaling)")
    dtype = str(text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype") or "")
    if dtype not in _DTYPES:
        raise ModelError(f"{where}: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    num_kv_heads = int(need("num_key_value_heads"))
    return Gemma4Text(
        num_layers=num_layers,
        embed_dim=int(need("hidden_size")),
        hidden_dim=int(need("intermediate_size")),
        num_heads=int(need("num_attention_heads")),
        head_dim=int(need("head_dim")),
        num_kv_heads=num_kv_heads,
        global_head_dim=int(text.get("global_head_dim") or need("head_dim")),
        num_global_kv_heads=int(text.get("num_global_key_value_heads") or num_kv_heads),
        k_eq_v=bool(text.get("attention_k_eq_v", False)),
        sliding_window=int(need("sliding_window")),
        layer_types=layer_types,
        vocab_size=int(need("vocab_size")),
        final_logit_softcap=text.get("final_logit_softcapping"),
        local_rope_theta=float(sliding_rope.get("rope_theta", 10_000.0)),
        global_rope_theta=float(full_rope.get("rope_theta", 1_000_000.0)),
        global_rope_proportion=float(full_rope.get("partial_rotary_factor", 1.0)),
        dtype=dtype,
        multimodal=multimodal,
    )


def check_against_catalog(text: Gemma4Text, shape: ModelShape, where: str) -> None:
    """The checkpoint must be the model the job names: the catalog drives validation and sizing."""
    pattern = tuple(
        "full_attention" if (i + 1) % (shape.sliding_per_global + 1) == 0 else "sliding_attention"
        for i in range(shape.num_layers)
    )
    pairs = {
        "num_hidden_layers": (text.num_layers, shape.num_layers),
        "hidden_size": (text.embed_dim, shape.embed_dim),
        "intermediate_size": (text.hidden_dim, shape.hidden_dim),
        "num_attention_heads": (text.num_heads, shape.num_heads),
        "head_dim": (text.head_dim, shape.head_dim),
        "num_key_value_heads": (text.num_kv_heads, shape.num_kv_heads),
        "global_head_dim": (text.global_head_dim, shape.global_head_dim),
        "num_global_key_value_heads": (text.num_global_kv_heads, shape.num_global_kv_heads),
        "sliding_window": (text.sliding_window, shape.sliding_window),
        "vocab_size": (text.vocab_size, shape.vocab_size),
        "layer_types": (text.layer_types, pattern),
        "multimodal layout": (text.multimodal, shape.multimodal),
    }
    diffs = [f"{k} {got} (catalog: {want})" for k, (got, want) in pairs.items() if got != want]
    if diffs:
        raise ModelError(
            f"{where} does not match catalog model {shape.id!r}: {'; '.join(diffs)}; set model.name to the "
            "model at model.uri"
        )


def tunix_config(text: Gemma4Text) -> gemma4_model.ModelConfig:
    """Tunix's ModelConfig for this decoder. Tunix's flash attention stays off: its TPU kernel builds its
    own causal/local masks and ignores the attention mask the trainer passes, which packing relies on; on
    TPU the trainer runs splash attention with segment ids instead (attention.py)."""
    import jax.numpy as jnp
    from tunix.models.gemma4 import model as gm

    pattern = tuple(
        gm.AttentionType.GLOBAL if t == "full_attention" else gm.AttentionType.LOCAL_SLIDING for t in text.layer_types
    )
    dtype = getattr(jnp, text.dtype)
    return gm.ModelConfig(
        num_layers=text.num_layers,
        num_embed=text.vocab_size,
        embed_dim=text.embed_dim,
        hidden_dim=text.hidden_dim,
        num_heads=text.num_heads,
        head_dim=text.head_dim,
        num_kv_heads=text.num_kv_heads,
        num_global_kv_heads=text.num_global_kv_heads,
        global_key_size=text.global_head_dim,
        k_eq_v_global=text.k_eq_v,
        sliding_window_size=text.sliding_window,
        # A pattern as long as the model: Tunix cycles it, so every layer gets exactly its own type.
        attention_pattern=pattern,
        final_logit_softcap=text.final_logit_softcap,
        local_base_frequency=int(text.local_rope_theta),
        global_base_frequency=int(text.global_rope_theta),
        global_rope_proportion=text.global_rope_proportion,
        local_rope_proportion=1.0,
        param_dtype=dtype,
        dtype=dtype,
        use_flash_attention=False,
    )


def set_remat(model: Any, on: bool, policy: str = "full") -> None:
    """Rematerialisation of the decoder layers on or off, keeping what `policy` names (remat.set_remat)."""
    from tunix.models.gemma4 import model as gm

    remat.set_remat(model, on, policy, gm.ModelConfig, gm.RematConfig, gm.DecoderLayer)


# Tunix LoRA module -> (HF block, HF projections) it stands for (merge/mapping.py). kv_einsum's B stacks keys
# then values on its axis 1; k_einsum is a global layer's one projection when keys = values.
LORA_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "q_einsum": ("self_attn", ("q_proj",)),
    "kv_einsum": ("self_attn", ("k_proj", "v_proj")),
    "k_einsum": ("self_attn", ("k_proj",)),
    "attn_vec_einsum": ("self_attn", ("o_proj",)),
    "gate_proj": ("mlp", ("gate_proj",)),
    "up_proj": ("mlp", ("up_proj",)),
    "down_proj": ("mlp", ("down_proj",)),
}


# ---- loading -------------------------------------------------------------------------------------------


# Tunix's Gemma 4 key mapping (a private function of the pinned google-tunix: no public API takes a key
# mapping for Gemma 4 with our own preprocessing) starts every pattern with this optional group. It is widened
# to accept text-only checkpoints (`model.`) too; if a Tunix release changes the patterns, loading stops here
# with a message instead of silently skipping every tensor (test_train_model pins both layouts).
_TUNIX_PREFIX = r"(?:model\.language_model\.)?"
_BOTH_PREFIXES = r"(?:model\.(?:language_model\.)?)?"


def key_mapping(cfg: gemma4_model.ModelConfig) -> dict[str, Any]:
    """Tunix's HF->Tunix key mapping, widened to accept text-only checkpoints (`model.` prefix) as well as
    the multimodal layout (`model.language_model.`) it was written for; Tunix matches keys from the start."""
    from tunix.models.gemma4 import params_safetensors

    mapping = params_safetensors._get_key_and_transform_mapping(cfg)
    odd = [pat for pat in mapping if not pat.startswith(_TUNIX_PREFIX)]
    if not mapping or odd:
        raise ModelError(
            f"tunix.models.gemma4.params_safetensors changed: key patterns no longer start with {_TUNIX_PREFIX!r} "
            f"(e.g. {odd[:1]}); update gemma4.key_mapping for this google-tunix version"
        )
    return {_BOTH_PREFIXES + pat.removeprefix(_TUNIX_PREFIX): v for pat, v in mapping.items()}


_TMP_QKV = re.compile(r"tmp\.layers\.(\d+)\.attn\.([qkv])$")


def combine_layer_qkv(qkv: Mapping[str, Any], keys_are_values: bool, xp: Any) -> dict[str, Any]:
    """One layer's attention tensors as Tunix's einsum weights. The key mapping has already laid each out
    as (D, heads, head_dim); q -> q_einsum (N, D, h), k and v -> kv_einsum (2, K, D, h), or k alone ->
    k_einsum on global layers where keys = values. Tunix's own preprocessing guesses axes by size, which
    fails when the hidden size equals a head dim (the tiny model); the layout is known, so nothing is
    guessed here. `xp` is numpy or jax.numpy."""
    out = {"q_einsum.w": xp.transpose(qkv["q"], (1, 0, 2))}
    k = xp.transpose(qkv["k"], (1, 0, 2))
    if keys_are_values:
        out["k_einsum.w"] = k
    else:
        out["kv_einsum.w"] = xp.stack([k, xp.transpose(qkv["v"], (1, 0, 2))])
    return out


def keys_are_values(text: Gemma4Text, layer: int) -> bool:
    return text.layer_types[layer] == "full_attention" and text.k_eq_v


def expected_hf_tensors(text: Gemma4Text) -> list[str]:
    """The HF tensors the text decoder is made of (lm_head is tied to the embedding and absent)."""
    p = text.hf_prefix
    names = [f"{p}embed_tokens.weight", f"{p}norm.weight"]
    for i, kind in enumerate(text.layer_types):
        base = f"{p}layers.{i}."
        projs = ["q_proj", "k_proj", "o_proj"]
        if not (kind == "full_attention" and text.k_eq_v):
            projs.append("v_proj")
        names += [f"{base}self_attn.{x}.weight" for x in projs]
        names += [f"{base}self_attn.{x}.weight" for x in ("q_norm", "k_norm")]
        names += [f"{base}mlp.{x}.weight" for x in ("gate_proj", "up_proj", "down_proj")]
        names += [
            f"{base}{x}.weight"
            for x in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
        ]
        names.append(f"{base}layer_scalar")
    return names


def check_tensors(names: Iterable[str], text: Gemma4Text, where: str) -> None:
    """Every decoder tensor must be present under the layout's prefix: the loader would otherwise leave
    parameters uninitialised instead of failing."""
    have = set(names)
    missing = [n for n in expected_hf_tensors(text) if n not in have]
    if missing:
        other = HF_PREFIXES[1] if text.hf_prefix == HF_PREFIXES[0] else HF_PREFIXES[0]
        hint = ""
        if any(n.startswith(other + "layers.") for n in have):
            hint = f" (the tensors are under {other!r}: config.json and the weights disagree on the layout)"
        raise ModelError(f"{where}: {len(missing)} decoder tensors missing, e.g. {', '.join(missing[:3])}{hint}")
