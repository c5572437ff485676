"""Qwix's LoRA provider, with a dropout that evaluation can switch off.

Qwix applies LoRA dropout to each adapted op's input whenever its rule's rate is above zero
(`nnx.Dropout(rate, deterministic=False)`): it has no deterministic mode, so an evaluation through the
training model would drop activations too, and its loss would be noisy, differ from one call to the next,
and differ from the evaluation Job's (whose model is built without dropout). The provider reads its rule
while the model is traced; this one hands out each LoRA rule with rate 0 while `without_dropout()` is
active. A function that enters it in its own body (the trainer's evaluation step) therefore compiles
without dropout and draws nothing from the dropout stream, while programs traced elsewhere (the train step)
keep the rate. It is a trace-time switch: calling an already-traced program inside the block changes nothing.

On a quantized base (QLoRA) Qwix holds each targeted weight as a quantized box, and intercepts the calls a
layer makes on its weight (jnp.asarray, promote_dtype, the einsum) to compute with it. Tunix's Gemma 4
einsum layer also casts its weight with jnp.astype, which Qwix does not intercept (the cast fails on the box
from the second forward on): this provider intercepts it too, and casts a quantized weight as Qwix's own
jnp.asarray does (the scale to the compute dtype; the integers stay as they are).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import qwix
from qwix._src.core.qarray import QArray
from qwix._src.providers.ptq import WithAux  # Qwix's box of a quantized weight; not exported

_NO_DROPOUT: contextvars.ContextVar[bool] = contextvars.ContextVar("tpuforge_no_lora_dropout", default=False)


@contextlib.contextmanager
def without_dropout() -> Iterator[None]:
    """Within the block, LoRA models built with `LoraProvider` are traced with dropout off."""
    token = _NO_DROPOUT.set(True)
    try:
        yield
    finally:
        _NO_DROPOUT.reset(token)


class LoraProvider(qwix.LoraProvider):  # type: ignore[misc]
    """qwix.LoraProvider whose LoRA rules have dropout 0 while `without_dropout()` is active."""

    def _get_current_rule_and_op_id(self, op_name: str, **kwargs: Any) -> tuple[Any, Any]:
        rule, op_id = super()._get_current_rule_and_op_id(op_name, **kwargs)
        if _NO_DROPOUT.get() and isinstance(rule, qwix.LoraRule) and rule.dropout > 0:
            rule = dataclasses.replace(rule, dropout=0.0)
        return rule, op_id

    def get_intercept_map(self) -> dict[str, Any]:
        return super().get_intercept_map() | {"jax.numpy.astype": self.astype}  # type: ignore[no-any-return]

    def astype(self, x: Any, dtype: Any, *args: Any, **kwargs: Any) -> Any:
        """jnp.astype, passing a quantized weight to Qwix's own cast of it."""
        if isinstance(x, (WithAux, QArray)):
            return self.asarray(x, dtype=dtype)
        return jnp.astype(x, dtype, *args, **kwargs)
