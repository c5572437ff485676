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

from tpuforge.api import PreflightStatus, cost, resolved_remat
from tpuforge.api import finetune_reasons as c
from tpuforge.api.constants import EXIT_DOES_NOT_FIT
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import onepod as onepod
from tpuforge.controllers.finetune.children import JobView, PodView
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.outcomes import FITS, Outcome
from tpuforge.controllers.finetune.records import termination_record
from tpuforge.controllers.finetune.transitions import to_failed, to_preflight
from tpuforge.manifests import preflight as mp

# The report's keys that status.preflight keeps (the rest stay in the pod's log).
_STATUS_KEYS = (
    "slice",
    "topology",
    "fits",
    "lowerBound",
    "remat",
    "hbmPerChipGiB",
    "hbmCapacityGiB",
    "buildGiB",
    "tflopsPerStep",
    "assumedMFU",
    "mfuSource",
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


def step(ctx: Ctx) -> Outcome | None:
    """Preflight: create the Job, follow its pod to the report, and act on it (FITS: the first attempt
    starts)."""
    at = onepod.follow(ctx, mp.preflight_job_name(ctx.o.name), result=_reported)
    if at.state == "absent":
        if not ctx.has_condition(c.PREFLIGHT, "False", c.COMPILING):
            to_preflight(ctx)
        ctx.plan.create.extend(mp.preflight_objects(ctx.owner, ctx.spec))
    elif at.state == "done":
        assert at.job is not None and at.pod is not None
        return finished(ctx, at.job, at.pod)
    elif at.state == "rejected":
        failed(ctx, at.reason, c.preflight_rejected(_name(at), at.detail))
    elif at.state == "failed":
        tries = "at once" if at.at_once else f"after {mp.PREFLIGHT_BACKOFF_LIMIT + 1} tries"
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_failed(_name(at), tries, at.detail))
    elif at.state == "missing":
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_result_missing(_name(at)))
    elif at.state == "running" and at.pod is not None:
        ctx.condition(c.PREFLIGHT, "False", c.COMPILING, c.preflight_on(at.pod.name, at.pod.node_name))
    return None


def _reported(pods: list[PodView]) -> PodView | None:
    """The pod that wrote the report: one that succeeded, or one that ended saying the step does not fit."""
    return next((p for p in pods if p.phase == "Succeeded"), None) or next(
        (p for p in pods if p.phase == "Failed" and p.terminated and p.terminated.exit_code == EXIT_DOES_NOT_FIT),
        None,
    )


def _name(at: onepod.Standing) -> str:
    return at.job.name if at.job is not None else ""


def report(pod: PodView) -> PreflightStatus:
    """The report the preflight pod wrote as its termination message (the JSON of `--json`). Raises ValueError,
    saying what is wrong, when it is not that."""
    found, raw = termination_record(
        pod,
        PreflightStatus,
        _STATUS_KEYS,
        what="report",
        ended="ended",
        needs="`fits`",
        has=lambda raw: isinstance(raw.get("fits"), bool),
    )
    return found.model_copy(update={"message": str(raw.get("headline") or ("fits" if found.fits else "does not fit"))})


def finished(ctx: Ctx, job: JobView, pod: PodView) -> Outcome | None:
    """The report is in: keep it; start training if the step fits, else fail the job with the fixes."""
    try:
        found = report(pod)
    except ValueError as exc:
        failed(ctx, c.PREFLIGHT_FAILED, c.preflight_unreadable(job.name, exc))
        return None
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
        resolved_remat(ctx.spec.training, found),  # as the attempts will train
    )
    if found.fits:
        ctx.condition(c.PREFLIGHT, "True", c.FITS, c.preflight_fits(headline, found.topology, found.compile_seconds))
        ctx.event("Normal", ev.PREFLIGHT, short)
        return FITS  # the first attempt starts in this same reconcile
    message = c.does_not_fit(headline, found.fixes)
    ctx.condition(c.PREFLIGHT, "False", c.DOES_NOT_FIT, message)
    to_failed(ctx, "does-not-fit", message, short)
    return None


def failed(ctx: Ctx, reason: str, message: str) -> None:
    """No verdict from the preflight: the Preflight condition and the job fail with `reason`."""
    ctx.condition(c.PREFLIGHT, "False", c.PREFLIGHT_FAILED, message)
    to_failed(ctx, "preflight-failed", message, ev.preflight_failed(), reason)
