"""Qwen3 (dense) for the trainer: HF config.json -> Tunix's qwen3 ModelConfig, checks against the model catalog,
and Tunix's HF -> Tunix key mapping, which the checkpoint reader (checkpoint_read.py) lays tensors out by.

Qwen3's layout: every layer full attention with q/k RMS norms, no biases, an untied lm_head on the larger
models (tied on the 0.6B to 4B ones). Tunix's attention modules are named as HF's (q_proj ... o_proj), so the
LoRA targets are HF's names too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads.model import remat
from tpuforge_workloads.model.decoder import ModelError

if TYPE_CHECKING:
    from tunix.models.qwen3 import model as qwen3_model

MODEL_TYPES = ("qwen3",)
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
        return "model."

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


def tunix_config(text: Qwen3Text) -> qwen3_model.ModelConfig:
    """Tunix's ModelConfig for this decoder; its flash attention stays off (the trainer's mask carries the
    packing, see family.py)."""
    import jax.numpy as jnp
    from tunix.models.qwen3 import model as qm

    dtype = getattr(jnp, text.dtype)
    return qm.ModelConfig(
        num_layers=text.num_layers,
        vocab_size=text.vocab_size,
        embed_dim=text.embed_dim,
        hidden_dim=text.hidden_dim,
        num_heads=text.num_heads,
        head_dim=text.head_dim,
        num_kv_heads=text.num_kv_heads,
        rope_theta=int(text.rope_theta),
        norm_eps=text.norm_eps,
        use_tied_embedding=text.tied_embeddings,
        param_dtype=dtype,
        dtype=dtype,
        use_flash_attention=False,
    )


# Tunix LoRA module -> (HF block, HF projections): Tunix's Qwen3 names its modules as HF does.
LORA_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{p: ("self_attn", (p,)) for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{p: ("mlp", (p,)) for p in ("gate_proj", "up_proj", "down_proj")},
}


def set_remat(model: Any, on: bool, policy: str = "full") -> None:
    """Rematerialisation of the decoder layers on or off, keeping what `policy` names (remat.set_remat)."""
    from tunix.models.qwen3 import model as qm

    remat.set_remat(model, on, policy, qm.ModelConfig, qm.RematConfig, qm.DecoderLayer)


def key_mapping(cfg: qwen3_model.ModelConfig) -> dict[str, Any]:
    """Tunix's own HF -> Tunix key mapping for Qwen3 (a private function of the pinned google-tunix)."""
    from tunix.models.qwen3 import params

    mapping: dict[str, Any] = params._get_key_and_transform_mapping(cfg)
    if r"model\.embed_tokens\.weight" not in mapping:
        raise ModelError(
            "tunix.models.qwen3.params changed: no model.embed_tokens pattern; update qwen3.key_mapping for this "
            "google-tunix version"
        )
    return mapping


def expected_hf_tensors(text: Qwen3Text) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not text.tied_embeddings:
        names.append("lm_head.weight")
    for i in range(text.num_layers):
        base = f"model.layers.{i}."
        names += [f"{base}self_attn.{x}.weight" for x in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
        names += [f"{base}mlp.{x}.weight" for x in ("gate_proj", "up_proj", "down_proj")]
        names += [f"{base}{x}.weight" for x in ("input_layernorm", "post_attention_layernorm")]
    return names


def check_tensors(names: Iterable[str], text: Qwen3Text, where: str) -> None:
    have = set(names)
    missing = [n for n in expected_hf_tensors(text) if n not in have]
    if missing:
        raise ModelError(f"{where}: {len(missing)} decoder tensors missing, e.g. {', '.join(missing[:3])}")
