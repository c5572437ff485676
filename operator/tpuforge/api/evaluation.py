"""What an evaluation's scores mean: whether they meet spec.evaluation.thresholds, in one line a person reads."""

from __future__ import annotations

from dataclasses import dataclass

from tpuforge.api.code_eval import PASS_AT_PREFIX, pass_at_metric
from tpuforge.api.finetune import EvaluationSpec


def score(metric: str, value: float) -> str:
    """A score as reports show it: a fraction (exact match, pass@k) with two decimals, a loss to four digits."""
    return f"{value:.2f}" if metric == "exactMatch" or metric.startswith(PASS_AT_PREFIX) else f"{value:.4g}"


@dataclass(frozen=True)
class Check:
    """One threshold held against the adapter's score (None: the result lacks that metric)."""

    metric: str
    threshold_name: str
    threshold: float
    value: float | None
    passed: bool

    def __str__(self) -> str:
        limit = f"{self.threshold_name} {score(self.metric, self.threshold)}"
        if self.value is None:
            return f"{self.metric} missing from the result ({limit})"
        upper = self.threshold_name.startswith("max")
        sign = ("<=" if upper else ">=") if self.passed else (">" if upper else "<")
        return f"{self.metric} {score(self.metric, self.value)} {sign} {limit}"


def checks(spec: EvaluationSpec, metrics: dict[str, float]) -> list[Check]:
    """Each threshold set in `spec`, held against `metrics`; a threshold whose metric is missing fails."""
    out: list[Check] = []
    t = spec.thresholds
    if t.max_loss is not None:
        loss = metrics.get("loss")
        out.append(Check("loss", "maxLoss", t.max_loss, loss, loss is not None and loss <= t.max_loss))
    if t.min_exact_match is not None:
        em = metrics.get("exactMatch")
        out.append(
            Check("exactMatch", "minExactMatch", t.min_exact_match, em, em is not None and em >= t.min_exact_match)
        )
    for k, least in sorted(t.min_pass_at.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        name = pass_at_metric(int(k)) if k.isdigit() else f"{PASS_AT_PREFIX}{k}"
        got = metrics.get(name)
        out.append(Check(name, f"minPassAt.{k}", least, got, got is not None and got >= least))
    return out


def evaluation_verdict(spec: EvaluationSpec, metrics: dict[str, float]) -> tuple[bool, str]:
    """(passed, message): passed when every threshold set in `spec` is met by the adapter's `metrics`. The
    message names each threshold beside the value it was held to, what failed first, e.g.
    "exactMatch 0.20 < minExactMatch 0.50; loss 0.31 <= maxLoss 0.5"."""
    found = checks(spec, metrics)
    if not found:
        return True, "no thresholds set (spec.evaluation.thresholds), so it passes"
    ordered = [c for c in found if not c.passed] + [c for c in found if c.passed]
    return all(c.passed for c in found), "; ".join(map(str, ordered))
