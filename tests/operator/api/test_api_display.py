"""The texts `kubectl get` shows: one formatter per number, used by the trainer and the operator alike."""

from __future__ import annotations

import pytest

from tpuforge import api
from tpuforge.api import display


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.2, "1s"),
        (45, "45s"),
        (60, "1m"),
        (101, "1m41s"),
        (3600, "1h"),
        (11_525, "3h12m"),
        (3 * 86400 + 5 * 3600 + 59, "3d5h"),
        (-5, "0s"),
    ],
)
def test_durations_read_like_kubectl_ages(seconds: float, text: str) -> None:
    assert display.duration(seconds) == text


@pytest.mark.parametrize(
    ("loss", "text"),
    [(2.5, "2.500"), (2.345678, "2.346"), (0.012344, "0.01234"), (1234.4, "1234"), (0.0, "0"), (11.0, "11.00")],
)
def test_loss_has_four_significant_digits(loss: float, text: str) -> None:
    assert display.significant(loss) == text


def test_percent_never_reads_done_before_it_is() -> None:
    assert [display.percent(p) for p in (0, 0.4, 11.0, 45.67, 99.95, 100)] == [
        "0%",
        "0.4%",
        "11%",
        "45%",
        "99.9%",
        "100%",
    ]


def test_progress_and_cost_carry_their_display_strings() -> None:
    p = api.Progress(step=50, total_steps=200, percent=25.0, loss=1.23456, eta_seconds=6061).displayed()
    assert p.to_wire() == {
        "step": 50,
        "totalSteps": 200,
        "percent": 25.0,
        "percentDisplay": "25%",
        "loss": 1.23456,
        "lossDisplay": "1.235",
        "etaSeconds": 6061,
        "etaDisplay": "1h41m",
    }
    assert api.Progress(step=1).displayed().to_wire() == {"step": 1}
    cost = api.Cost.estimate(2.0, 16.8)
    assert cost.to_wire() == {"tpuHours": 2.0, "estimatedUSD": 33.6, "estimatedUSDDisplay": "$33.60"}


def test_the_eval_column_holds_the_verdict_and_pass_at_the_smallest_k() -> None:
    assert display.verdict(True, {"exactMatch": 0.9, "loss": 0.5}) == "Passed"
    assert display.verdict(False, {"pass@5": 0.5, "pass@1": 0.166, "loss": 0.5}) == "Failed (pass@1 0.17)"
    assert display.verdict(True, {"pass@10": 1.0, "pass@2": 0.833}) == "Passed (pass@2 0.83)"
