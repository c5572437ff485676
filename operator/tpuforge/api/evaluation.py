"""What an evaluation's scores mean: whether they meet spec.evaluation.thresholds, in one line a person reads.

A pass@k threshold (minPassAt) is held against the low bound of the score's confidence interval when the result
has one (status.evaluation.intervals): the adapter is promoted only when the evaluation is confident, at
CONFIDENCE_LEVEL, that its pass@k reaches the threshold, not when a lucky draw of samples or problems puts the
estimate above it. A result without an interval is held by its estimate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpuforge.api.code_eval import CONFIDENCE_LEVEL, PASS_AT_PREFIX, ConfidenceInterval, pass_at_metric
from tpuforge.api.finetune import PREFERENCE_ACCURACY, EvaluationSpec


def score(metric: str, value: float) -> str:
    """A score as reports show it: a fraction (exact match, pass@k) with two decimals, a loss to four digits."""
    fraction = metric in ("exactMatch", PREFERENCE_ACCURACY) or metric.startswith(PASS_AT_PREFIX)
    return f"{value:.2f}" if fraction else f"{value:.4g}"


@dataclass(frozen=True)
class Check:
    """One threshold held against the adapter's score (None: the result lacks that metric). With an interval
    (`low`, `high`), the low bound is what the threshold is held against."""

    metric: str
    threshold_name: str
    threshold: float
    value: float | None
    passed: bool
    low: float | None = None
    high: float | None = None
    method: str | None = None  # the interval's

    @property
    def held(self) -> float | None:
        """The number compared with the threshold: the interval's low bound, else the score."""
        return self.low if self.low is not None else self.value

    def __str__(self) -> str:
        limit = f"{self.threshold_name} {score(self.metric, self.threshold)}"
        if self.value is None:
            return f"{self.metric} missing from the result ({limit})"
        upper = self.threshold_name.startswith("max")
        sign = ("<=" if upper else ">=") if self.passed else (">" if upper else "<")
        value = score(self.metric, self.value)
        if self.low is None or self.high is None:
            return f"{self.metric} {value} {sign} {limit}"
        low, high = score(self.metric, self.low), score(self.metric, self.high)
        level = f"{CONFIDENCE_LEVEL:.0%}" + (f" {self.method}" if self.method else "")
        return f"{self.metric} {value} ({level} CI {low}-{high}): low {low} {sign} {limit}"


def checks(
    spec: EvaluationSpec, metrics: dict[str, float], intervals: Mapping[str, ConfidenceInterval] | None = None
) -> list[Check]:
    """Each threshold set in `spec`, held against `metrics` (a pass@k against its interval's low bound when
    `intervals` has one); a threshold whose metric is missing fails."""
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
    if t.min_preference_accuracy is not None:
        least, got = t.min_preference_accuracy, metrics.get(PREFERENCE_ACCURACY)
        passed = got is not None and got >= least
        out.append(Check(PREFERENCE_ACCURACY, "minPreferenceAccuracy", least, got, passed))
    for k, least in sorted(t.min_pass_at.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        name = pass_at_metric(int(k)) if k.isdigit() else f"{PASS_AT_PREFIX}{k}"
        got = metrics.get(name)
        ci = (intervals or {}).get(name) if got is not None else None
        held = ci.low if ci is not None else got
        low, high = (ci.low, ci.high) if ci is not None else (None, None)
        method = ci.method if ci is not None else None
        out.append(Check(name, f"minPassAt.{k}", least, got, held is not None and held >= least, low, high, method))
    return out


def evaluation_verdict(
    spec: EvaluationSpec, metrics: dict[str, float], intervals: Mapping[str, ConfidenceInterval] | None = None
) -> tuple[bool, str]:
    """(passed, message): passed when every threshold set in `spec` is met by the adapter's `metrics` (a pass@k
    by its interval's low bound, when `intervals` has one). The message names each threshold beside the value
    it was held to, what failed first, e.g. "exactMatch 0.20 < minExactMatch 0.50; loss 0.31 <= maxLoss 0.5",
    "pass@1 0.70 (95% clopper-pearson CI 0.55-0.82): low 0.55 < minPassAt.1 0.60"."""
    found = checks(spec, metrics, intervals)
    if not found:
        return True, "no thresholds set (spec.evaluation.thresholds), so it passes"
    ordered = [c for c in found if not c.passed] + [c for c in found if c.passed]
    return all(c.passed for c in found), "; ".join(map(str, ordered))
