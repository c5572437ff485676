"""Qwen3's Tunix model: its ModelConfig, remat, and Tunix's HF -> Tunix key mapping, which the checkpoint
reader (model/checkpoint_read.py) lays tensors out by.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tpuforge_workloads.families import remat
from tpuforge_workloads.families.decoder import ModelError
from tpuforge_workloads.families.qwen3.config import Qwen3Text

if TYPE_CHECKING:
    from tunix.models.qwen3 import model as qwen3_model


def model_class() -> Any:
    """Tunix's Qwen3 model class (imported when asked)."""
    from tunix.models.qwen3 import model as qm

    from tpuforge_workloads.families import activations

    activations.install(qm)  # its activations constrained on a TPU mesh, from any host (activations.py)
    return qm.Qwen3


def tunix_config(text: Qwen3Text) -> qwen3_model.ModelConfig:
    """Tunix's ModelConfig for this decoder; its flash attention stays off (the trainer's mask carries the
    packing, see families/attention.py)."""
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
            "tunix.models.qwen3.params changed: no model.embed_tokens pattern; update families/qwen3/model.py for this "
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
