"""What a pod wrote as its termination message: the preflight's report, the evaluation's scores, a finished
trainer's result. One parser (`termination_record`) reads the JSON records, so each says what is wrong the
same way."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tpuforge.api import EvaluationStatus, TrainResult
from tpuforge.api.constants import TERMINATION_LOG
from tpuforge.controllers.finetune.children import PodView, clip, host_order

M = TypeVar("M", bound=BaseModel)
Check = Callable[[dict[str, Any]], bool]

# What the `score` container's result carries into status.evaluation.
RESULT_KEYS = (
    "metrics",
    "baseMetrics",
    "intervals",
    "baseIntervals",
    "failures",
    "baseFailures",
    "standardErrors",
    "sampling",
    "excludedProblems",
    "examples",
    "reportUri",
)


def termination_record(
    pod: PodView, model: type[M], keys: tuple[str, ...], *, what: str, ended: str, needs: str, has: Check
) -> tuple[M, dict[str, Any]]:
    """The JSON record a one-pod Job's pod wrote as its termination message (the preflight's report, the
    evaluation's result), as `model` from its `keys`, with the raw record. Raises ValueError, saying what is
    wrong, when the message is not that: empty, not JSON, without what `has` checks (`needs` names it), or
    unreadable as `model`."""
    text = pod.terminated.message.strip() if pod.terminated else ""
    if not text:
        raise ValueError(f"pod {pod.name} {ended} without writing its {what} to {TERMINATION_LOG}")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"pod {pod.name} wrote a {what} that is not JSON ({exc}): {clip(text, 200)}") from None
    if not isinstance(raw, dict) or not has(raw):
        raise ValueError(f"pod {pod.name} wrote a {what} without {needs}: {clip(text, 200)}")
    try:
        found = model.model_validate({k: raw[k] for k in keys if raw.get(k) is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"pod {pod.name} wrote an unreadable {what} ({where}: {first['msg']})") from None
    return found, raw


def eval_result(pod: PodView) -> EvaluationStatus:
    """The scores an evaluation pod that succeeded wrote as its `score` container's termination message:
    {"metrics": {...}, "baseMetrics": {...}, "examples": n, "reportUri": "..."}, with passAtK also "intervals",
    "baseIntervals", "failures", "baseFailures", "standardErrors", "sampling" and "excludedProblems". Raises
    ValueError, saying what is wrong, when the message is not that."""
    result, _ = termination_record(
        pod,
        EvaluationStatus,
        RESULT_KEYS,
        what="result",
        ended="succeeded",
        needs="metrics",
        has=lambda raw: isinstance(raw.get("metrics"), dict) and bool(raw["metrics"]),
    )
    return result


def train_result(pods: list[PodView]) -> TrainResult | None:
    """What a finished trainer reported in its termination message (a TrainResult: the last step, the best
    evaluated one, early stopping): the first host's that reads as one. None where no pod holds one (the pods are
    gone, or an older trainer wrote words only)."""
    for pod in sorted(pods, key=host_order):
        text = pod.terminated.message.strip() if pod.terminated and pod.phase == "Succeeded" else ""
        if text.startswith("{"):
            try:
                return TrainResult.model_validate_json(text)
            except ValidationError:
                continue
    return None
