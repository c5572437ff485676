"""pass@k from the checker's verdicts: evaluate.sample's samples joined with evaluate.check's verdicts, per
problem and model, into the report's fields, the metrics pass@1, pass@5, ... (base and adapter), their
confidence intervals and the count of failed samples by why they failed."""

from __future__ import annotations

import json
from typing import Any

from tpuforge.api.code_eval import BOOTSTRAP_RESAMPLES, CONFIDENCE_LEVEL, FAILURE_CATEGORIES, pass_at_metric
from tpuforge.api.configs import EvalConfig
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate.config import EvalInputError
from tpuforge_workloads.evaluate.passk import bootstrap_interval, problem_pass_at_k, resamples_of
from tpuforge_workloads.evaluate.records import EvalExample

# (model, record index) -> that record's samples in order, each with its verdict.
Checked = dict[tuple[str, int], list[dict[str, Any]]]
# What the report keeps of each sample.
SAMPLE_FIELDS = (
    "sample", "code", "passed", "failure", "verdict", "finishReason", "exitCode", "seconds", "stdout", "stderr",
)  # fmt: skip
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


def _verdicts(examples: list[EvalExample], checked: Checked, model: str) -> list[list[bool]]:
    return [[bool(s["passed"]) for s in checked[(model, ex.index)]] for ex in examples]


def pass_metrics(
    cfg: EvalConfig, examples: list[EvalExample], checked: Checked
) -> tuple[dict[str, float], dict[str, float]]:
    """(adapter, base) pass@k for each k asked, the estimator averaged over the records."""
    assert cfg.code is not None
    scores: dict[str, dict[str, float]] = {"adapter": {}, "base": {}}
    for model, into in scores.items():
        verdicts = _verdicts(examples, checked, model)
        for k in cfg.code.k:
            per = problem_pass_at_k(verdicts, k)
            into[pass_at_metric(k)] = sum(per) / len(per)
    return scores["adapter"], scores["base"]


def pass_intervals(
    cfg: EvalConfig, examples: list[EvalExample], checked: Checked
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(adapter, base) CONFIDENCE_LEVEL interval of each pass@k, {"low", "high"} to 4 decimals: a percentile
    bootstrap over the records, BOOTSTRAP_RESAMPLES draws seeded with code.seed, the same draws for every k and
    both models."""
    assert cfg.code is not None
    draws = resamples_of(len(examples), BOOTSTRAP_RESAMPLES, cfg.code.seed)
    out: dict[str, dict[str, dict[str, float]]] = {"adapter": {}, "base": {}}
    for model, into in out.items():
        verdicts = _verdicts(examples, checked, model)
        for k in cfg.code.k:
            low, high = bootstrap_interval(problem_pass_at_k(verdicts, k), draws, CONFIDENCE_LEVEL)
            into[pass_at_metric(k)] = {"low": round(low, 4), "high": round(high, 4)}
    return out["adapter"], out["base"]


def failure_counts(checked: Checked, model: str) -> dict[str, int]:
    """How many of `model`'s samples failed in each category (every category, 0 included)."""
    counts = dict.fromkeys(FAILURE_CATEGORIES, 0)
    for (m, _), drawn in checked.items():
        if m == model:
            for s in drawn:
                if s["failure"] is not None:
                    counts[s["failure"]] += 1
    return counts
