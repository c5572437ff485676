"""Gemma 4's config.json: the text decoder's shape (multimodal or text-only layout) and its check against the
model catalog.

The checkpoint's config.json is the authority for the model's shape; the catalog entry named by the job must
agree with it (a wrong `model.name` or `model.uri` is caught here, before any weight is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads.families.decoder import ModelError

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
