"""The loss training minimises and both evaluations report: the mean negative log-likelihood over the loss
targets (assistant tokens), weighted by token, on float32 logits. It lives in model/, beside the model it scores:
the trainer, the evaluation Job and GRPO each import it, and the evaluation imports nothing of training.

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

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tpuforge_workloads import families
from tpuforge_workloads.families import attention
from tpuforge_workloads.families import head as heads
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


def _capped(logits: jax.Array, softcap: float | None) -> jax.Array:
    z = logits.astype(jnp.float32)
    return z if softcap is None else jnp.tanh(z / softcap) * softcap


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def head_nll(
    x: jax.Array, table: jax.Array, targets: jax.Array, weight: jax.Array, softcap: float | None, dtype: Any
) -> jax.Array:
    """sum over positions of -log p(target) x weight, the logits x @ table.T computed in `dtype` and soft-capped
    in float32 (families/head.py): `token_nll` of the model's own logits, with a gradient that keeps only the
    logits in `dtype` and each position's log-sum-exp. The table is frozen (Gemma 4's tied embedding is not a
    LoRA target): its gradient is zero."""
    return _head_nll_forward(x, table, targets, weight, softcap, dtype)[0]


def _logits(x: jax.Array, table: jax.Array, dtype: Any) -> jax.Array:
    return jnp.einsum("btd,vd->btv", x.astype(dtype), table.astype(dtype))


def _head_nll_forward(
    x: jax.Array, table: jax.Array, targets: jax.Array, weight: jax.Array, softcap: float | None, dtype: Any
) -> tuple[jax.Array, tuple[Any, ...]]:
    logits = _logits(x, table, dtype)
    z = _capped(logits, softcap)
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    logp = picked - lse
    return -jnp.sum(logp * weight), (x, table, targets, weight, logits, lse, logp)


def _head_nll_backward(softcap: float | None, dtype: Any, res: tuple[Any, ...], ct: jax.Array) -> tuple[Any, ...]:
    x, table, targets, weight, logits, lse, logp = res
    z = _capped(logits, softcap)
    vocab = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
    onehot = (vocab == targets[..., None].astype(jnp.int32)).astype(jnp.float32)
    dz = (jnp.exp(z - lse[..., None]) - onehot) * (ct * weight)[..., None]
    if softcap is not None:  # d(c tanh(l / c)) / dl = 1 - tanh(l / c)^2 = 1 - (z / c)^2
        dz = dz * (1.0 - jnp.square(z / softcap))
    dx = jnp.einsum("btv,vd->btd", dz.astype(dtype), table.astype(dtype)).astype(x.dtype)
    no_targets = np.zeros(targets.shape, dtype=jax.dtypes.float0)
    return dx, jnp.zeros_like(table), no_targets, (-logp * ct).astype(weight.dtype)


head_nll.defvjp(_head_nll_forward, _head_nll_backward)


def nll_sum_and_count(
    model: Any, input_tokens: jax.Array, input_mask: jax.Array, positions: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The batch's summed NLL and loss-target count: position t predicts token t+1 where input_mask[t+1]. A
    family with an output head of its own (families/head.py) computes the loss from the final hidden states
    (`head_nll`); any other from the model's logits."""
    head = families.of_model(model).output_head(model)
    mask = attention.for_model(model, attention_mask)
    with lora.adapters_in_compute_dtype(model):
        if head is None:
            logits, _ = model(input_tokens, positions, None, mask)
            return token_nll(logits[:, :-1], input_tokens[:, 1:], input_mask[:, 1:])
        with heads.deferred(head) as hidden:
            model(input_tokens, positions, None, mask)
    weight = input_mask[:, 1:].astype(jnp.float32)
    total = head_nll(hidden[0][:, :-1], head.table, input_tokens[:, 1:], weight, head.softcap, head.dtype)
    return total, jnp.sum(weight)


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


def answer_logps(
    model: Any, input_tokens: jax.Array, input_mask: jax.Array, positions: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(summed log-probability of each row's masked targets [B], their count [B]), in float32."""
    with lora.adapters_in_compute_dtype(model):
        logits, _ = model(input_tokens, positions, None, attention.for_model(model, attention_mask))
    mask = input_mask[:, 1:].astype(jnp.float32)
    return jnp.sum(token_logps(logits[:, :-1], input_tokens[:, 1:]) * mask, axis=-1), jnp.sum(mask, axis=-1)
