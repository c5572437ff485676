"""The FineTuneJob's policies, each applied to whatever phase the job is in: the active deadline
(spec.runPolicy.activeDeadlineSeconds), the TTL after it finished (ttlSecondsAfterFinished), and the status
derived from the rest (percent, ETA, TPU hours and cost; before training, the preflight's estimates).
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import ValidationError

from tpuforge.api import (
    AttemptStatus,
    Cost,
    FineTuneJobSpec,
    FineTuneJobStatus,
    FineTunePhase,
    Progress,
    RunPolicy,
    cost,
    display,
    tpu_slice,
)
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import evaluation as evaluation
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.context import Base, Ctx, attempt_entry, parse_time
from tpuforge.controllers.finetune.transitions import to_failed
from tpuforge.manifests.finetune_training import trainer_grace_seconds

TPU_HOURS_DIGITS = 3


# --- Deadline ---------------------------------------------------------------------------------------------------


def end_past_deadline(ctx: Ctx) -> bool:
    """Past spec.runPolicy.activeDeadlineSeconds (counted from the start or the last resume), end the job
    (edge deadline-exceeded), or while it evaluates, the evaluation (the job keeps its outputs): True when it
    did."""
    limit = ctx.spec.run_policy.active_deadline_seconds
    if limit is None or ctx.st.start_time is None or not _deadline_applies(ctx):
        return False
    ran = (ctx.now - parse_time(ctx.st.start_time)).total_seconds()
    if ran < limit:
        return False
    if evaluation.past_deadline(ctx, ran, limit):
        return True  # training is over: only the evaluation ends, the outputs stay
    message = c.deadline(ran, limit)
    ctx.close_attempt(ctx.st.attempt, "Failed", c.DEADLINE_EXCEEDED, message, None)
    to_failed(ctx, "deadline-exceeded", message, ev.deadline(display.duration(ran)))
    return True


def _deadline_applies(ctx: Ctx) -> bool:
    """Not while Suspended or ended, nor to an evaluation run again after the end (spec.evaluation.rerun), which
    spec.evaluation.activeDeadlineSeconds alone bounds."""
    if ctx.st.phase in (*c.TERMINAL, FineTunePhase.SUSPENDED):
        return False
    return not (ctx.spec.evaluation is not None and ctx.spec.evaluation.rerun and evaluation.under_way(ctx))


def wake_at_deadline(ctx: Ctx) -> None:
    limit = ctx.spec.run_policy.active_deadline_seconds
    if limit is None or ctx.st.start_time is None or not _deadline_applies(ctx):
        return
    ctx.plan.requeue(limit - (ctx.now - parse_time(ctx.st.start_time)).total_seconds())


# --- TTL after finishing ----------------------------------------------------------------------------------------


def expire(b: Base) -> None:
    """ttlSecondsAfterFinished: the operator deletes the finished object (children go with it)."""
    try:
        policy = RunPolicy.model_validate(b.o.spec.get("runPolicy") or {})
    except ValidationError:
        return
    ttl = policy.ttl_seconds_after_finished
    if ttl is None or b.st.completion_time is None:
        return
    left = ttl - (b.now - parse_time(b.st.completion_time)).total_seconds()
    if left <= 0:
        b.plan.delete_self = True
    else:
        b.plan.requeue(left)


# --- Derived status ---------------------------------------------------------------------------------------------


def tpu_hours(attempts: list[AttemptStatus], now: datetime) -> float:
    """Slice-hours held by the trainer pods: each attempt from its start to its end (or now, if running)."""
    seconds = 0.0
    for a in attempts:
        if a.start_time is None:
            continue
        end = parse_time(a.end_time) if a.end_time else now
        seconds += max((end - parse_time(a.start_time)).total_seconds(), 0.0)
    return seconds / 3600.0


def eta_seconds(status: FineTuneJobStatus) -> int | None:
    """Time left at the current attempt's rate: steps done since it resumed over the time it has run."""
    prog = status.progress
    if prog is None or prog.step is None or not prog.total_steps or prog.updated_at is None:
        return None
    current = attempt_entry(status, status.attempt)
    if current is None or current.start_time is None:
        return None
    done = prog.step - (current.start_step or 0)
    elapsed = (parse_time(prog.updated_at) - parse_time(current.start_time)).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    return max(math.ceil((prog.total_steps - prog.step) * elapsed / done), 0)


def checkpoint_grace(b: Base, spec: FineTuneJobSpec) -> None:
    """CheckpointWithinGrace: whether the last checkpoint's save (the trainer's lastCheckpoint) took no longer
    than the grace period a training pod gets after SIGTERM (tpu.spotGraceSeconds on Spot)."""
    last = b.st.progress.last_checkpoint if b.st.progress is not None else None
    if last is None:
        return
    grace = trainer_grace_seconds(spec)
    fits = last.seconds <= grace
    b.condition(
        c.CHECKPOINT_WITHIN_GRACE,
        "True" if fits else "False",
        c.SAVE_FITS_GRACE if fits else c.SAVE_EXCEEDS_GRACE,
        c.checkpoint_grace(last.step, last.seconds, grace, spec.checkpoint.every_steps),
    )


def derive(b: Base, spec: FineTuneJobSpec | None) -> None:
    """percent, etaSeconds and cost, from the trainer's progress and the attempts' TPU time; whether the
    checkpoints fit the grace period."""
    st = b.st
    if spec is not None:
        checkpoint_grace(b, spec)
    if st.progress is not None and st.progress.step is not None and st.progress.total_steps:
        done = min(st.progress.step, st.progress.total_steps) / st.progress.total_steps
        # The trainer's ETA comes from its recent rate; the average since the attempt began (model
        # loading and compilation included) only stands in for a trainer that has not given one.
        eta = st.progress.eta_seconds
        if st.phase == FineTunePhase.TRAINING and eta is None:
            eta = eta_seconds(st)
        if st.phase in (FineTunePhase.MERGING, FineTunePhase.EVALUATING, FineTunePhase.SUCCEEDED):
            eta = 0
        if st.phase == FineTunePhase.QUEUED:
            eta = None  # nothing runs, and how long Kueue holds the Job nobody knows: no countdown
        st.progress = st.progress.model_copy(update={"percent": round(100 * done, 1), "eta_seconds": eta}).displayed()
    slice_id = spec.tpu.slice if spec is not None else b.o.spec.get("tpu", {}).get("slice")
    if st.attempts and slice_id is not None:
        try:
            spot = spec.tpu.spot if spec is not None else bool(b.o.spec.get("tpu", {}).get("spot"))
            price = cost.tpu_usd_per_hour(tpu_slice(slice_id), spot)
        except KeyError:
            return
        hours = round(tpu_hours(st.attempts, b.now), TPU_HOURS_DIGITS)
        st.cost = Cost.estimate(hours, price)
    preflight_estimates(st)


def preflight_estimates(st: FineTuneJobStatus) -> None:
    """Until a trainer has run, the ETA and Cost columns show the preflight's estimates of the whole run,
    marked as such (~2h10m (est), ~$41.20 (est)), queued in Kueue or not; the numbers stay in status.preflight."""
    pf = st.preflight
    reported = st.progress is not None and st.progress.step is not None
    started = any(a.start_time for a in st.attempts) or reported
    before_training = (FineTunePhase.PREFLIGHT, FineTunePhase.PENDING, FineTunePhase.QUEUED)
    if pf is None or not pf.fits or started or st.phase not in before_training:
        if st.progress is not None and not reported and st.progress.eta_display is not None:
            st.progress = st.progress.model_copy(update={"eta_display": None})  # the estimate's time is over
        return
    if pf.estimated_seconds is not None:
        eta = display.estimate(display.duration(pf.estimated_seconds))
        st.progress = (st.progress or Progress()).model_copy(update={"eta_display": eta})
    if pf.estimated_usd is not None:
        usd = display.estimate(display.usd(pf.estimated_usd))
        st.cost = (st.cost or Cost()).model_copy(update={"estimated_usd_display": usd})
