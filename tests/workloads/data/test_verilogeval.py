"""VerilogEval's problem layout (tests/data/verilogeval: four problems written for these tests) converted into
chat records: the record's shape, the code block evaluate.sample would take from the reference answer, the
converter's refusals, and, with iverilog, each testbench passing its reference as TopModule and failing a
broken variant, as the Verilog checker compiles them (test files first, the sample last)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tpuforge_workloads.data import verilogeval
from tpuforge_workloads.data.records import read_records
from tpuforge_workloads.evaluate.passk import code_hint, extract_code

DATA = Path(__file__).resolve().parents[2] / "data" / "verilogeval"
NAMES = ["Prob001_majority3", "Prob002_mux4w8", "Prob003_downcount", "Prob004_rise"]
# A plausible wrong TopModule per problem: the reference answer with one edit.
BROKEN = {
    "Prob001_majority3": ("(a & b) | (a & c) | (b & c)", "(a & b) | (b & c)"),
    "Prob002_mux4w8": ("2'd2: y = d2;", "2'd2: y = d3;"),
    "Prob003_downcount": ("q <= q - 4'd1;", "q <= q + 4'd1;"),
    "Prob004_rise": ("pulse <= in & ~last;", "pulse <= in ^ last;"),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("verilogeval") / "eval.jsonl"
    assert verilogeval.main([str(DATA), "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_each_problem_becomes_a_chat_record_with_its_test(records: list[dict]) -> None:
    assert len(records) == len(NAMES)
    for name, r in zip(NAMES, records, strict=True):
        user, assistant = r["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        prompt = (DATA / f"{name}_prompt.txt").read_text()
        assert user["content"] == f"{prompt.strip()}\n\n{verilogeval.INSTRUCTION}"
        test = r["test"]
        assert list(test["files"]) == ["tb.sv", "ref.sv"]  # compiled in this order, before the sample
        assert test["files"]["ref.sv"] == (DATA / f"{name}_ref.sv").read_text()
        assert test["files"]["tb.sv"] == (DATA / f"{name}_test.sv").read_text()
        assert (test["top"], test["passPattern"]) == ("tb", verilogeval.PASS_PATTERN)
        # The reference answer's code, as evaluate.sample would take it, is the reference named TopModule.
        code = extract_code(assistant["content"], code_hint(test))
        assert re.search(r"^module TopModule\b", code, re.MULTILINE) and "RefModule" not in code


def test_the_records_read_as_an_evaluation_set(tmp_path: Path, records: list[dict]) -> None:
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read = read_records(str(path))
    assert [r.test["top"] for r in read] == ["tb"] * len(NAMES)


def test_the_pass_pattern_wants_no_mismatch_in_some_samples() -> None:
    def passes(output: str) -> bool:
        return re.search(verilogeval.PASS_PATTERN, output, re.MULTILINE) is not None

    assert passes("Hint: ...\nMismatches: 0 in 101 samples\n")
    assert not passes("Mismatches: 3 in 101 samples\n")
    assert not passes("Mismatches: 10 in 101 samples\n")
    assert not passes("Mismatches: 0 in 0 samples\n")
    assert not passes("TIMEOUT\n")


def test_a_system_message_and_another_instruction(tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    assert verilogeval.convert(DATA, out, instruction="Just the code.", system="You write Verilog.") == 4
    first = json.loads(out.read_text().splitlines()[0])
    assert first["messages"][0] == {"role": "system", "content": "You write Verilog."}
    assert first["messages"][1]["content"].endswith("\n\nJust the code.")


def _copy(tmp_path: Path, name: str) -> Path:
    for suffix in (verilogeval.PROMPT_SUFFIX, verilogeval.REF_SUFFIX, verilogeval.TEST_SUFFIX):
        shutil.copy(DATA / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    return tmp_path


def test_a_problem_that_breaks_the_layout_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(tmp_path, NAMES[0])
    (d / f"{NAMES[0]}_test.sv").unlink()
    assert verilogeval.main([str(d), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert f"problem {NAMES[0]} lacks {NAMES[0]}_test.sv" in capsys.readouterr().err
    _copy(tmp_path, NAMES[0])
    ref = d / f"{NAMES[0]}_ref.sv"
    ref.write_text(ref.read_text().replace("RefModule", "Majority"))
    with pytest.raises(verilogeval.ConvertError, match=r"_ref\.sv: must define module RefModule"):
        verilogeval.read_problems(d)
    _copy(tmp_path, NAMES[0])
    tb = d / f"{NAMES[0]}_test.sv"
    tb.write_text(tb.read_text().replace("TopModule top_inst", "RefModule top_inst"))
    with pytest.raises(verilogeval.ConvertError, match="module tb must instantiate TopModule"):
        verilogeval.read_problems(d)
    (tmp_path / "empty").mkdir()
    with pytest.raises(verilogeval.ConvertError, match=r"no \*_prompt\.txt"):
        verilogeval.read_problems(tmp_path / "empty")


def _simulate(work: Path, test: dict, top: str) -> tuple[int, str]:
    """As the Verilog checker does it: the test's files compiled first, the sample last, run from `top`."""
    for name, text in test["files"].items():
        (work / name).write_text(text)
    (work / "top.sv").write_text(top)
    build = subprocess.run(
        ["iverilog", "-g2012", "-o", "sim", "-s", test["top"], *test["files"], "top.sv"],
        cwd=work, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    sim = subprocess.run(["vvp", "-n", "sim"], cwd=work, capture_output=True, text=True, timeout=60)
    return sim.returncode, sim.stdout + sim.stderr


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)")
def test_each_testbench_passes_its_reference_and_fails_a_broken_one(tmp_path: Path, records: list[dict]) -> None:
    for name, r in zip(NAMES, records, strict=True):
        test = r["test"]
        top = extract_code(r["messages"][-1]["content"], code_hint(test))
        old, new = BROKEN[name]
        assert old in top, name
        for kind, code, passes in (("ref", top, True), ("broken", top.replace(old, new), False)):
            work = tmp_path / f"{name}-{kind}"
            work.mkdir()
            rc, output = _simulate(work, test, code)
            assert rc == 0, output  # the testbench ends normally either way: the output decides
            matched = re.search(test["passPattern"], output, re.MULTILINE) is not None
            assert matched is passes, f"{name} {kind}:\n{output}"
            if not passes:
                assert re.search(r"^Mismatches: [1-9][0-9]* in [1-9][0-9]* samples", output, re.MULTILINE), output
