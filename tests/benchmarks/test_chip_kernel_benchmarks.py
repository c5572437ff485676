"""The chip session's kernel benchmarks run small on CPU (their figures are the chip's to give): every splash
block layout timed (benchmarks/chip/splash_speed.py) and the output head's three cases
(benchmarks/chip/head_speed.py), each a row with its time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.chip import head_speed, splash_speed

from tpuforge_workloads.families import attention


@pytest.mark.slow
def test_the_kernel_benchmarks_give_a_row_per_case(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    assert splash_speed.main(["--tiny", "--cases", "global", "--json", str(out)]) == 0
    assert head_speed.main(["--tiny", "--seq", "64", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    splash, head = rows[: len(attention.LAYOUTS)], rows[len(attention.LAYOUTS) :]
    assert [r["layout"] for r in splash] == list(attention.LAYOUTS)
    assert all(r["forwardBackwardMs"] > 0 for r in splash), splash
    assert [r["case"] for r in head] == ["products", "autodiff", "headNll"]
    assert all(r["ms"] > 0 for r in head), head
