"""pass@k from the checker's verdicts: evaluate.sample's samples joined with evaluate.check's verdicts, per
problem and model, into the report's fields, the metrics pass@1, pass@5, ... (base and adapter), their
confidence intervals and standard errors, and the count of failed samples by why they failed. A problem the
checker found broken (a sample's failure "task": its reference does not compile with the checker's
simulator) is kept out of pass@k for both models: it measures the task set, not the model."""

from __future__ import annotations

import json
from typing import Any

from tpuforge.api.code_eval import CONFIDENCE_LEVEL, FAILURE_CATEGORIES, INTERVAL_METHOD, pass_at_metric
from tpuforge.api.configs import EvalConfig
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate.config import EvalInputError
from tpuforge_workloads.evaluate.passk import exact_interval, paired_rise, problem_pass_at_k, standard_error
from tpuforge_workloads.evaluate.records import EvalExample

# (model, record index) -> that record's samples in order, each with its verdict.
Checked = dict[tuple[str, int], list[dict[str, Any]]]
# What the report keeps of each sample.
SAMPLE_FIELDS = (
    "sample", "code", "passed", "failure", "verdict", "finishReason", "exitCode", "seconds", "stdout", "stderr",
    "simulator",
)  # fmt: skip
# A sample's failure that blames the problem, not the model.
BROKEN_PROBLEM = "task"
MODELS = ("adapter", "base")
# vLLM's finish_reason of an answer cut at max_tokens.
TRUNCATED_REASON = "length"


def _jsonl(path: str, what: str) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]
    except (storage.StorageError, ValueError) as e:
        raise EvalInputError(f"--{what} {path}: cannot be read ({type(e).__name__}: {e})") from e


def failure_of(checked: dict[str, Any]) -> str | None:
    """Why a checked sample failed (None: it passed), one of FAILURE_CATEGORIES. An answer vLLM cut at
    maxNewTokens is "truncated" whatever the checker said. Otherwise the verdict's own "failure"; a verdict
    without one (a checker from before the categories) is "timeout" when it timed out, else "error"."""
    if checked.get("finishReason") == TRUNCATED_REASON:
        return "truncated"
    if checked.get("passed"):
        return None
    failure = checked.get("failure")
    if failure in FAILURE_CATEGORIES:
        return str(failure)
    if failure is None and str(checked.get("verdict", "")).startswith("timed out"):
        return "timeout"
    return "error"


def _judged(sample: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """A sample with its verdict, its failure category set; a truncated answer fails, the checker's verdict
    kept in its text."""
    out = {**sample, **verdict}
    out["failure"] = failure_of(out)
    if out["failure"] == "truncated":
        out["passed"] = False
        out["verdict"] = f"truncated at maxNewTokens (the checker said: {verdict.get('verdict')})"
    return out


def checked_samples(cfg: EvalConfig, examples: list[EvalExample], samples_path: str, verdicts_path: str) -> Checked:
    """(model, record index) -> its samples in order, each with its verdict. Raises EvalInputError when the
    files do not cover exactly these records, n samples each, both models."""
    assert cfg.code is not None
    verdicts = {v["id"]: v for v in _jsonl(verdicts_path, "verdicts")}
    out: Checked = {}
    for s in _jsonl(samples_path, "samples"):
        v = verdicts.get(s["id"])
        if v is None:
            raise EvalInputError(
                f"--verdicts {verdicts_path}: no verdict for sample {s['id']}; the checker stopped early"
            )
        out.setdefault((s["model"], s["index"]), []).append(_judged(s, v))
    n = cfg.code.samples_per_problem
    for model in MODELS:
        for ex in examples:
            got = len(out.get((model, ex.index), []))
            if got != n:
                raise EvalInputError(
                    f"--samples {samples_path}: {got} samples of record {ex.index} for the {model}, not "
                    f"samplesPerProblem={n}: the samples were drawn with another config"
                )
    return out


def report_fields(checked: Checked, index: int) -> dict[str, Any]:
    """One record's pass@k fields in report.jsonl: passed counts and each sample with its verdict and output."""
    fields: dict[str, Any] = {}
    for model, prefix in (("adapter", ""), ("base", "base")):
        drawn = sorted(checked[(model, index)], key=lambda s: s["sample"])
        kept = [{k: s[k] for k in SAMPLE_FIELDS if k in s} for s in drawn]
        fields[f"{prefix}Passed" if prefix else "passed"] = sum(1 for s in drawn if s["passed"])
        fields[f"{prefix}Samples" if prefix else "samples"] = kept
    return fields


def broken_problems(examples: list[EvalExample], checked: Checked) -> list[int]:
    """The record indices of the problems the checker found broken (any sample of either model)."""
    return [
        ex.index for ex in examples
        if any(s["failure"] == BROKEN_PROBLEM for m in MODELS for s in checked[(m, ex.index)])
    ]  # fmt: skip


def _scored(examples: list[EvalExample], checked: Checked) -> list[EvalExample]:
    """The problems pass@k is computed over: all but the broken ones. Raises EvalInputError when none is left."""
    broken = set(broken_problems(examples, checked))
    kept = [ex for ex in examples if ex.index not in broken]
    if not kept:
        raise EvalInputError(
            f"every one of the {len(examples)} problems is broken for the checker (failure task: their reference "
            "does not compile with its simulator); see the report's stderr, and give the checker a newer simulator"
        )
    return kept


def _verdicts(examples: list[EvalExample], checked: Checked, model: str) -> list[list[bool]]:
    return [[bool(s["passed"]) for s in checked[(model, ex.index)]] for ex in examples]


def pass_metrics(
    cfg: EvalConfig, examples: list[EvalExample], checked: Checked
) -> tuple[dict[str, float], dict[str, float]]:
    """(adapter, base) pass@k for each k asked, the estimator averaged over the problems (broken ones out)."""
    assert cfg.code is not None
    kept = _scored(examples, checked)
    scores: dict[str, dict[str, float]] = {"adapter": {}, "base": {}}
    for model, into in scores.items():
        verdicts = _verdicts(kept, checked, model)
        for k in cfg.code.k:
            per = problem_pass_at_k(verdicts, k)
            into[pass_at_metric(k)] = sum(per) / len(per)
    return scores["adapter"], scores["base"]


def pass_intervals(
    cfg: EvalConfig, examples: list[EvalExample], checked: Checked
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(adapter, base) CONFIDENCE_LEVEL interval of each pass@k, {"low", "high", "method"}, bounds to 4
    decimals: the exact binomial interval over the problems (evaluate.passk.exact_interval), broken ones out."""
    assert cfg.code is not None
    kept = _scored(examples, checked)
    out: dict[str, dict[str, dict[str, Any]]] = {"adapter": {}, "base": {}}
    for model, into in out.items():
        verdicts = _verdicts(kept, checked, model)
        for k in cfg.code.k:
            low, high = exact_interval(problem_pass_at_k(verdicts, k), CONFIDENCE_LEVEL)
            into[pass_at_metric(k)] = {"low": round(low, 4), "high": round(high, 4), "method": INTERVAL_METHOD}
    return out["adapter"], out["base"]


def standard_errors(cfg: EvalConfig, examples: list[EvalExample], checked: Checked, model: str) -> dict[str, float]:
    """The standard error of `model`'s pass@k over the problems (broken ones out), to 4 decimals."""
    assert cfg.code is not None
    verdicts = _verdicts(_scored(examples, checked), checked, model)
    return {pass_at_metric(k): round(standard_error(problem_pass_at_k(verdicts, k)), 4) for k in cfg.code.k}


def rises(cfg: EvalConfig, examples: list[EvalExample], checked: Checked) -> dict[str, dict[str, Any]]:
    """Each pass@k's rise from the base to the adapter on the same problems (broken ones out), with its paired
    CONFIDENCE_LEVEL interval (evaluate.passk.paired_rise): exact (Newcombe's, with McNemar's p) where every
    problem's pass@k is 0 or 1 (one sample, or k = n), else the t interval over the per-problem differences.
    Two models' own intervals may overlap where the rise's excludes 0: this is the figure for "did it
    improve"."""
    assert cfg.code is not None
    kept = _scored(examples, checked)
    base, adapter = (_verdicts(kept, checked, model) for model in ("base", "adapter"))
    out: dict[str, dict[str, Any]] = {}
    for k in cfg.code.k:
        before, after = problem_pass_at_k(base, k), problem_pass_at_k(adapter, k)
        exact = all(v in (0.0, 1.0) for v in (*before, *after))
        r = paired_rise(before, after, CONFIDENCE_LEVEL, exact)
        out[pass_at_metric(k)] = {**r, "rise": round(r["rise"], 4), "interval": [round(v, 4) for v in r["interval"]]}
    return out


def sampling(cfg: EvalConfig) -> str:
    """How the samples were drawn, in words (status.evaluation.sampling)."""
    assert cfg.code is not None
    n, t = cfg.code.samples_per_problem, cfg.code.sampling_temperature
    if n == 1 and t == 0:
        return "greedy: 1 sample per problem at temperature 0"
    return f"{n} samples per problem at temperature {t:g}, topP {cfg.code.top_p:g}"


def failure_counts(checked: Checked, model: str) -> dict[str, int]:
    """How many of `model`'s samples failed in each category (every category, 0 included)."""
    counts = dict.fromkeys(FAILURE_CATEGORIES, 0)
    for (m, _), drawn in checked.items():
        if m == model:
            for s in drawn:
                if s["failure"] is not None:
                    counts[s["failure"]] += 1
    return counts
