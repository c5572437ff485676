"""The preference losses (spec.method dpo and orpo), as the trainer's loss function: the same train step,
optimizer, checkpoints and evaluation as SFT, with rows that come in pairs (data/preference.py: row 2i is the
chosen answer to a prompt, row 2i+1 the rejected one, each masked to its answer).

- DPO (Rafailov et al. 2023), with conservative label smoothing (cDPO): with h = beta x ((log pi(c) - log
  ref(c)) - (log pi(r) - log ref(r))), the loss is -(1 - eps) log sigmoid(h) - eps log sigmoid(-h), the
  log-probabilities summed over each answer's tokens. The reference is the same model with its LoRA adapters
  zeroed (`adapters_off`): the base, or the quantized base a QLoRA run trains on; no second copy of the
  weights. A pair's rewards are beta x (log pi - log ref) of each answer.
- ORPO (Hong et al. 2024): the chosen answer's NLL (per token) - lambda x log sigmoid(log odds(c) - log
  odds(r)), odds(y) = p / (1 - p) with p the answer's per-token mean probability; no reference. Its rewards
  are the answers' mean per-token log-probabilities.

Both: the margin is the chosen reward minus the rejected one, and a pair is ranked right when it is positive.
The batch loss is the mean over its pairs (every training micro-batch holds the same number of pairs; pairs
of empty rows, which fill an evaluation's last batch, count for nothing). The aux holds sums over the batch's
pairs, so an evaluation's figures are means over all its pairs (`summary`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tpuforge.api import PreferenceSpec
from tpuforge_workloads.model.loss import answer_logps

SUMS = ("loss_sum", "pairs", "correct", "margin_sum", "chosen_sum", "rejected_sum")


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """Within the block every LoRA weight of `model` is zero, so it computes what its base does (Qwix adds
    x @ A @ B x scale); the weights are put back on exit. Works under jit and grad: what is computed inside
    depends on no trained weight. (nnx.state's variables are the model's own: the copy keeps the values.)"""
    stored = nnx.clone(nnx.state(model, nnx.LoRAParam))
    nnx.update(model, jax.tree.map(jnp.zeros_like, stored))
    try:
        yield
    finally:
        nnx.update(model, stored)


def pairs_of(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rows [2P] -> (chosen [P], rejected [P])."""
    both = x.reshape(-1, 2)
    return both[:, 0], both[:, 1]


def dpo_terms(
    logp: jax.Array, ref_logp: jax.Array, beta: float, label_smoothing: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(loss, chosen reward, rejected reward) per pair, from each row's answer log-probability under the
    model and the reference."""
    chosen, rejected = pairs_of(beta * (logp - ref_logp))
    h = chosen - rejected
    loss = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(h) - label_smoothing * jax.nn.log_sigmoid(-h)
    return loss, chosen, rejected


def orpo_terms(logp: jax.Array, count: jax.Array, orpo_lambda: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(loss, chosen reward, rejected reward) per pair: the rewards are the mean per-token log-probabilities."""
    mean = logp / jnp.maximum(count, 1.0)
    chosen, rejected = pairs_of(mean)

    def log_odds(lp: jax.Array) -> jax.Array:
        """log(p / (1 - p)) = log p - log(1 - exp(log p)); log p < 0 for any answer with a token."""
        return lp - jnp.log1p(-jnp.exp(jnp.minimum(lp, -1e-6)))

    ratio = log_odds(chosen) - log_odds(rejected)
    return -chosen - orpo_lambda * jax.nn.log_sigmoid(ratio), chosen, rejected


def make_loss_fn(method: str, preference: PreferenceSpec) -> Any:
    """The trainer's loss (PeftTrainer.with_loss_fn(..., has_aux=True)) for `method` dpo or orpo; it takes
    the batch as SFT's loss does (`loss_denominator` is unused: micro-batches hold equally many pairs)."""

    def loss_fn(
        model: Any,
        input_tokens: jax.Array,
        input_mask: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        loss_denominator: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        inputs = (input_tokens, input_mask, positions, attention_mask)
        logp, count = answer_logps(model, *inputs)
        if method == "dpo":
            with adapters_off(model):
                ref_logp = jax.lax.stop_gradient(answer_logps(model, *inputs)[0])
            loss, chosen, rejected = dpo_terms(logp, ref_logp, preference.beta, preference.label_smoothing)
        else:
            loss, chosen, rejected = orpo_terms(logp, count, preference.orpo_lambda)
        real = (pairs_of(count)[0] > 0).astype(jnp.float32)
        pairs = jnp.sum(real)
        margin = (chosen - rejected) * real
        aux = {
            "loss_sum": jnp.sum(loss * real),
            "pairs": pairs,
            "correct": jnp.sum((margin > 0).astype(jnp.float32) * real),
            "margin_sum": jnp.sum(margin),
            "chosen_sum": jnp.sum(chosen * real),
            "rejected_sum": jnp.sum(rejected * real),
        }
        return aux["loss_sum"] / jnp.maximum(pairs, 1.0), aux

    return loss_fn


def summary(sums: dict[str, float]) -> dict[str, float]:
    """Means over the pairs of summed aux values (one batch's or an evaluation's): the preference loss, the
    accuracy (pairs ranked right), the reward margin and the chosen and rejected rewards."""
    n = max(sums["pairs"], 1.0)
    return {
        "loss": sums["loss_sum"] / n,
        "accuracy": sums["correct"] / n,
        "margin": sums["margin_sum"] / n,
        "chosen_reward": sums["chosen_sum"] / n,
        "rejected_reward": sums["rejected_sum"] / n,
    }
