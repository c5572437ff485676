"""Gemma 4's attention over packed rows: Tunix's module that also takes segment ids and runs splash
attention (families/attention.py says why). The projection restates Tunix's (q/k/v einsums, norms, RoPE,
value normalisation); if a Tunix release changes its own, the two paths differ and
tests/workloads/train/test_train_loss.py (segment-id path = masked path) fails.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from tunix.models.gemma4 import model as gm

from tpuforge_workloads.families import attention as splash
from tpuforge_workloads.families.activations import shard

# What SegmentAttention reads from Tunix's module besides the einsums (k_einsum or kv_einsum).
_PARTS = (
    "q_einsum",
    "attn_vec_einsum",
    "_query_norm",
    "_key_norm",
    "attn_type",
    "rope_base_frequency",
    "rope_scale_factor",
    "rope_proportion",
)


class SegmentAttention(gm.Attention):  # type: ignore[misc]
    """Tunix's Gemma 4 attention that also takes `Segments` (families/attention.py)."""

    @staticmethod
    def missing_parts(module: Any) -> list[str]:
        """What this class reads from Tunix's module that `module` lacks."""
        missing = [p for p in _PARTS if not hasattr(module, p)]
        if not (hasattr(module, "k_einsum") or hasattr(module, "kv_einsum")):
            missing.append("k_einsum/kv_einsum")
        return missing

    def block(
        self, x: jax.Array, segment_pos: jax.Array, cache: Any, attn_mask: Any, kv_shared_cache: Any = None
    ) -> tuple[Any, jax.Array, tuple[jax.Array, jax.Array]]:
        if not isinstance(attn_mask, splash.Segments):
            return super().block(x, segment_pos, cache, attn_mask, kv_shared_cache=kv_shared_cache)  # type: ignore[no-any-return]
        if cache is not None or kv_shared_cache is not None:
            raise ValueError("segment ids are for training and scoring whole rows; decoding passes a mask")
        cfg = self.config
        rope = functools.partial(
            gm.apply_rope,
            positions=segment_pos,
            base_frequency=self.rope_base_frequency,
            scale_factor=self.rope_scale_factor,
            rope_proportion=self.rope_proportion,
        )
        x = x.astype(cfg.dtype)
        q = rope(self._query_norm(shard(self.q_einsum(x), cfg.shd_config.act_btnh)))
        if hasattr(self, "k_einsum"):  # global layers with keys = values
            k = v = self.k_einsum(x)
        else:
            k, v = self.kv_einsum(x)
        k = shard(k, cfg.shd_config.act_btnh)
        v = shard(v, cfg.shd_config.act_btnh)
        v = v * jax.lax.rsqrt(jnp.mean(jnp.square(v), axis=-1, keepdims=True) + 1e-6)
        k = rope(self._key_norm(k))
        window = cfg.sliding_window_size if self.attn_type == gm.AttentionType.LOCAL_SLIDING else None
        q, k, v = splash.named(q, k, v)
        encoded = splash.name(
            splash.splash_attention(q, k, v, attn_mask.ids, window, tuple(cfg.shd_config.act_btnh)), "encoded"
        )
        out = splash.name(shard(self.attn_vec_einsum(encoded), cfg.shd_config.act_btd), "out")
        return {"v": v, "k": k}, out, (k, v)


def segment_attention() -> tuple[type, type]:
    """(Tunix's attention module, ours) for Gemma 4."""
    return gm.Attention, SegmentAttention
