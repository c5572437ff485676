"""evaluate/preference.py's ranking: preference accuracy and mean margin of pairs, per token and summed."""

from __future__ import annotations

import pytest

from tpuforge_workloads.evaluate.preference import ranking


def test_per_token_and_summed_rankings_differ_when_answers_differ_in_length() -> None:
    # Pair 1: chosen 2 tokens at -1 each (-2), rejected 8 tokens at -0.5 each (-4): summed prefers chosen,
    # per token prefers rejected (-1 < -0.5). Pair 2: chosen -0.2/token over 2, rejected -1/token over 2.
    got = ranking([-2.0, -0.4], [2, 2], [-4.0, -2.0], [8, 2])
    assert got == {
        "pairs": 2,
        "accuracy": 0.5,
        "margin": round(((-1.0 + 0.5) + (-0.2 + 1.0)) / 2, 4),
        "summedAccuracy": 1.0,
        "summedMargin": round((2.0 + 1.6) / 2, 4),
    }


def test_a_tie_is_not_a_preference() -> None:
    assert ranking([-1.0], [1], [-1.0], [1])["accuracy"] == 0.0


def test_mismatched_or_empty_answers_are_refused() -> None:
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        ranking([-1.0, -2.0], [1, 1], [-1.0], [1])
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        ranking([], [], [], [])
    with pytest.raises(ValueError, match="at least one token"):
        ranking([-1.0], [0], [-1.0], [1])
