"""The runner of a TPU session's measurements (benchmarks/chip/session.py): its named plan, and on CPU each
measurement run in a process of its own under a deadline, its rows appended as it goes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from benchmarks.chip import session


def test_the_plan_names_each_measurement_once_and_every_command_is_a_module() -> None:
    for tiny in (False, True):
        measurements = session.plan(tiny)
        names = [m.name for m in measurements]
        assert len(names) == len(set(names))
        for m in measurements:
            assert importlib.util.find_spec(m.args[0]) is not None, m.args[0]
            assert "{out}" in m.args and m.deadline_s <= 900
    groups = {m.group for m in session.plan()}
    assert groups == {"throughput", "build", "preflight", "splash", "trainer", "decode"}
    trainer = [m.name for m in session.select(session.plan(), "trainer")]
    assert trainer == [
        "trainer-gemma4-tiny",
        "trainer-qwen3-tiny",
        "trainer-gemma4-tiny-int8",
        "trainer-gemma4-tiny-dpo",
        "trainer-gemma4-tiny-orpo",
        "trainer-gemma4-tiny-grpo",
    ]
    assert [m.name for m in session.select(session.plan(), "splash-31b-global,trainer-qwen3-tiny")] == [
        "splash-31b-global",
        "trainer-qwen3-tiny",
    ]
    with pytest.raises(ValueError, match="--only: nothing not in the plan; known: build, "):
        session.select(session.plan(), "nothing")


@pytest.mark.slow
def test_each_measurement_runs_in_its_own_process_and_a_deadline_stops_only_it(tmp_path: Path) -> None:
    splash = session.select(session.plan(tiny=True), "splash-tiny")[0]
    late = session.Measurement("late", "splash", splash.args, deadline_s=0.5)
    stopped = session.run(late, tmp_path)
    record = session.run(splash, tmp_path)
    assert stopped["exit"] == "deadline 0 s" and stopped["rows"] == []
    assert record["exit"] == 0, (tmp_path / "splash-tiny.log").read_text()[-2000:]
    rows = record["rows"]
    assert [r["case"] for r in rows] == ["sliding", "sliding packed", "global", "global packed"]  # type: ignore[index]
    for r in rows:  # type: ignore[attr-defined]
        # bfloat16 inputs against a float32 reference: within bfloat16's rounding of the largest value.
        assert max(r[k] for k in ("forwardRelErr", "dqRelErr", "dkRelErr", "dvRelErr")) < 2e-2, r
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [x["name"] for x in lines] == ["late", "splash-tiny"]


def test_the_resume_check_reads_the_step_a_trainer_log_line_reports() -> None:
    from benchmarks.chip.trainer_resume import _logged_step

    line = "INFO step 110/300 loss 0.8123 tokens/s 5,120 eta 12s (step 0.01s, 512 tokens)"
    assert _logged_step(line, 300) == 110
    assert _logged_step("INFO checkpoint 100 committed in 0.3 s", 300) is None
    assert _logged_step("INFO step 110/3000 loss 0.8", 300) is None
