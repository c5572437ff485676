"""The preflight (spec.preflight): before the first TPU attempt, one CPU Job compiles the job's train step for
its slice's TPU topology and reports HBM per chip, speed and cost (as its termination message). Then:

    fits                 -> status.preflight, Preflight True (Fits), and the first attempt starts at once
    does not fit (exit 3) -> status.preflight, and the job fails (DoesNotFit) with the fixes; no TPU was used
    config refused (exit 2) -> the job fails (InvalidConfig), as a trainer's refusal would
    anything else        -> the Job controller retries the pod (backoffLimit); once it gives up, the job
                            fails (PreflightFailed) with the last pod's error

Preflight True is stored in the status, so an operator that restarts never compiles again for the same job.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from tpuforge.api import PreflightStatus, cost
from tpuforge.api.constants import EXIT_DOES_NOT_FIT, TERMINATION_LOG
from tpuforge.controllers.finetune import attempts as attempts
from tpuforge.controllers.finetune import conditions as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune.children import JobView, PodView, clip, pod_ending
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.transitions import to_failed, to_preflight
from tpuforge.manifests import preflight as mp

# The report's keys that status.preflight keeps (the rest stay in the pod's log).
_STATUS_KEYS = (
    "slice",
    "topology",
    "fits",
    "lowerBound",
    "hbmPerChipGiB",
    "hbmCapacityGiB",
    "tflopsPerStep",
    "assumedMFU",
    "estimatedTokensPerSecond",
    "estimatedSeconds",
    "estimatedUSD",
    "totalSteps",
    "compileSeconds",
    "fixes",
)


def needed(ctx: Ctx) -> bool:
    """The preflight runs (or is running) for this job: asked for, not passed yet, and no attempt started."""
    return ctx.spec.preflight.enabled and ctx.st.attempt is None and not ctx.has_condition(c.PREFLIGHT, "True")


def stop(ctx: Ctx, reason: str = c.PREFLIGHT_SKIPPED, message: str = c.PREFLIGHT_SWITCHED_OFF) -> None:
    """A preflight still running that is no longer wanted (switched off, or the job suspended) is removed."""
    job = ctx.job(mp.preflight_job_name(ctx.o.name))
    if job is not None and ctx.live(job):
        ctx.delete_job(job)
        ctx.condition(c.PREFLIGHT, "False", reason, message)


def step(ctx: Ctx) -> None:
    """Preflight: create the Job, follow its pod to the report, and act on it."""
    job = ctx.job(mp.preflight_job_name(ctx.o.name))
    if job is None:
        if not ctx.has_condition(c.PREFLIGHT, "False", c.COMPILING):
            to_preflight(ctx)
        ctx.plan.create.extend(mp.preflight_objects(ctx.owner, ctx.spec))
        return
    if job.deleting:
        return  # someone removed it: it is recreated once it is gone
    pods = ctx.pods_of(job)
    reported = next((p for p in pods if p.phase == "Succeeded"), None) or next(
        (p for p in pods if p.phase == "Failed" and p.terminated and p.terminated.exit_code == EXIT_DOES_NOT_FIT),
        None,
    )
    if reported is not None:
        finished(ctx, job, reported)
        return
    failures = [e for e in (pod_ending(p) for p in pods) if e is not None and e.outcome == "Failed"]
    rejected = next((e for e in failures if e.permanent), None)
    if rejected is not None:
        failed(ctx, rejected.reason, c.preflight_rejected(job.name, rejected.message))
    elif job.failed:
        detail = failures[-1].message if failures else job.failure
        tries = (
            "at once" if job.failure.startswith("PodFailurePolicy") else f"after {mp.PREFLIGHT_BACKOFF_LIMIT + 1} tries"
        )
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_failed(job.name, tries, detail))
    elif job.complete and not any(not p.terminal for p in pods):
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_result_missing(job.name))
    elif not queue.waiting(ctx, job):
        running = next((p for p in pods if p.phase == "Running" and not p.deleting), None)
        if running is not None:
            ctx.condition(c.PREFLIGHT, "False", c.COMPILING, c.preflight_on(running.name, running.node_name))


def report(pod: PodView) -> PreflightStatus:
    """The report the preflight pod wrote as its termination message (the JSON of `--json`). Raises ValueError,
    saying what is wrong, when it is not that."""
    text = pod.terminated.message.strip() if pod.terminated else ""
    if not text:
        raise ValueError(f"pod {pod.name} ended without writing its report to {TERMINATION_LOG}")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"pod {pod.name} wrote a report that is not JSON ({exc}): {clip(text, 200)}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("fits"), bool):
        raise ValueError(f"pod {pod.name} wrote a report without `fits`: {clip(text, 200)}")
    try:
        found = PreflightStatus.model_validate({k: raw[k] for k in _STATUS_KEYS if raw.get(k) is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"pod {pod.name} wrote an unreadable report ({first['loc'][0]}: {first['msg']})") from None
    return found.model_copy(update={"message": str(raw.get("headline") or ("fits" if found.fits else "does not fit"))})


def finished(ctx: Ctx, job: JobView, pod: PodView) -> None:
    """The report is in: keep it; start training if the step fits, else fail the job with the fixes."""
    try:
        found = report(pod)
    except ValueError as exc:
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_unreadable(job.name, exc))
        return
    # The report prices the train steps; the status holds the whole job's estimate (Spot where the job is).
    found = cost.with_run_cost(found, ctx.spec)
    ctx.st.preflight = found
    headline = found.message or ""
    short = ev.preflight_result(
        headline,
        bool(found.fits),
        found.hbm_per_chip_gib or 0.0,
        found.hbm_capacity_gib or 0.0,
        found.estimated_tokens_per_second or 0.0,
    )
    if found.fits:
        ctx.condition(c.PREFLIGHT, "True", c.FITS, c.preflight_fits(headline, found.topology, found.compile_seconds))
        ctx.event("Normal", ev.PREFLIGHT, short)
        attempts.step(ctx)  # the first attempt, in this same reconcile
        return
    message = c.does_not_fit(headline, found.fixes)
    ctx.condition(c.PREFLIGHT, "False", c.DOES_NOT_FIT, message)
    to_failed(ctx, c.DOES_NOT_FIT, message, short)


def failed(ctx: Ctx, reason: str, message: str) -> None:
    """No verdict from the preflight: the Preflight condition and the job fail with `reason`."""
    ctx.condition(c.PREFLIGHT, "False", c.PREFLIGHT_FAILED, message)
    to_failed(ctx, reason, message, ev.preflight_failed())
