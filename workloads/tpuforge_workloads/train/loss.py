"""The loss training minimises and both evaluations report: the mean negative log-likelihood over the loss
targets (assistant tokens), weighted by token, on float32 logits.

Logits are cast to float32 before the log-softmax: over Gemma 4's 262k vocabulary a bfloat16 log-sum-exp
keeps ~3 significant digits of a value near 12. The cast fuses into the reduction (no float32 [B, T, V] copy
is kept for the backward pass beyond what XLA chooses to rematerialise).

`nll_sum_and_count` returns the sum and the count, so any grouping of batches can be weighted by tokens.
Gradient accumulation (optax.MultiSteps inside Tunix's PeftTrainer) averages the micro-batches' gradients,
and Tunix averages their losses; `loss_fn` therefore divides each micro-batch's sum by the *mean* loss-target
count of the micro-batches it is averaged with (`loss_denominator`, the same in every row of the batch, put
there by the data feed). The average over the group is then sum / count over the whole group: the gradient
of g micro-batches of r rows equals that of one batch of g x r rows. The evaluation during training adds up
the sums and counts it returns (aux), as the evaluation Job does, so both report the same token-weighted mean.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tpuforge_workloads.families import attention
from tpuforge_workloads.model import lora


def token_logps(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(target) at each position, in float32."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p(target), number of targets) over the positions where `mask` is set, in float32."""
    weight = mask.astype(jnp.float32)
    return -jnp.sum(token_logps(logits, targets) * weight), jnp.sum(weight)


def nll_sum_and_count(
    model: Any, input_tokens: jax.Array, input_mask: jax.Array, positions: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The batch's summed NLL and loss-target count: position t predicts token t+1 where input_mask[t+1]."""
    with lora.adapters_in_compute_dtype(model):
        logits, _ = model(input_tokens, positions, None, attention.for_model(model, attention_mask))
    return token_nll(logits[:, :-1], input_tokens[:, 1:], input_mask[:, 1:])


def loss_fn(
    model: Any,
    input_tokens: jax.Array,
    input_mask: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    loss_denominator: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The trainer's loss (PeftTrainer.with_loss_fn(loss_fn, has_aux=True)): the batch's NLL sum over the
    group's mean loss-target count, and {"nll_sum", "tokens"} as aux."""
    total, count = nll_sum_and_count(model, input_tokens, input_mask, positions, attention_mask)
    return total / jnp.maximum(jnp.mean(loss_denominator), 1.0), {"nll_sum": total, "tokens": count}
