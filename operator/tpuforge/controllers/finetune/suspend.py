"""Suspend (spec.runPolicy.suspend): the training (or preflight) Job is removed and the checkpoints stay;
clearing the flag resumes the job as its next attempt, from the last checkpoint, with the deadline counted
afresh (or runs the preflight first, when it had not passed)."""

from __future__ import annotations

from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.outcomes import RESUME, RESUME_TO_PREFLIGHT, Outcome
from tpuforge.controllers.finetune.transitions import to_resumed, to_suspended


def stop(ctx: Ctx) -> None:
    """The flag is set on a pending or training job: stop its attempt (the machine stops a preflight)."""
    n = ctx.st.attempt
    job = ctx.train_job(n)
    if job is not None:
        ctx.delete_job(job)
    ctx.close_attempt(n, "Suspended", c.SUSPENDED_REASON, c.SUSPEND_SET, None)
    to_suspended(ctx, n)


def step(ctx: Ctx, preflight_needed: bool) -> Outcome | None:
    """Suspended: keep the attempt's Job away while the flag stays; resume once it is cleared (as the next
    attempt, or into the preflight when it had not passed)."""
    st = ctx.st
    if ctx.spec.run_policy.suspend:
        job = ctx.train_job(st.attempt)
        if job is not None:
            ctx.delete_job(job)
        return None
    if preflight_needed:  # suspended before its preflight passed: that comes first
        ctx.condition(c.SUSPENDED, "False", c.RESUMED, c.RESUMED_TO_PREFLIGHT)
        return RESUME_TO_PREFLIGHT
    to_resumed(ctx, 0 if st.attempt is None else st.attempt + 1)
    return RESUME
