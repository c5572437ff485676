"""The output head of a family whose logits the trainer's loss computes itself (model/loss.py: `head_nll`), and
the way the model's call is made to stop at the final hidden states.

Tunix's Gemma 4 ends its call with the logits over the 262,144-token vocabulary, cast to float32 and soft-capped
(tanh(l / 30) x 30). Differentiated by autodiff, that tail keeps float32 copies of the [tokens, vocabulary]
logits for the backward pass and passes over them several times: on a TPU v5e chip, at the 31B's shapes and
2048 tokens, the head with its loss took 88.7 ms against 61.0 ms for its two matrix products alone
(docs/performance.md). `head_nll` computes the same loss with a gradient of its own that keeps only the
bfloat16 logits and each row's log-sum-exp.

`deferred(head)`: within the block, the head's `decode` (the embedding's transpose, tied as in Gemma 4)
returns a one-wide placeholder and keeps the hidden states it was given, so the model's call computes no
logits (the placeholder's soft-cap and cast are a [B, T, 1] array) and the loss takes them from there. A family
without a `Head` (Qwen3) keeps the model's own logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Head:
    module: Any  # the module whose decode(x) turns the final hidden states into logits
    table: jax.Array  # [vocabulary, hidden]: logits = x @ table.T in the model's dtype
    softcap: float | None  # logits -> tanh(logits / softcap) x softcap, in float32
    dtype: Any  # the dtype the product is computed in


def gemma4(model: Any) -> Head:
    """Gemma 4's head: the tied input embedding and the config's final soft-cap."""
    embedder = model.embedder
    return Head(embedder, embedder.input_embedding.get_value(), model.config.final_logit_softcap, model.config.dtype)


@contextlib.contextmanager
def deferred(head: Head) -> Iterator[list[jax.Array]]:
    """Within the block, the model's call stops before its logits: the list yielded gets the final hidden states
    [B, T, hidden] of each call (see the module's docstring)."""
    captured: list[jax.Array] = []

    def keep(x: jax.Array) -> jax.Array:
        captured.append(x)
        return jnp.zeros((*x.shape[:-1], 1), head.dtype)

    # An attribute of the instance, set past nnx's checks (this is not model state), shadows the method.
    object.__setattr__(head.module, "decode", keep)
    try:
        yield captured
    finally:
        object.__delattr__(head.module, "decode")
