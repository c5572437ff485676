"""The learning-quality benchmark (benchmarks/learning_quality.py) as a gate: the demo's job, one seed, scored on
held-out paraphrases, must stay within the band recorded in benchmarks/learning_quality.json (its mean and
spread over seeds). A change to a default that shapes learning and costs the score fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_demo_recipe_answers_held_out_paraphrases_within_the_recorded_band(tmp_path: Path) -> None:
    from benchmarks.learning_quality import band, main

    out = tmp_path / "rows.jsonl"
    code = main(["--seeds", "0", "--json", str(out), "--workdir", str(tmp_path / "runs"), "--check"])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    recorded = band("capitals")
    assert code == 0, f"held-out exact match {row['heldOut']} below the band's {recorded['low']}: {row['wrong']}"
    assert row["heldOut"] >= recorded["low"] and row["seen"] >= recorded["seenLow"], row
    assert row["steps"] == 800 and row["loss"] < 0.2
