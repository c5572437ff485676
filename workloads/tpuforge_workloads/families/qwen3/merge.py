"""Which HuggingFace tensors each of Qwen3's Tunix LoRA modules stands for (merge/mapping.py). Tunix's
attention modules are named as HF's (q_proj ... o_proj), so the LoRA targets are HF's names too, with the
same factor layouts as Gemma 4's q_einsum, attn_vec_einsum and MLP projections.
"""

from __future__ import annotations

# Tunix LoRA module -> (HF block, HF projections): Tunix's Qwen3 names its modules as HF does.
LORA_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{p: ("self_attn", (p,)) for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    **{p: ("mlp", (p,)) for p in ("gate_proj", "up_proj", "down_proj")},
}
