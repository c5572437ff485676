"""Gemma 4's Tunix model: its ModelConfig, remat, and the HF -> Tunix key mapping the checkpoint reader
(model/checkpoint_read.py) lays tensors out by.

JAX, Flax and Tunix are imported inside the functions that need them, so that config checks stay fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tpuforge_workloads.families import remat
from tpuforge_workloads.families.decoder import CombinedQkv, ModelError
from tpuforge_workloads.families.gemma4.config import HF_PREFIXES, Gemma4Text

if TYPE_CHECKING:
    from tunix.models.gemma4 import model as gemma4_model


def model_class() -> Any:
    """Tunix's Gemma 4 model class (imported when asked)."""
    from tunix.models.gemma4 import model as gm

    from tpuforge_workloads.families import activations

    activations.install(gm)  # its activations constrained on a TPU mesh, from any host (activations.py)
    return gm.Gemma4


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
            f"(e.g. {odd[:1]}); update families/gemma4/model.py for this google-tunix version"
        )
    return {_BOTH_PREFIXES + pat.removeprefix(_TUNIX_PREFIX): v for pat, v in mapping.items()}


_TMP_QKV = re.compile(r"tmp\.layers\.(\d+)\.attn\.([qkv])$")


def layer_qkv(key: str) -> tuple[int, str] | None:
    """(layer, "q" | "k" | "v") of a tensor the key mapping leaves to combine per layer; None for any other."""
    m = _TMP_QKV.match(key)
    return (int(m.group(1)), m.group(2)) if m else None


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


COMBINED_QKV = CombinedQkv(layer_qkv, keys_are_values, combine_layer_qkv)


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
