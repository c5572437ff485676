"""Functional evaluation's pure parts: spec.evaluation.code validation, the pass@k verdict, the unbiased
estimator against hand-computed values, the code extraction rule and the sampling seeds."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_api_evaluation import with_eval
from tests.unit.test_api_validation import errors_of
from tpuforge import api
from tpuforge_workloads.evaluate.passk import extract_code, mean_pass_at_k, pass_at_k, problem_seed

CHECKER = {"image": "tpuforge/checker-verilog:0.1.0", "command": ["tpuforge-check-verilog"]}


def code_eval(code: dict[str, Any] | None = None, **evaluation: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"metrics": ["passAtK"], "code": {"checker": CHECKER, **(code or {})}}
    ev.update(evaluation)
    return with_eval(ev)


def test_pass_at_k_with_the_defaults() -> None:
    s = api.validate_finetune(code_eval(thresholds={"minPassAt": {"1": 0.6}}))
    assert s.evaluation is not None and s.evaluation.code is not None
    code = s.evaluation.code
    assert (code.samples_per_problem, code.k, code.seed) == (5, [1, 5], 0)
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
    assert f"holds pass@{key}, which is not measured: spec.evaluation.code.k is [1, 5]" in message
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
