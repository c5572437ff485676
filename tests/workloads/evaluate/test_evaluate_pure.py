"""The evaluation's pure parts: splitting a record into prompt and reference, exact match, the result the
score program reports; and that the score program loads without JAX (the evaluator image has none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuforge.api import CheckerSpec, CodeEvalSpec, LoraSpec, MeshSpec, TrainingSpec
from tpuforge.api.configs import EvalConfig
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.answers import AnswerError, Samples, max_lora_rank
from tpuforge_workloads.evaluate.check import unreadable_source
from tpuforge_workloads.evaluate.config import EvalInputError
from tpuforge_workloads.evaluate.records import read_examples
from tpuforge_workloads.evaluate.sample import problems, sample_lines
from tpuforge_workloads.evaluate.score import (
    code_summary,
    exact_match,
    metrics_of,
    read_answers,
    read_checked,
    read_losses,
    report_lines,
)

ROOT = Path(__file__).resolve().parents[3]


def _jsonl(path: Path, records: list[list[tuple[str, str]]]) -> str:
    path.write_text(
        "".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in m]}) + "\n" for m in records)
    )
    return str(path)


def _config(**kw: object) -> EvalConfig:
    fields: dict[str, object] = {
        "model_name": "gemma4-tiny",
        "base_model_uri": "gs://b/base",
        "adapter_uri": "gs://b/out/adapter",
        "checkpoint_uri": "gs://b/ckpt",
        "dataset_uri": "gs://b/eval.jsonl",
        "metrics": ["exactMatch"],
        "max_examples": 10,
        "max_new_tokens": 8,
        "lora": LoraSpec(),
        "training": TrainingSpec(max_seq_len=64),
        "mesh": MeshSpec(fsdp=1, tp=1),
        "report_uri": "gs://b/out/eval",
    }
    fields.update(kw)
    return EvalConfig.model_validate(fields)


def test_prompt_is_every_turn_before_the_last_assistant_turn(tmp_path: Path) -> None:
    uri = _jsonl(
        tmp_path / "e.jsonl",
        [
            [("system", "Be brief."), ("user", "Capital of Peru?"), ("assistant", "Lima.")],
            [("user", "Hi"), ("assistant", "Hello."), ("user", "Capital of Chile?"), ("assistant", " Santiago. ")],
            [("user", "Q"), ("assistant", "A"), ("user", "left unanswered")],
            [("user", "beyond maxExamples"), ("assistant", "x")],
        ],
    )
    examples = read_examples(uri, max_examples=3)
    assert [e.index for e in examples] == [0, 1, 2]
    assert examples[0].prompt_json() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of Peru?"},
    ]
    assert [m.content for m in examples[1].prompt] == ["Hi", "Hello.", "Capital of Chile?"]
    assert examples[1].reference == " Santiago. "
    assert [m.content for m in examples[2].prompt] == ["Q"] and examples[2].reference == "A"


def test_a_record_without_a_question_before_its_answer_is_named(tmp_path: Path) -> None:
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", "q"), ("assistant", "a")], [("assistant", "a"), ("user", "q")]])
    with pytest.raises(DatasetError, match=r"e.jsonl:2: no user turn before the last assistant turn"):
        read_examples(uri, max_examples=5)


def test_exact_match_ignores_only_surrounding_whitespace() -> None:
    assert exact_match(" The capital of Peru is Lima.\n", "The capital of Peru is Lima.")
    assert not exact_match("The capital of Peru is Lima", "The capital of Peru is Lima.")
    assert not exact_match("the capital of Peru is Lima.", "The capital of Peru is Lima.")


def test_result_has_only_the_metrics_asked_for(tmp_path: Path) -> None:
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", f"q{i}"), ("assistant", f"a{i}")] for i in range(4)])
    examples = read_examples(uri, 4)

    class Answers:
        adapter = ["a0", "a1 ", "wrong", "a3"]
        base = ["a0", "x", "y", "z"]

    lines = report_lines(examples, Answers(), None, None)  # type: ignore[arg-type]
    assert [line["exactMatch"] for line in lines] == [True, True, False, True]
    result = metrics_of(_config(report_uri="gs://b/r"), examples, lines, None, None)
    assert result == {
        "metrics": {"exactMatch": 0.75},
        "baseMetrics": {"exactMatch": 0.25},
        "examples": 4,
        "reportUri": "gs://b/r",
    }


def test_preference_accuracy_and_margin_come_from_the_loss_containers_file(tmp_path: Path) -> None:
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", "q0"), ("assistant", "a0")]])
    examples = read_examples(uri, 1)
    cfg = _config(metrics=["preferenceAccuracy"], pairs_uri="gs://b/pairs.jsonl", pairs_held_out=True)
    written = {
        "loss": 0.5,
        "baseLoss": 2.0,
        "perExample": [{"index": 0, "loss": 0.5, "baseLoss": 2.0, "tokens": 3}],
        "preference": {"pairs": 16, "accuracy": 1.0, "margin": 4.53, "baseAccuracy": 0.5625, "baseMargin": 0.046},
    }
    path = tmp_path / "loss.json"
    path.write_text(json.dumps(written))
    losses = read_losses(str(path), cfg, examples)
    result = metrics_of(cfg, examples, report_lines(examples, None, losses, None), losses, None)
    # Only what was asked for: preferenceAccuracy with its margin, not the loss computed beside it.
    assert (result["metrics"], result["baseMetrics"]) == (
        {"preferenceAccuracy": 1.0, "preferenceMargin": 4.53},
        {"preferenceAccuracy": 0.5625, "preferenceMargin": 0.046},
    )
    with pytest.raises(EvalInputError, match="metrics asks for preferenceAccuracy but no --loss file"):
        read_losses(None, cfg, examples)
    path.write_text(json.dumps({k: v for k, v in written.items() if k != "preference"}))
    with pytest.raises(EvalInputError, match=r"not what evaluate\.loss writes"):
        read_losses(str(path), cfg, examples)


def test_greedy_answers_drawn_beside_the_samples_are_read_back_one_per_record(tmp_path: Path) -> None:
    """exactMatch beside passAtK: evaluate.sample writes the greedy answers (--answers) and score reads them
    instead of loading vLLM again."""
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", f"q{i}"), ("assistant", f"a{i}")] for i in range(2)])
    examples = read_examples(uri, 2)
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({"base": ["x", "a1"], "adapter": ["a0", "a1"], "seconds": 1.5}))
    answers = read_answers(str(path), examples)
    lines = report_lines(examples, answers, None, None)
    assert metrics_of(_config(), examples, lines, None, None)["metrics"] == {"exactMatch": 1.0}
    path.write_text(json.dumps({"base": ["x"], "adapter": ["a0"], "seconds": 1.5}))
    with pytest.raises(EvalInputError, match="1 answers but this config evaluates 2 records"):
        read_answers(str(path), examples)
    path.write_text(json.dumps({"base": ["x"]}))
    with pytest.raises(EvalInputError, match=r"not what evaluate\.sample writes"):
        read_answers(str(path), examples)


def test_vllm_lora_rank_is_the_next_one_vllm_accepts() -> None:
    assert [max_lora_rank(r) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(AnswerError, match="up to 512"):
        max_lora_rank(1024)


def test_the_score_program_loads_without_jax_or_vllm() -> None:
    code = "import sys, tpuforge_workloads.evaluate.score; print(sorted({'jax', 'vllm', 'torch'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "workloads")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_checker_runner_needs_the_standard_library_only() -> None:
    """The checker image carries Python without site-packages, and only check.py and jail.py of ours."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workloads")}
    code = "import tpuforge_workloads.evaluate.check"
    subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True)


def test_pass_at_k_from_samples_and_verdicts_and_what_the_report_keeps(tmp_path: Path) -> None:
    """Two problems, n=3: the adapter passes 2 of 3 and 3 of 3, the base none; pass@1 = (2/3 + 1) / 2."""
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", f"q{i}"), ("assistant", f"a{i}")] for i in range(2)])
    examples = read_examples(uri, 2)
    code = CodeEvalSpec(samples_per_problem=3, k=[1, 3], checker=CheckerSpec(image="c", command=["true"]))
    cfg = _config(metrics=["passAtK"], code=code, report_uri="gs://b/r")
    adapter_passes = {(0, 0): True, (0, 1): False, (0, 2): True, (1, 0): True, (1, 1): True, (1, 2): True}
    samples, verdicts = [], []
    for model in ("adapter", "base"):
        for i in range(2):
            for j in range(3):
                sid = f"{model}/{i}/{j}"
                passed = model == "adapter" and adapter_passes[(i, j)]
                samples.append({"id": sid, "model": model, "index": i, "sample": j, "code": f"c{j}", "test": {}})
                verdict = "passed" if passed else "failed (exit 1)"
                verdicts.append({"id": sid, "passed": passed, "verdict": verdict, "stdout": "", "stderr": "e"})
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in reversed(verdicts)))
    checked = read_checked(cfg, examples, str(tmp_path / "s.jsonl"), str(tmp_path / "v.jsonl"))
    lines = report_lines(examples, None, None, checked)
    assert [(line["passed"], line["basePassed"]) for line in lines] == [(2, 0), (3, 0)]
    assert [s["verdict"] for s in lines[0]["samples"]] == ["passed", "failed (exit 1)", "passed"]
    assert lines[0]["baseSamples"][1] == {"sample": 1, "code": "c1", "passed": False, "failure": "error",
                                          "verdict": "failed (exit 1)", "stdout": "", "stderr": "e"}  # fmt: skip
    result = metrics_of(cfg, examples, lines, None, checked)
    assert result["metrics"] == pytest.approx({"pass@1": (2 / 3 + 1) / 2, "pass@3": 1.0})
    assert result["baseMetrics"] == {"pass@1": 0.0, "pass@3": 0.0}
    # Exact over 2 problems: both passing proves pass@3 >= 0.025 ** (1/2) = 0.158 only; none passing, <= 0.842.
    cp = "clopper-pearson"
    assert result["intervals"] == {"pass@1": {"low": 0.0871, "high": 1.0, "method": cp},
                                   "pass@3": {"low": 0.1581, "high": 1.0, "method": cp}}  # fmt: skip
    assert result["baseIntervals"] == {f"pass@{k}": {"low": 0.0, "high": 0.8419, "method": cp} for k in (1, 3)}
    assert result["standardErrors"] == {"pass@1": round((1 / 3) / 2, 4), "pass@3": 0.0}
    assert result["excludedProblems"] == 0
    assert result["sampling"] == "3 samples per problem at temperature 0.8, topP 0.95"
    # A verdict without "failure" (a checker from before the categories): its text decides, else "error".
    assert (result["failures"], result["baseFailures"]) == ({"error": 1}, {"error": 6})
    # A verdict missing (the checker stopped early) or another n is refused, naming the file.
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in verdicts[1:]))
    with pytest.raises(EvalInputError, match="no verdict for sample adapter/0/0"):
        read_checked(cfg, examples, str(tmp_path / "s.jsonl"), str(tmp_path / "v.jsonl"))
    with pytest.raises(EvalInputError, match="--samples and --verdicts"):
        read_checked(cfg, examples, None, None)


def test_failures_by_category_and_a_truncated_answer_fails_whatever_the_checker_said(tmp_path: Path) -> None:
    """One problem, n=8: each sample's verdict carries the checker's "failure" (or none, as before the
    categories); the one vLLM cut at maxNewTokens fails though the checker passed it."""
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", "q"), ("assistant", "a")]])
    examples = read_examples(uri, 1)
    code = CodeEvalSpec(samples_per_problem=8, k=[1], checker=CheckerSpec(image="c", command=["true"]))
    cfg = _config(metrics=["passAtK"], code=code, report_uri="gs://b/r")
    # (passed, failure field (... = absent), verdict text, finish_reason)
    drawn = [
        (True, None, "passed", "stop"),
        (True, None, "passed", "length"),
        (False, "syntax", "failed (exit 1)", "stop"),
        (False, "mismatch", "failed (exit 1)", "stop"),
        (False, "refused", "not run: refused", "stop"),
        (False, ..., "timed out after 10 s", "stop"),
        (False, ..., "killed by SIGKILL (killed)", None),
        (False, "compile", "failed (exit 2)", "stop"),
    ]
    samples, verdicts = [], []
    for model in ("adapter", "base"):
        for j, (passed, failure, text, finish) in enumerate(drawn):
            sid = f"{model}/0/{j}"
            samples.append({"id": sid, "model": model, "index": 0, "sample": j, "code": "c", "finishReason": finish,
                            "test": {}})  # fmt: skip
            verdict = {"id": sid, "passed": passed, "verdict": text}
            if failure is not ...:
                verdict["failure"] = failure
            verdicts.append(verdict)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in verdicts))
    checked = read_checked(cfg, examples, str(tmp_path / "s.jsonl"), str(tmp_path / "v.jsonl"))
    lines = report_lines(examples, None, None, checked)
    kept = lines[0]["samples"]
    assert [s["failure"] for s in kept] == [None, "truncated", "syntax", "mismatch", "refused", "timeout", "error",
                                            "compile"]  # fmt: skip
    assert kept[1]["passed"] is False and kept[1]["finishReason"] == "length"
    assert kept[1]["verdict"] == "truncated at maxNewTokens (the checker said: passed)"
    assert lines[0]["passed"] == 1
    result = metrics_of(cfg, examples, lines, None, checked)
    assert result["metrics"] == {"pass@1": 1 / 8}
    want = {"truncated": 1, "syntax": 1, "mismatch": 1, "refused": 1, "timeout": 1, "error": 1, "compile": 1}
    assert result["failures"] == result["baseFailures"] == want
    summary = code_summary(cfg, examples, checked)
    assert summary["failureCounts"]["adapter"] == {**want, "limit": 0, "task": 0}
    assert summary["confidence"]["method"] == "clopper-pearson"
    assert summary["code"]["temperature"] == 0.2  # unset, k = [1]: pass@1's temperature
    # One problem, eight samples each, the same verdicts for both models: a rise of 0 by the t interval.
    rise = summary["rise"]["pass@1"]
    assert (rise["rise"], rise["interval"], rise["beyondInterval"]) == (0.0, [0.0, 0.0], False)
    assert rise["method"] == "Student t over the per-problem differences"


def test_a_problem_the_checker_finds_broken_is_kept_out_of_pass_at_k(tmp_path: Path) -> None:
    """Three problems, n=2: the second's reference does not compile with the checker's simulator (failure
    "task" on every sample): pass@1 is over the other two, and the summary names it and the simulator."""
    uri = _jsonl(tmp_path / "e.jsonl", [[("user", f"q{i}"), ("assistant", f"a{i}")] for i in range(3)])
    examples = read_examples(uri, 3)
    code = CodeEvalSpec(samples_per_problem=2, k=[1], checker=CheckerSpec(image="c", command=["true"]))
    cfg = _config(metrics=["passAtK"], code=code, report_uri="gs://b/r")
    samples, verdicts = [], []
    for model in ("adapter", "base"):
        for i in range(3):
            for j in range(2):
                sid = f"{model}/{i}/{j}"
                samples.append({"id": sid, "model": model, "index": i, "sample": j, "code": "c", "test": {}})
                failure = "task" if i == 1 else (None if model == "adapter" else "mismatch")
                verdicts.append({"id": sid, "passed": failure is None, "verdict": "v", "failure": failure,
                                 "simulator": "Icarus Verilog version 11.0 (stable)"})  # fmt: skip
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in verdicts))
    checked = read_checked(cfg, examples, str(tmp_path / "s.jsonl"), str(tmp_path / "v.jsonl"))
    result = metrics_of(cfg, examples, report_lines(examples, None, None, checked), None, checked)
    assert (result["metrics"], result["baseMetrics"]) == ({"pass@1": 1.0}, {"pass@1": 0.0})
    assert result["excludedProblems"] == 1 and result["failures"] == {"task": 2}
    summary = code_summary(cfg, examples, checked)
    assert summary["excludedProblems"] == [1]
    # Both kept problems rose from 0 to 1 (two samples each, all alike): the exact paired rise, over 2 problems.
    rise = summary["rise"]["pass@1"]
    assert (rise["rise"], rise["rose"], rise["fell"], rise["mcnemarExactP"]) == (1.0, 2, 0, 0.5)
    assert rise["method"].startswith("Newcombe") and rise["interval"][1] == 1.0
    assert summary["simulators"] == ["Icarus Verilog version 11.0 (stable)"]
    # Every problem broken: no score, and the reason.
    every = [{**v, "failure": "task", "passed": False} for v in verdicts]
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(x) + "\n" for x in every))
    checked = read_checked(cfg, examples, str(tmp_path / "s.jsonl"), str(tmp_path / "v.jsonl"))
    with pytest.raises(EvalInputError, match="every one of the 3 problems is broken"):
        metrics_of(cfg, examples, report_lines(examples, None, None, checked), None, checked)


def test_samples_carry_their_finish_reason_and_the_code_block_that_holds_the_module(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
              "test": {"files": {"tb.sv": "module tb; endmodule"}}}  # fmt: skip
    path.write_text(json.dumps(record) + "\n")
    examples = read_examples(str(path), 1)
    answer = "```verilog\nmodule TopModule(input a, output y); assign y = a; endmodule\n```\nWhy:\n```\ny = a\n```"
    drawn = Samples(base=[[answer]], adapter=[[answer, "cut"]], seconds=1.0, base_finish=[["stop"]],
                    adapter_finish=[["stop", "length"]])  # fmt: skip
    lines = sample_lines(examples, drawn)
    assert [(line["id"], line["finishReason"]) for line in lines] == [
        ("adapter/0/0", "stop"),
        ("adapter/0/1", "length"),
        ("base/0/0", "stop"),
    ]
    assert lines[0]["code"] == "module TopModule(input a, output y); assign y = a; endmodule"
    assert lines[0]["test"] == record["test"]


def test_a_code_pattern_that_is_not_a_regex_is_named_before_any_model_loads(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
              "test": {"files": {}, "codePattern": "module (TopModule"}}  # fmt: skip
    path.write_text(json.dumps(record) + "\n")
    code = CodeEvalSpec(checker=CheckerSpec(image="c", command=["true"]))
    cfg = _config(metrics=["passAtK"], code=code, dataset_uri=str(path))
    with pytest.raises(EvalInputError, match=r"e.jsonl:1: test.codePattern 'module \(TopModule' is not a regular"):
        problems(cfg)


def test_a_checker_source_the_samples_uids_cannot_read_is_refused_before_any_sample_runs(tmp_path: Path) -> None:
    # A checkout under a 0700 folder (mktemp -d, a private home): every sample would fail importing the checker,
    # blamed on the sample; the checker says which folder to open instead.
    root = tmp_path / "private" / "workloads"
    root.mkdir(parents=True)
    for d in (tmp_path, root.parent, root):
        d.chmod(0o755)
    # (pytest's own folders above may be 0700: only the nearest shut folder is named)
    assert f"{root.parent} does not let" not in (unreadable_source(root) or "")
    root.parent.chmod(0o700)
    try:
        why = unreadable_source(root)
        assert why is not None and f"{root.parent} does not let other users in (mode 700)" in why
        assert "chmod o+rx" in why
    finally:
        root.parent.chmod(0o755)
