"""Model FLOPs of one LoRA training step, as MFU is reported in the field: the FLOPs the model needs, not what
the compiled program does.

Counted per token of the micro-batch, for a LoRA step on a frozen base:
- every weight matrix used as a matmul (the input embedding's lookup is not one; a tied embedding is used once
  more as the logits projection): 2 FLOPs per weight forward, 2 backward for the activations' gradient, none
  for the frozen weight's own gradient;
- the LoRA adapters: 2 forward, 4 backward (activations and the adapters' own gradient);
- attention's two products (q k^T and the weighted sum of values), 2 FLOPs per multiply-add, over the keys
  each query sees: causal rows count half the T x T square (T (T + 1) / 2 pairs), a sliding window at most
  `window` keys per query; backward twice forward.
No recomputation (remat re-runs the forward: that is in XLA's count, the hardware utilisation, not here),
no softmax, norms or elementwise work, and splash's skipped blocks are not charged as a dense mask would be.
"""

from __future__ import annotations

from typing import Any


def attended_keys(seq: int, window: int | None) -> int:
    """Query-key pairs of one causal row of `seq` tokens, within `window` keys back when given."""
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


def matmul_weights(state: Any) -> tuple[int, int]:
    """(base weights used as matmuls, LoRA weights) of a model's abstract or concrete state
    (nnx.to_flat_state pairs)."""
    base = lora_weights = embedding = 0
    tied = True
    for path, v in state:
        names = [str(p) for p in path]
        size = 1
        for d in v.shape:
            size *= int(d)
        if any("_lora_" in n for n in names):
            lora_weights += size
        elif "lm_head" in names:
            tied = False
            base += size
        elif "input_embedding" in names:
            embedding = size
        elif len(v.shape) >= 2:
            base += size
    return base + (embedding if tied else 0), lora_weights


def step_flops(text: Any, model_state: Any, rows: int, seq: int) -> float:
    """Model FLOPs of one micro-batch of `rows` x `seq` tokens (the module docstring) for decoder `text`."""
    base, adapters = matmul_weights(model_state)
    tokens = rows * seq
    dense = tokens * (4 * base + 6 * adapters)
    window = getattr(text, "sliding_window", None)
    attention = 0
    for kind in text.layer_types:
        sliding = kind == "sliding_attention"
        head_dim = text.head_dim if sliding else getattr(text, "global_head_dim", text.head_dim)
        pairs = attended_keys(seq, window if sliding else None)
        attention += text.num_heads * pairs * 4 * head_dim  # q k^T and p v, forward
    return float(dense + 3 * rows * attention)
