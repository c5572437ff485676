"""Every splash block layout (families/attention.py: LAYOUTS) computes the same attention, forward and backward,
as the masked reference: on CPU in interpret mode, at 1024 tokens so the wide layouts take 1024-token blocks,
on a packed row (several examples and padding). Their speed is the chip's to say (benchmarks/chip/splash_speed.py)."""

from __future__ import annotations

import pytest
from benchmarks.chip.splash_check import TINY, check

from tpuforge_workloads.families import attention


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TINY))
def test_each_block_layout_matches_the_masked_reference(kind: str) -> None:
    heads, kv, dim, window = TINY[kind]
    for layout in attention.LAYOUTS:
        row = check(kind, heads, kv, dim, window, 1024, packed=True, layout=layout)
        assert row["layout"] == layout
        # bfloat16 inputs against a float32 reference: within bfloat16's rounding of the largest value.
        assert max(row[k] for k in ("forwardRelErr", "dqRelErr", "dkRelErr", "dvRelErr")) < 2e-2, row


def test_the_layouts_block_sizes() -> None:
    uniform = attention.block_sizes(2048, "uniform")
    assert (uniform.block_q, uniform.block_kv_dkv, uniform.block_q_dq, uniform.use_fused_bwd_kernel) == (
        512,
        512,
        512,
        False,
    )
    wide = attention.block_sizes(2048, "wideFused")
    assert (wide.block_q, wide.block_kv, wide.block_kv_compute, wide.block_q_dkv) == (1024, 1024, 512, 1024)
    assert wide.use_fused_bwd_kernel and wide.block_q_dq is None
    assert attention.block_sizes(1536, "wideForward").block_q == 512  # no 1024 block divides 1536
    with (
        pytest.raises(ValueError, match="layout 'nope' unknown; known: uniform, fused"),
        attention.blocks_layout("nope"),
    ):
        pass
