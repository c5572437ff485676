"""families/attention.py's dense packing mask, the path every platform can take (the splash path against it is
checked per family: tests/workloads/train/test_train_loss.py, tests/workloads/families/qwen3/test_model.py)."""

from __future__ import annotations

import numpy as np

from tpuforge_workloads.families.attention import dense_mask


def test_the_attention_mask_is_block_diagonal_and_causal() -> None:
    segment_ids = np.array([[1, 1, 1, 2, 2, 0]])
    got = np.asarray(dense_mask(segment_ids))[0]
    want = np.zeros((6, 6), bool)
    want[np.tril_indices(3)] = True
    want[3, 3] = want[4, 3] = want[4, 4] = True
    assert np.array_equal(got, want)
