"""The last step of merging a bfloat16 weight, in one pass: weight = bfloat16(delta + float32(weight)).

numpy has no bfloat16 of its own: ml_dtypes converts element by element, and a merged block went through two
such conversions (bf16 -> float32 for the add, float32 -> bf16 for the output) that cost more CPU than the
LoRA product itself. Here both conversions are bit operations, fused with the add in one loop that LLVM
vectorises (numba, compiled on first use, with the GIL released): 30-34 ms -> 5.5-6 ms per 32 MiB chunk.

Rounding is to nearest, ties to even, as ml_dtypes and torch round; a NaN becomes the canonical quiet NaN of its
sign (0x7FC0 or 0xFFC0), as ml_dtypes makes it (tests/workloads/merge/test_merge_bf16.py checks the bits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_EXPONENT = np.uint32(0x7F800000)
_MAGNITUDE = np.uint32(0x7FFFFFFF)


def _bitcast(to: Any, result: Any, arg: Any) -> Any:
    """A numba intrinsic that reinterprets the bits of a 32-bit scalar as another 32-bit type (no conversion)."""

    def typer(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], to)

        return result(arg), codegen

    return intrinsic(typer)


_float_bits: Any = _bitcast(ir.IntType(32), types.uint32, types.float32)
_bits_float: Any = _bitcast(ir.FloatType(), types.float32, types.uint32)


@njit(nogil=True, boundscheck=False, error_model="numpy")
def _add_round(delta: np.ndarray, weight: np.ndarray) -> None:
    # One array read and written: two arrays that may overlap would make LLVM check for overlap at run time
    # and, when they do (a merge in place), fall back to a scalar loop ten times slower.
    for i in range(delta.size):
        bits = _float_bits(delta[i] + _bits_float(np.uint32(weight[i]) << np.uint32(16)))
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        quiet_nan = ((bits >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
        weight[i] = np.uint16(quiet_nan if (bits & _MAGNITUDE) > _EXPONENT else rounded)


def add_round(delta: np.ndarray, weight: np.ndarray) -> None:
    """weight = bfloat16(delta + float32(weight)), in place, for a float32 `delta` and a bfloat16 `weight` of
    one shape, both C-contiguous."""
    if not (delta.flags.c_contiguous and weight.flags.c_contiguous):
        raise ValueError("add_round needs C-contiguous arrays")
    if delta.shape != weight.shape:
        raise ValueError(f"add_round: shapes differ: {delta.shape}, {weight.shape}")
    _add_round(delta.reshape(-1), weight.reshape(-1).view(np.uint16))
