"""The serving benchmark's arithmetic: one load's results to a point, and the adapter-vs-merged ratios."""

from __future__ import annotations

import pytest
from benchmarks.serving.adapter_vs_merged import agreement, ratios
from benchmarks.serving.load import Point, Result, summarize


def test_a_point_counts_failures_apart_and_times_tokens_after_the_first() -> None:
    ok = [Result(True, ttft=0.1 * (i + 1), latency=0.1 * (i + 1) + 0.9, output_tokens=10) for i in range(99)]
    p = summarize(512, 4.0, [*ok, Result(False, error="HTTP 500")], duration=10.0)
    assert (p.requests, p.failed) == (100, 1)
    assert p.ttft_ms_median == pytest.approx(5000.0)
    assert p.ttft_ms_p99 == pytest.approx(9900.0)  # the slowest of 99: nearest rank
    assert p.tpot_ms_mean == pytest.approx(100.0)  # 0.9 s over the 9 tokens after the first
    assert p.output_tok_s == pytest.approx(99.0) and p.request_s == pytest.approx(9.9)


def test_a_load_where_everything_failed_is_an_error_not_a_point() -> None:
    with pytest.raises(RuntimeError, match="every request failed at input 512, QPS 4: HTTP 503"):
        summarize(512, 4.0, [Result(False, error="HTTP 503")], duration=1.0)


def _point(request_s: float, tok_s: float, p50: float, p99: float) -> Point:
    return Point(512, float("inf"), 32, 0, 1.0, p50, p50, p99, 1.0, tok_s, request_s)


def test_ratios_are_adapter_over_merged() -> None:
    r = ratios(adapter=_point(2.0, 64.0, 500.0, 2000.0), merged=_point(4.0, 128.0, 200.0, 1000.0))
    assert r == {"request_s": 0.5, "output_tok_s": 0.5, "ttft_ms_p50": 2.5, "ttft_ms_p99": 2.0}


def test_agreement_is_the_share_of_identical_outputs() -> None:
    assert agreement([(1, 2), (3, 4), "a", "b"], [(1, 2), (3, 5), "a", "c"]) == 0.5
    with pytest.raises(ValueError, match="cannot compare 1 outputs with 2"):
        agreement([(1,)], [(1,), (2,)])
