"""The adapters compute in the model's dtype and stay float32 (model/lora.py): after the cast block, and after
a gradient step through it, on a bfloat16 model."""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
from flax import nnx

from tpuforge_workloads.model.lora import adapters_in_compute_dtype


class Adapted(nnx.Module):
    """One float32 adapter on a model that computes in bfloat16."""

    def __init__(self) -> None:
        self.a = nnx.LoRAParam(jnp.full(3, 1.0 + 2.0**-12, jnp.float32))  # not a bfloat16 value
        self.config = SimpleNamespace(dtype=jnp.bfloat16)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return jnp.sum(self.a[...] * x)


def test_the_adapters_are_cast_inside_the_block_and_float32_after_it() -> None:
    model = Adapted()
    with adapters_in_compute_dtype(model):
        assert model.a[...].dtype == jnp.bfloat16
    assert model.a[...].dtype == jnp.float32 and float(model.a[...][0]) == 1.0 + 2.0**-12


def test_a_gradient_through_the_cast_leaves_the_adapters_float32() -> None:
    def loss(m: Adapted, x: jnp.ndarray) -> jnp.ndarray:
        with adapters_in_compute_dtype(m):
            return m(x).astype(jnp.float32)

    model = Adapted()
    step = nnx.jit(lambda m, x: nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(m, x))
    _, grads = step(model, jnp.ones(3, jnp.bfloat16))
    assert model.a[...].dtype == jnp.float32 and float(model.a[...][0]) == 1.0 + 2.0**-12
    assert grads.a[...].dtype == jnp.float32
