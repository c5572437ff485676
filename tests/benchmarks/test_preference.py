"""The preference benchmark (benchmarks/preference.py) run small: the base's, the SFT start's and one method's rows,
with the held-out figures the docs quote (docs/performance.md has the full runs'). One run, through the SFT start:
it takes every path of the default run (the base scored, a method trained and scored) and the start's besides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_a_short_dpo_run_after_sft_reports_the_base_the_sft_model_and_the_tuned_model(tmp_path: Path) -> None:
    from benchmarks.preference import main

    out = tmp_path / "rows.jsonl"
    argv = ["--start", "sft", "--sft-steps", "8", "--methods", "dpo", "--steps", "8", "--json", str(out)]
    assert main(argv) == 0
    base, sft, dpo = (json.loads(line) for line in out.read_text().splitlines())
    assert base["method"] == "base" and base["heldOut"]["pairs"] == 16
    # The SFT model trained on the 48 training pairs' chosen answers only; scored on the same 16 held-out pairs.
    assert (sft["method"], sft["steps"], sft["records"], sft["heldOut"]["pairs"]) == ("sft", 8, 48, 16)
    assert sft["heldOut"] != base["heldOut"]
    assert (dpo["method"], dpo["start"], dpo["heldOut"]["pairs"]) == ("dpo", "sft", 16)
    assert set(dpo["trainerHeldOut"]) == {"step0", "step8"}
    assert dpo["trainerHeldOut"]["step0"]["margin"] == 0  # the reference is the SFT model, where DPO starts
    gain = dpo["heldOut"]["perTokenMargin"] - sft["heldOut"]["perTokenMargin"]
    assert dpo["perTokenMarginGain"] == pytest.approx(gain, abs=1e-3)
