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

from tpuforge_workloads.data import demo
from tpuforge_workloads.data.verilog_tasks import (
    MORE_PROBLEMS,
    PROBLEMS,
    SHORT,
    VERILOG_CHECK_COMMAND,
    corpus,
    records,
)
from tpuforge_workloads.evaluate.passk import extract_code
from tpuforge_workloads.families.gemma4 import tiny as tiny_model


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)")
def test_every_solution_passes_its_testbench_and_every_broken_one_fails() -> None:
    assert len(PROBLEMS) == 12 and len(MORE_PROBLEMS) == 28
    every = PROBLEMS + MORE_PROBLEMS
    assert len({p.name for p in every}) == 40
    samples = []
    for kind, rows in (("good", records(problems=every)), ("broken", records(broken=True, problems=every))):
        for p, r in zip(every, rows, strict=True):
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
    for p in every:
        good, broken = verdicts[f"good/{p.name}"], verdicts[f"broken/{p.name}"]
        assert good["verdict"] == "passed" and "PASS" in good["stdout"], good
        assert broken["verdict"] == "failed (exit 1)" and "FAIL:" in broken["stdout"] + broken["stderr"], broken


ROOT = Path(__file__).resolve().parents[3]


def test_the_example_jobs_use_this_checker_command_and_the_demo_files_are_the_short_problems() -> None:
    for name in ("finetune-verilog-passk.yaml", "finetune-verilog-demo.yaml"):
        for doc in yaml.safe_load_all((ROOT / "examples" / name).read_text()):
            assert doc["spec"]["evaluation"]["code"]["checker"]["command"] == VERILOG_CHECK_COMMAND
    data = ROOT / "examples" / "data"
    assert (data / "verilog-train.jsonl").read_text() == demo.jsonl(records(names=SHORT))
    assert (data / "verilog-broken.jsonl").read_text() == demo.jsonl(records(broken=True, names=SHORT))
    with pytest.raises(ValueError, match=r"no Verilog problem named \['mux3'\]"):
        records(names=("mux2", "mux3"))


def test_the_verilog_tokenizer_fits_every_record_in_128_tokens_() -> None:
    """The e2e test and the demo train with maxSeqLen 128 and drop longer records: with its own tokenizer a
    whole record (chat frame included) fits, where the chat task's tokenizer needs about twice as many."""
    verilog, chat = tiny_model.train_tokenizer(512, corpus="verilog"), tiny_model.train_tokenizer(512)
    frame = "<|turn>user\n{}<turn|>\n<|turn>model\n{}<turn|>\n"
    for kind in (False, True):
        for r in records(broken=kind, problems=PROBLEMS + MORE_PROBLEMS):
            text = frame.format(*(m["content"] for m in r["messages"]))
            short, long = len(verilog.encode(text).ids), len(chat.encode(text).ids)
            assert short <= 128 and long >= 1.5 * short, (short, long, text)
    assert corpus()[:2] == [PROBLEMS[0].ask, f"```verilog\n{PROBLEMS[0].solution}\n```"]
