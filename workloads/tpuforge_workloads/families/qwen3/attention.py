"""Qwen3's attention over packed rows: Tunix's module that also takes segment ids and runs splash attention
(families/attention.py says why it is not Tunix's own splash path).
"""

from __future__ import annotations

from typing import Any

import jax
from tunix.models.qwen3 import model as qm

from tpuforge_workloads.families import attention as splash
from tpuforge_workloads.families.activations import shard

# What Qwen3SegmentAttention reads from Tunix's module.
_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "scale", "head_dim", "shd_config")


class Qwen3SegmentAttention(qm.Attention):  # type: ignore[misc]
    """Tunix's Qwen3 attention that also takes `Segments` (families/attention.py): its projections,
    q/k norms and RoPE as Tunix computes them, then splash attention, causal within each example."""

    @staticmethod
    def missing_parts(module: Any) -> list[str]:
        """What this class reads from Tunix's module that `module` lacks."""
        return [p for p in _PARTS if not hasattr(module, p)]

    def block(
        self, x: jax.Array, segment_pos: jax.Array, cache: Any, attn_mask: Any, segment_ids: Any = None
    ) -> tuple[Any, jax.Array]:
        if not isinstance(attn_mask, splash.Segments):
            return super().block(x, segment_pos, cache, attn_mask, segment_ids=segment_ids)  # type: ignore[no-any-return]
        if cache is not None:
            raise ValueError("segment ids are for training and scoring whole rows; decoding passes a mask")
        btnh = self.shd_config.act_btnh
        q = shard(self.q_norm(self.q_proj(x)), btnh)
        k = shard(self.k_norm(self.k_proj(x)), btnh)
        v = shard(self.v_proj(x), btnh)
        q = qm.apply_rope(q, segment_pos, head_dim=self.head_dim)
        k = qm.apply_rope(k, segment_pos, head_dim=self.head_dim)
        q, k, v = splash.named(q * self.scale, k, v)
        encoded = splash.name(splash.splash_attention(q, k, v, attn_mask.ids, None, tuple(btnh)), "encoded")
        return None, splash.name(shard(self.o_proj(encoded), self.shd_config.act_btd), "out")


def segment_attention() -> tuple[type, type]:
    """(Tunix's attention module, ours) for Qwen3."""
    return qm.Attention, Qwen3SegmentAttention
