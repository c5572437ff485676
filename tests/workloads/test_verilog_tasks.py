"""The Verilog task set against the real checker (Debian's iverilog through evaluate.check): each problem's
solution passes its testbench and each broken solution fails it, with the testbench's own message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tpuforge_workloads.data.verilog_tasks import PROBLEMS, VERILOG_CHECK_COMMAND, records
from tpuforge_workloads.evaluate.passk import extract_code


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)")
def test_every_solution_passes_its_testbench_and_every_broken_one_fails() -> None:
    assert len(PROBLEMS) == 12 and len({p.name for p in PROBLEMS}) == 12
    samples = []
    for kind, rows in (("good", records()), ("broken", records(broken=True))):
        for p, r in zip(PROBLEMS, rows, strict=True):
            code = extract_code(r["messages"][-1]["content"])
            samples.append({"id": f"{kind}/{p.name}", "code": code, "test": r["test"]})
    tmp = Path(tempfile.mkdtemp(prefix="tpuforge-verilog-"))
    try:
        (tmp / "s.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        subprocess.run(
            [sys.executable, "-m", "tpuforge_workloads.evaluate.check", "--samples", str(tmp / "s.jsonl"),
             "--out", str(tmp / "v.jsonl"), "--timeout", "10", "--memory", str(512 << 20), "--scratch", str(tmp),
             "--", *VERILOG_CHECK_COMMAND],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        verdicts = {v["id"]: v for v in map(json.loads, (tmp / "v.jsonl").read_text().splitlines())}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in PROBLEMS:
        good, broken = verdicts[f"good/{p.name}"], verdicts[f"broken/{p.name}"]
        assert good["verdict"] == "passed" and "PASS" in good["stdout"], good
        assert broken["verdict"] == "failed (exit 1)" and "FAIL:" in broken["stdout"] + broken["stderr"], broken


def test_the_example_job_uses_this_checker_command() -> None:
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "finetune-verilog-passk.yaml").read_text())
    assert doc["spec"]["evaluation"]["code"]["checker"]["command"] == VERILOG_CHECK_COMMAND
