"""VerilogEval's problem layout (tests/data/verilogeval: five real spec-to-RTL problems of NVlabs/verilog-eval,
MIT, LICENSE beside them) converted into chat records: the record's shape, the code block evaluate.sample
would take from the reference answer, and the converter's refusals. The checker's verdicts on these problems
(references pass, wrong answers and answers that reuse RefModule fail) are in
tests/workloads/evaluate/test_evaluate_check.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tpuforge_workloads.data import verilogeval
from tpuforge_workloads.data.records import read_records
from tpuforge_workloads.evaluate.passk import code_hint, extract_code

DATA = Path(__file__).resolve().parents[2] / "data" / "verilogeval"
NAMES = ["Prob030_popcount255", "Prob058_alwaysblock2", "Prob100_fsm3comb", "Prob109_fsm1", "Prob151_review2015_fsm"]


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
        assert (test["top"], test["module"], test["verdict"]) == ("tb", "TopModule", verilogeval.VERDICT)
        assert test["reference"] == verilogeval.reference_code(verilogeval.read_problems(DATA)[NAMES.index(name)])
        # The reference answer's code, as evaluate.sample would take it, is the reference named TopModule.
        code = extract_code(assistant["content"], code_hint(test))
        assert re.search(r"^module TopModule\b", code, re.MULTILINE) and "RefModule" not in code


def test_the_records_read_as_an_evaluation_set(tmp_path: Path, records: list[dict]) -> None:
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read = read_records(str(path))
    assert [r.test["top"] for r in read] == ["tb"] * len(NAMES)


def test_a_system_message_and_another_instruction(tmp_path: Path) -> None:
    out = tmp_path / "e.jsonl"
    assert verilogeval.convert(DATA, out, instruction="Just the code.", system="You write Verilog.") == len(NAMES)
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
    tb.write_text(tb.read_text().replace("TopModule top_module1", "RefModule top_module1"))
    with pytest.raises(verilogeval.ConvertError, match="module tb must instantiate TopModule"):
        verilogeval.read_problems(d)
    (tmp_path / "empty").mkdir()
    with pytest.raises(verilogeval.ConvertError, match=r"no \*_prompt\.txt"):
        verilogeval.read_problems(tmp_path / "empty")
