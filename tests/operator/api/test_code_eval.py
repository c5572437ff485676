"""Functional evaluation's pure parts: spec.evaluation.code validation, the pass@k verdict, the unbiased
estimator against hand-computed values, the code extraction rule and the sampling seeds."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.fixtures.api_specs import errors_of, with_eval
from tpuforge import api
from tpuforge.api.code_eval import ConfidenceInterval
from tpuforge_workloads.evaluate.passk import (
    CodeHint,
    code_hint,
    exact_interval,
    extract_code,
    mean_pass_at_k,
    pass_at_k,
    problem_pass_at_k,
    problem_seed,
)

CHECKER = {"image": "tpuforge/checker-verilog:0.1.0", "command": ["tpuforge-check-verilog"]}


def code_eval(code: dict[str, Any] | None = None, **evaluation: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"metrics": ["passAtK"], "code": {"checker": CHECKER, **(code or {})}}
    ev.update(evaluation)
    return with_eval(ev)


def test_pass_at_k_with_the_defaults() -> None:
    s = api.validate_finetune(code_eval(thresholds={"minPassAt": {"1": 0.6}}))
    assert s.evaluation is not None and s.evaluation.code is not None
    code = s.evaluation.code
    # Greedy pass@1, as VerilogEval v2 reports it.
    assert (code.samples_per_problem, code.k, code.seed, code.temperature) == (1, [1], 0, 0.0)
    assert code.checker is not None and code.checker.timeout_seconds == 10.0
    cfg = api.eval_config("ns", "job", s)
    assert cfg.code == code and cfg.metrics == ["passAtK"]


def test_pass_at_k_needs_the_code_section_and_its_checker() -> None:
    raw = with_eval({"metrics": ["passAtK"]})
    assert "set spec.evaluation.code with its checker" in errors_of(raw)["spec.evaluation.code"]
    raw = with_eval({"metrics": ["passAtK"], "code": {}})
    assert "the image and command" in errors_of(raw)["spec.evaluation.code.checker"]


def test_a_code_section_needs_the_metric() -> None:
    message = errors_of(code_eval(metrics=["loss"]))["spec.evaluation.metrics"]
    assert "leave out passAtK; add passAtK or remove spec.evaluation.code" in message


def test_each_k_is_at_most_the_samples_per_problem() -> None:
    errors = errors_of(code_eval({"samplesPerProblem": 3, "k": [1, 5]}))
    assert list(errors) == ["spec.evaluation.code.k[1]"]
    assert (
        "pass@5 needs at least 5 samples per problem but samplesPerProblem is 3" in errors["spec.evaluation.code.k[1]"]
    )
    assert "spec.evaluation.code.k" in errors_of(code_eval({"k": [1, 1]}))


@pytest.mark.parametrize(("key", "value"), [("10", 0.5), ("one", 0.5)])
def test_a_pass_at_threshold_needs_its_k(key: str, value: float) -> None:
    message = errors_of(code_eval(thresholds={"minPassAt": {key: value}}))[
        f"spec.evaluation.thresholds.minPassAt.{key}"
    ]
    assert f"holds pass@{key}, which is not measured: spec.evaluation.code.k is [1]" in message
    assert f"add {key} to spec.evaluation.code.k" in message


def test_a_pass_at_threshold_is_a_fraction_and_the_checker_limits_are_quantities() -> None:
    errors = errors_of(code_eval({"checker": {**CHECKER, "memory": "lots"}}, thresholds={"minPassAt": {"1": 1.5}}))
    assert "between 0 and 1 (got 1.5)" in errors["spec.evaluation.thresholds.minPassAt.1"]
    assert "Kubernetes quantity (got 'lots')" in errors["spec.evaluation.code.checker.memory"]


def test_the_verdict_holds_pass_at_k_to_its_threshold() -> None:
    ev = api.EvaluationSpec.model_validate({"thresholds": {"minPassAt": {"5": 0.9, "1": 0.6}}})
    assert api.evaluation_verdict(ev, {"pass@1": 0.7, "pass@5": 0.95}) == (
        True,
        "pass@1 0.70 >= minPassAt.1 0.60; pass@5 0.95 >= minPassAt.5 0.90",
    )
    assert api.evaluation_verdict(ev, {"pass@1": 0.25, "pass@5": 0.95}) == (
        False,
        "pass@1 0.25 < minPassAt.1 0.60; pass@5 0.95 >= minPassAt.5 0.90",
    )
    assert api.evaluation_verdict(ev, {"pass@5": 0.95})[1].startswith("pass@1 missing from the result")


# n = 5 by hand: pass@1 = c/5; pass@5 = 1 as soon as one sample passes; pass@2 = 1 - C(5-c, 2)/C(5, 2).
@pytest.mark.parametrize(
    ("c", "at1", "at2", "at5"),
    [
        (0, 0.0, 0.0, 0.0),
        (1, 0.2, 0.4, 1.0),
        (2, 0.4, 0.7, 1.0),
        (3, 0.6, 0.9, 1.0),
        (4, 0.8, 1.0, 1.0),
        (5, 1.0, 1.0, 1.0),
    ],
)
def test_the_estimator_against_hand_computed_values(c: int, at1: float, at2: float, at5: float) -> None:
    assert pass_at_k(5, c, 1) == pytest.approx(at1)
    assert pass_at_k(5, c, 2) == pytest.approx(at2)
    assert pass_at_k(5, c, 5) == pytest.approx(at5)


def test_the_set_score_is_the_mean_over_problems_and_bad_counts_are_refused() -> None:
    verdicts = [[True, False, False, False, False], [False] * 5, [True] * 5]
    assert mean_pass_at_k(verdicts, 1) == pytest.approx((0.2 + 0.0 + 1.0) / 3)
    assert mean_pass_at_k(verdicts, 5) == pytest.approx(2 / 3)
    # Large n stays exact (no factorial overflow): 1 of 200 passing, k = 1.
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    for n, c, k in ((5, 6, 1), (5, 1, 6), (5, 1, 0)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        ("module m; endmodule", "module m; endmodule"),
        ("  \nmodule m; endmodule\n\n", "module m; endmodule"),
        (
            "Here:\n```verilog\nmodule a; endmodule\n```\nor better:\n```\nmodule b; endmodule\n```\n",
            "module b; endmodule",
        ),
        ("~~~systemverilog\nmodule t; endmodule\n~~~", "module t; endmodule"),
        ("````\nuses ``` inside\n````", "uses ``` inside"),
        ("Sure:\n```verilog\nmodule cut; endmodule", "module cut; endmodule"),
    ],
)
def test_the_code_is_the_last_fenced_block_or_the_whole_answer(answer: str, code: str) -> None:
    assert extract_code(answer) == code


def test_seeds_are_per_problem_and_the_same_on_every_rerun() -> None:
    seeds = [problem_seed(7, i) for i in range(4)]
    assert seeds == [7, 8, 9, 10] == [problem_seed(7, i) for i in range(4)]
    assert 0 <= problem_seed(2**31 - 1, 5) < 2**31


TOP = "module TopModule(input a, output y);\n  assign y = ~a;\nendmodule"
TB = "module tb;\n  reg a; wire y;\n  TopModule dut(.a(a), .y(y));\nendmodule"
VERILOG = CodeHint("verilog")


@pytest.mark.parametrize(
    ("answer", "hint", "code"),
    [
        # An explanation block after the code: the block that declares a module, not the last one.
        (f"```verilog\n{TOP}\n```\nIt works like this:\n```\ny = not a\n```\n", VERILOG, TOP),
        # A testbench block before the module: the last block that declares one.
        (f"Test first:\n```verilog\n{TB}\n```\nNow the design:\n```\n{TOP}\n```", VERILOG, TOP),
        # A testbench after the module: the test's codePattern names the module the sample must define.
        (f"```verilog\n{TOP}\n```\nand a bench:\n```verilog\n{TB}\n```", CodeHint("verilog", r"module\s+TopModule\b"),
         TOP),
        # ... and without one: a testbench is a module without ports, not the design.
        (f"```verilog\n{TOP}\n```\nand a bench:\n```verilog\n{TB}\n```", VERILOG, TOP),
        # ... and the test's module asks for the block that defines it (code_hint's pattern).
        (f"```verilog\n{TOP}\n```\n```verilog\nmodule helper(input a);\nendmodule\n```",
         code_hint({"files": {"tb.sv": ""}, "module": "TopModule"}), TOP),
        # No block declares a module: the last one whose info string names the language.
        ("```verilog\nassign y = ~a;\n```\nOutput:\n```text\ny=1\n```", VERILOG, "assign y = ~a;"),
        # Nothing matches the hint: the last block, as without one.
        ("```\nfoo\n```\n```\nbar\n```", VERILOG, "bar"),
        # No fence: Verilog's span from the first `module` to the last `endmodule`, prose around it dropped.
        (f"Sure! Here it is:\n{TOP}\nThis inverts a.", VERILOG, TOP),
        (f"Sure! Here it is:\n{TOP}\nThis inverts a.", CodeHint(), f"Sure! Here it is:\n{TOP}\nThis inverts a."),
        # An unclosed last fence after a closed one: what follows it.
        (f"```text\nplan\n```\n```verilog\n{TOP}", VERILOG, TOP),
        # Python: the block with a def, not the usage example after it.
        ("```python\ndef f(x):\n    return x\n```\n```\n>>> f(1)\n1\n```", CodeHint("python"),
         "def f(x):\n    return x"),
    ],
)  # fmt: skip
def test_the_code_is_the_block_that_holds_the_problems_language(answer: str, hint: CodeHint, code: str) -> None:
    assert extract_code(answer, hint) == code


def test_the_hint_comes_from_the_tests_language_pattern_or_file_names() -> None:
    assert code_hint({"files": {"tb.sv": "", "ref.sv": ""}}) == CodeHint("verilog")
    assert code_hint({"files": {"tb.v": ""}, "codePattern": "module m"}) == CodeHint("verilog", "module m")
    by_module = code_hint({"files": {"tb.sv": ""}, "module": "TopModule"})
    assert by_module.pattern is not None and re.search(by_module.pattern, "  module TopModule (", re.MULTILINE)
    assert not re.search(by_module.pattern, "module TopModuleX (", re.MULTILINE)
    assert code_hint({"files": {"test_it.py": ""}}) == CodeHint("python")
    assert code_hint({"language": "Verilog", "files": {"test.py": ""}}) == VERILOG  # said outright, it wins
    assert code_hint({"files": {"data.txt": ""}}) == CodeHint() == code_hint(None) == code_hint("tb")


def test_the_default_temperature_is_greedy_for_one_sample_else_follows_the_largest_k() -> None:
    assert api.CodeEvalSpec().temperature == 0.0  # one sample per problem: greedy
    assert api.CodeEvalSpec(k=[1], samples_per_problem=20).temperature == 0.2
    assert api.CodeEvalSpec(k=[1, 5], samples_per_problem=5).temperature == 0.8
    assert api.CodeEvalSpec(k=[1], temperature=0.6).temperature == 0.6
    assert api.CodeEvalSpec(k=[1], temperature=0).sampling_temperature == 0  # greedy stays greedy
    assert api.CodeEvalSpec.model_validate({"samplesPerProblem": 20}).to_wire()["temperature"] == 0.2


def test_the_interval_is_exact_over_problems_and_holds_the_estimate() -> None:
    verdicts = [[True] * 5] * 6 + [[False] * 5] * 3 + [[True, False, False, False, False]] * 3
    per = problem_pass_at_k(verdicts, 1)
    low, high = exact_interval(per, 0.95)
    mean = mean_pass_at_k(verdicts, 1)
    assert 0.0 <= low < mean < high <= 1.0
    wide = exact_interval(per, 0.99)
    assert wide[0] < low and wide[1] > high


def test_a_pass_at_threshold_is_held_against_the_intervals_low_bound() -> None:
    ev = api.EvaluationSpec.model_validate({"thresholds": {"minPassAt": {"1": 0.6}}})
    confident = {"pass@1": ConfidenceInterval(low=0.62, high=0.88)}
    lucky = {"pass@1": ConfidenceInterval(low=0.41, high=0.9, method="clopper-pearson")}
    assert api.evaluation_verdict(ev, {"pass@1": 0.75}, confident) == (
        True,
        "pass@1 0.75 (95% CI 0.62-0.88): low 0.62 >= minPassAt.1 0.60",
    )
    assert api.evaluation_verdict(ev, {"pass@1": 0.7}, lucky) == (
        False,
        "pass@1 0.70 (95% clopper-pearson CI 0.41-0.90): low 0.41 < minPassAt.1 0.60",
    )
    # A result without intervals (an older evaluator) is held by its estimate.
    assert api.evaluation_verdict(ev, {"pass@1": 0.7}) == (True, "pass@1 0.70 >= minPassAt.1 0.60")
