"""pass@k from the checker's verdicts: evaluate.sample's samples joined with evaluate.check's verdicts, per
problem and model, into the report's fields and the metrics pass@1, pass@5, ... (base and adapter)."""

from __future__ import annotations

import json
from typing import Any

from tpuforge.api.code_eval import pass_at_metric
from tpuforge.api.configs import EvalConfig
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate.config import EvalInputError
from tpuforge_workloads.evaluate.passk import mean_pass_at_k
from tpuforge_workloads.evaluate.records import EvalExample

# (model, record index) -> that record's samples in order, each with its verdict.
Checked = dict[tuple[str, int], list[dict[str, Any]]]
# What the report keeps of each sample.
SAMPLE_FIELDS = ("sample", "code", "passed", "verdict", "exitCode", "seconds", "stdout", "stderr")


def _jsonl(path: str, what: str) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]
    except (storage.StorageError, ValueError) as e:
        raise EvalInputError(f"--{what} {path}: cannot be read ({type(e).__name__}: {e})") from e


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
        out.setdefault((s["model"], s["index"]), []).append({**s, **v})
    n = cfg.code.samples_per_problem
    for model in ("adapter", "base"):
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


def pass_metrics(
    cfg: EvalConfig, examples: list[EvalExample], checked: Checked
) -> tuple[dict[str, float], dict[str, float]]:
    """(adapter, base) pass@k for each k asked, the estimator averaged over the records."""
    assert cfg.code is not None
    scores: dict[str, dict[str, float]] = {"adapter": {}, "base": {}}
    for model, into in scores.items():
        verdicts = [[s["passed"] for s in checked[(model, ex.index)]] for ex in examples]
        for k in cfg.code.k:
            into[pass_at_metric(k)] = mean_pass_at_k(verdicts, k)
    return scores["adapter"], scores["base"]
