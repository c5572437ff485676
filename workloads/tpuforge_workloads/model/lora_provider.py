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

On a mesh with fsdp > 1 each device holds a slice of a quantized weight, and the matmul needs it whole along
the fsdp axis. Left to itself, XLA dequantizes each slice and gathers the bfloat16 result: twice the bytes of
the integers over the interconnect, and on the 31B (fsdp 2 x tp 4, remat on) 0.23-0.28 GiB more temporaries
per layer, every layer's gathered weights held to the backward pass (docs/performance.md). So the provider
constrains the integers and their scale to be gathered over fsdp first (their sharding is the full-precision
weight's, which the model's parameters name: `partitions`), and the dequantization follows the gather: the
temporaries stay flat in the layers, as with a bf16 base.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import qwix
from qwix._src.core.qarray import QArray
from qwix._src.providers.ptq import WithAux  # Qwix's box of a quantized weight; not exported
from qwix._src.utils import flax_util

# The mesh axis a quantized weight is gathered over before it is dequantized (mesh.MESH_AXES' data axis).
GATHERED_AXIS = "fsdp"
# A module's path as Qwix keeps it (`qwix_path`), each part a string.
ModulePath = tuple[str, ...]
# Per targeted module: the shape and partition (mesh axis names per dimension) of each of its weights.
Partitions = Mapping[ModulePath, list[tuple[tuple[int, ...], tuple[str | None, ...]]]]

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
    """qwix.LoraProvider whose LoRA rules have dropout 0 while `without_dropout()` is active, and whose
    quantized weights are gathered over fsdp before they are dequantized (`partitions`: the targeted
    weights' partitions, `weight_partitions`; empty: left to XLA)."""

    def __init__(self, *args: Any, partitions: Partitions | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._partitions = dict(partitions or {})

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

    # The three ways a layer hands Qwix its quantized weight: each gets it gathered first.
    def asarray(self, a: Any, *args: Any, **kwargs: Any) -> Any:
        return super().asarray(self.gathered(a), *args, **kwargs)

    def einsum(self, einsum_str: str, *operands: Any, **kwargs: Any) -> Any:
        return super().einsum(einsum_str, *(self.gathered(x) for x in operands), **kwargs)

    def dot_general(self, lhs: Any, rhs: Any, *args: Any, **kwargs: Any) -> Any:
        return super().dot_general(lhs, self.gathered(rhs), *args, **kwargs)

    def gathered(self, x: Any) -> Any:
        """A quantized weight of the module being traced with its integers and scale constrained to be whole
        along fsdp (and sharded as before along the other axes); anything else as it is."""
        if not isinstance(x, WithAux) or not isinstance(x.array, QArray) or not self._partitions:
            return x
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty or mesh.shape.get(GATHERED_AXIS, 1) == 1:
            return x
        q = x.array
        path = tuple(str(p) for p in getattr(flax_util.get_current_module(), "qwix_path", ()))
        names = next((n for shape, n in self._partitions.get(path, ()) if shape == tuple(q.qvalue.shape)), None)
        if names is None:
            return x
        qvalue = _constrained(q.qvalue, gathered_partition(names, q.qvalue.shape, q.qvalue.shape))
        scale = _constrained(q.scale, gathered_partition(names, q.qvalue.shape, q.scale.shape))
        return x.replace(array=dataclasses.replace(q, qvalue=qvalue, scale=scale))


def gathered_partition(
    names: tuple[str | None, ...], weight_shape: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[str | None, ...]:
    """The partition of a quantized weight's part of `shape` (its integers, or its scale, whose tiled axes are
    shorter) once gathered over fsdp: the weight's own names, with fsdp dropped and an axis the part does
    not share whole with the weight left unsharded."""
    return tuple(
        None if n == GATHERED_AXIS or size != whole else n
        for n, size, whole in zip(names, shape, weight_shape, strict=True)
    )


def _constrained(x: Any, partition: tuple[str | None, ...]) -> Any:
    spec = jax.sharding.PartitionSpec(*partition)  # type: ignore[no-untyped-call]
    return jax.lax.with_sharding_constraint(x, spec)  # type: ignore[no-untyped-call]
