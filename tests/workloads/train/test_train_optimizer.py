"""The trainer's optimizer (train/trainer.py `optimizer`): the gradient AdamW sees is clipped to
`training.maxGradNorm`, and, with gradient accumulation (Tunix's optax.MultiSteps around it), the clip applies
to the step's averaged gradient, not to each micro-batch's. What AdamW saw is read back from its first moment:
after one step from zero, mu = (1 - b1) x the gradient it was given."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tpuforge.api import TrainingSpec
from tpuforge_workloads.train.trainer import optimizer, step_grad_norm

B1 = 0.9  # optax.adamw's default


def _spec(**kw: float) -> TrainingSpec:
    return TrainingSpec(max_seq_len=8, warmup_steps=2, **kw)


def _params() -> dict[str, jnp.ndarray]:
    return {"a": jnp.zeros((3, 4)), "b": jnp.zeros((5,))}


def _grads(scale: float) -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(0)
    g = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(5,))}
    norm = float(optax.global_norm(g))
    return {k: jnp.asarray(v * scale / norm, jnp.float32) for k, v in g.items()}


def _scaled(tree: dict[str, jnp.ndarray], s: float) -> dict[str, jnp.ndarray]:
    return {k: v * s for k, v in tree.items()}


def _seen_by_adamw(state: optax.OptState) -> dict[str, jnp.ndarray]:
    mu = optax.tree_utils.tree_get(state, "mu")
    return {k: v / (1 - B1) for k, v in mu.items()}


@pytest.mark.parametrize("norm", [1e4, 3.0])
def test_a_large_gradient_reaches_adamw_scaled_down_to_max_grad_norm(norm: float) -> None:
    spec = _spec(max_grad_norm=2.0)
    opt = optimizer(spec, total_steps=10)
    params = _params()
    grads = _grads(norm)
    _, state = opt.update(grads, opt.init(params), params)
    seen = _seen_by_adamw(state)
    assert float(optax.global_norm(seen)) == pytest.approx(2.0, rel=1e-5)
    for k in grads:  # the direction is kept
        np.testing.assert_allclose(seen[k], grads[k] * (2.0 / norm), rtol=1e-5, atol=1e-7)


def test_a_gradient_within_the_norm_is_left_as_it_is() -> None:
    opt = optimizer(_spec(), total_steps=10)  # default maxGradNorm 1.0
    params = _params()
    grads = _grads(0.5)
    _, state = opt.update(grads, opt.init(params), params)
    seen = _seen_by_adamw(state)
    for k in grads:
        np.testing.assert_allclose(seen[k], grads[k], rtol=1e-6)


def test_with_accumulation_the_clip_applies_to_the_averaged_gradient() -> None:
    """Two micro-batch gradients of norm 3 and 1.5, opposed: each alone is over the norm of 1, their mean
    (norm 0.75) is not, so AdamW gets the mean unchanged."""
    opt = optax.MultiSteps(optimizer(_spec(max_grad_norm=1.0), total_steps=10), 2)
    params = _params()
    g = _grads(3.0)
    state = opt.init(params)
    _, state = opt.update(g, state, params)
    _, state = opt.update(_scaled(g, -0.5), state, params)
    seen = _seen_by_adamw(state.inner_opt_state)
    for k in g:
        np.testing.assert_allclose(seen[k], g[k] * 0.25, rtol=1e-5, atol=1e-7)


def test_the_reported_gradient_norm_is_the_clipped_gradient_s_the_step_s_average() -> None:
    """The norm logged per step is the norm of what the clip sees: the average of the step's micro-batch
    gradients (0.75 for the two opposed gradients above), reported as Tunix averages its reports over the
    step's micro-batches (0 on the first, 2 x 0.75 on the last), not their own norms' mean (2.25)."""
    opt = optax.MultiSteps(optimizer(_spec(max_grad_norm=1.0), total_steps=10), 2)
    params = _params()
    g = _grads(3.0)
    state = opt.init(params)
    first = step_grad_norm(state, g, 2)
    _, state = opt.update(g, state, params)
    last = step_grad_norm(state, _scaled(g, -0.5), 2)
    assert float(first) == 0.0
    assert np.mean([float(first), float(last)]) == pytest.approx(0.75, rel=1e-5)
    # Without accumulation it is the gradient's own norm.
    plain = optimizer(_spec(), total_steps=10)
    assert float(step_grad_norm(plain.init(params), g)) == pytest.approx(3.0, rel=1e-5)


def test_the_optimizer_state_is_adamw_s_alone_so_older_checkpoints_resume() -> None:
    """The clip keeps no state: the state tree is the one checkpoints held before clipping was added."""
    spec = _spec()
    schedule = optax.warmup_cosine_decay_schedule(0.0, spec.learning_rate, spec.warmup_steps, 10, 0.0)
    adamw = optax.inject_hyperparams(optax.adamw)(learning_rate=schedule, weight_decay=spec.weight_decay)
    params = _params()
    assert jax.tree.structure(optimizer(spec, 10).init(params)) == jax.tree.structure(adamw.init(params))


def test_max_grad_norm_must_be_positive() -> None:
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"max_grad_norm|maxGradNorm"):
            TrainingSpec(max_seq_len=8, max_grad_norm=bad)
    assert TrainingSpec(max_seq_len=8).max_grad_norm == 1.0
    assert TrainingSpec.model_validate({"maxSeqLen": 8, "maxGradNorm": 0.5}).max_grad_norm == 0.5
