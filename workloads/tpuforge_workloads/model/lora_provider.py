"""Qwix's LoRA provider, with a dropout that evaluation can switch off.

Qwix applies LoRA dropout to each adapted op's input whenever its rule's rate is above zero
(`nnx.Dropout(rate, deterministic=False)`): it has no deterministic mode, so an evaluation through the
training model would drop activations too, and its loss would be noisy, differ from one call to the next,
and differ from the evaluation Job's (whose model is built without dropout). The provider reads its rule
while the model is traced; this one hands out each LoRA rule with rate 0 while `without_dropout()` is
active. A function that enters it in its own body (the trainer's evaluation step) therefore compiles
without dropout and draws nothing from the dropout stream, while programs traced elsewhere (the train step)
keep the rate. It is a trace-time switch: calling an already-traced program inside the block changes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import qwix

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
