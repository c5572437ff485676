"""merge/bf16.add_round against ml_dtypes, bit for bit, on the values where rounding is easy to get wrong."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tpuforge_workloads.merge import bf16

BF16 = np.dtype(ml_dtypes.bfloat16)


def _reference(delta: np.ndarray, base: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # a signalling NaN in the input
        return (delta + base.astype(np.float32)).astype(BF16)


def test_random_blocks_equal_ml_dtypes() -> None:
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((37, 257), dtype=np.float32) * 3).astype(BF16)
    delta = rng.standard_normal((37, 257), dtype=np.float32) * np.float32(0.01)
    want = _reference(delta, base)
    bf16.add_round(delta, base)
    assert base.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()


def test_ties_overflow_subnormals_infinities_and_nans() -> None:
    f32 = np.float32
    bits = np.array(
        [
            0x3F808000,  # a tie between two bf16 values, even below: rounds down
            0x3F818000,  # a tie, odd below: rounds up
            0x3F808001,  # just above a tie: up
            0x3F807FFF,  # just below a tie: down
            0x7F7FFFFF,  # the largest float32: rounds up to infinity
            0x00000001,  # the smallest subnormal
            0x807FFFFF,  # the largest negative subnormal
            0x7F800000,  # +inf
            0xFF800000,  # -inf
            0x7FC00000,  # a quiet NaN
            0xFF800001,  # a negative signalling NaN with a payload only in the low half
            0x7FFFFFFF,  # the NaN whose rounding would carry into the sign
            0x80000000,  # -0
        ],
        dtype=np.uint32,
    )
    delta = bits.view(f32).reshape(1, -1)
    base = np.zeros_like(delta, dtype=BF16)
    want = [hex(x) for x in _reference(delta, base).view(np.uint16)[0]]
    bf16.add_round(delta, base)
    got = [hex(x) for x in base.view(np.uint16)[0]]
    assert got == want
    assert got[9:12] == ["0x7fc0", "0xffc0", "0x7fc0"]  # NaNs: the canonical quiet NaN of their sign


def test_refuses_strided_or_mismatched_arrays() -> None:
    base = np.zeros((4, 8), BF16)
    with pytest.raises(ValueError, match="C-contiguous"):
        bf16.add_round(np.zeros((4, 4), np.float32), base[:, ::2])
    with pytest.raises(ValueError, match="shapes differ"):
        bf16.add_round(np.zeros((4, 4), np.float32), base)
