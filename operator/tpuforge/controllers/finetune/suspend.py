"""Suspend (spec.runPolicy.suspend): the training (or preflight) Job is removed and the checkpoints stay;
clearing the flag resumes the job as its next attempt, from the last checkpoint, with the deadline counted
afresh (or runs the preflight first, when it had not passed)."""

from __future__ import annotations

from tpuforge.controllers.finetune import attempts as attempts
from tpuforge.controllers.finetune import conditions as c
from tpuforge.controllers.finetune import preflight as preflight
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.transitions import to_resumed, to_suspended


def stop(ctx: Ctx) -> None:
    """The flag is set on a pending or training job: stop its attempt."""
    n = ctx.st.attempt
    job = ctx.train_job(n)
    if job is not None:
        ctx.delete_job(job)
    preflight.stop(ctx, c.SUSPENDED_REASON, c.SUSPEND_SET)
    ctx.close_attempt(n, "Suspended", c.SUSPENDED_REASON, c.SUSPEND_SET, None)
    to_suspended(ctx, n)


def step(ctx: Ctx) -> None:
    """Suspended: keep the attempt's Job away while the flag stays; resume once it is cleared."""
    st = ctx.st
    if ctx.spec.run_policy.suspend:
        job = ctx.train_job(st.attempt)
        if job is not None:
            ctx.delete_job(job)
        return
    if preflight.needed(ctx):  # suspended before its preflight passed: that comes first
        ctx.condition(c.SUSPENDED, "False", c.RESUMED, c.RESUMED_TO_PREFLIGHT)
        preflight.step(ctx)
        return
    n = 0 if st.attempt is None else st.attempt + 1
    to_resumed(ctx, n)
    attempts.create(ctx, n)
