"""Qwen3's (dense) config.json: the decoder's shape and its check against the model catalog.

Qwen3's layout: every layer full attention with q/k RMS norms, no biases, an untied lm_head on the larger
models (tied on the 0.6B to 4B ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads.families.decoder import ModelError

MODEL_TYPES = ("qwen3",)
HF_PREFIX = "model."  # where the decoder's tensors are
_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Qwen3Text:
    """The decoder's shape, as config.json states it (HF names in comments)."""

    num_layers: int  # num_hidden_layers
    embed_dim: int  # hidden_size
    hidden_dim: int  # intermediate_size
    num_heads: int  # num_attention_heads
    head_dim: int
    num_kv_heads: int  # num_key_value_heads
    vocab_size: int
    rope_theta: float
    norm_eps: float  # rms_norm_eps
    tied_embeddings: bool  # tie_word_embeddings
    dtype: str
    multimodal: bool = False
    family: str = "qwen3"

    @property
    def layer_types(self) -> tuple[str, ...]:
        return ("full_attention",) * self.num_layers

    @property
    def hf_prefix(self) -> str:
        return HF_PREFIX

    def head_counts(self) -> dict[str, int]:
        return {"query heads": self.num_heads, "kv heads": self.num_kv_heads}


def parse_config(raw: Mapping[str, Any], where: str = "config.json") -> Qwen3Text:
    if raw.get("model_type") not in MODEL_TYPES:
        raise ModelError(f"{where}: model_type {raw.get('model_type')!r} is not Qwen3")

    def need(key: str) -> Any:
        if raw.get(key) is None:
            raise ModelError(f"{where}: {key} is missing")
        return raw[key]

    unsupported = {
        "use_sliding_window": bool(raw.get("use_sliding_window")),
        "attention_bias": bool(raw.get("attention_bias")),
        "num_experts": bool(raw.get("num_experts")),
    }
    bad = [k for k, on in unsupported.items() if on]
    if bad:
        raise ModelError(f"{where}: {', '.join(bad)} set: the trainer supports the dense Qwen3 layout only")
    rope = raw.get("rope_parameters") or {"rope_type": "default", "rope_theta": raw.get("rope_theta", 1_000_000.0)}
    if rope.get("rope_type", "default") != "default" or raw.get("rope_scaling"):
        raise ModelError(f"{where}: rope_parameters {rope} is not supported (no RoPE scaling)")
    dtype = str(raw.get("dtype") or raw.get("torch_dtype") or "")
    if dtype not in _DTYPES:
        raise ModelError(f"{where}: dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return Qwen3Text(
        num_layers=int(need("num_hidden_layers")),
        embed_dim=int(need("hidden_size")),
        hidden_dim=int(need("intermediate_size")),
        num_heads=int(need("num_attention_heads")),
        head_dim=int(need("head_dim")),
        num_kv_heads=int(need("num_key_value_heads")),
        vocab_size=int(need("vocab_size")),
        rope_theta=float(rope.get("rope_theta", 1_000_000.0)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        dtype=dtype,
    )


def check_against_catalog(text: Qwen3Text, shape: ModelShape, where: str) -> None:
    """The checkpoint must be the model the job names: the catalog drives validation and sizing."""
    pairs = {
        "model_type": (text.family, shape.family),
        "num_hidden_layers": (text.num_layers, shape.num_layers),
        "hidden_size": (text.embed_dim, shape.embed_dim),
        "intermediate_size": (text.hidden_dim, shape.hidden_dim),
        "num_attention_heads": (text.num_heads, shape.num_heads),
        "head_dim": (text.head_dim, shape.head_dim),
        "num_key_value_heads": (text.num_kv_heads, shape.num_kv_heads),
        "vocab_size": (text.vocab_size, shape.vocab_size),
        "tie_word_embeddings": (text.tied_embeddings, shape.tied_embeddings),
    }
    diffs = [f"{k} {got} (catalog: {want})" for k, (got, want) in pairs.items() if got != want]
    if diffs:
        raise ModelError(
            f"{where} does not match catalog model {shape.id!r}: {'; '.join(diffs)}; set model.name to the "
            "model at model.uri"
        )
