"""Kueue (spec.queueName): every Job or JobSet of the job carries the LocalQueue's label, Kueue's webhook
creates it suspended, and Kueue admits it (clears `suspend`) once the ClusterQueue's quota has room. The
operator never touches `suspend`: Kueue owns it. While a Job waits, the job is Queued, with Kueue's reason and
message in the Queued condition; once admitted, it is back in the stage it waited in.

A Queued job's stage is stored in status.queuedStage while it waits; for one queued by an operator that did
not store it, it is told by that stage's own condition, which queueing leaves as it was.
"""

from __future__ import annotations

from tpuforge.api import FineTunePhase
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune.children import JobView
from tpuforge.controllers.finetune.context import Base, Ctx
from tpuforge.controllers.finetune.transitions import to_admitted, to_queued
from tpuforge.manifests.finetune_common import (
    COMPONENT_EVALUATOR,
    COMPONENT_MERGER,
    COMPONENT_PREFLIGHT,
    COMPONENT_TRAINER,
)

# What each Job does, as the Queued condition and Events name it.
ROLES = {
    COMPONENT_PREFLIGHT: "preflight",
    COMPONENT_TRAINER: "training",
    COMPONENT_MERGER: "merge",
    COMPONENT_EVALUATOR: "evaluation",
}


# The stage whose step runs each Job (a training Job is created, and waits, while the job is Pending).
STAGES = {
    COMPONENT_PREFLIGHT: FineTunePhase.PREFLIGHT,
    COMPONENT_TRAINER: FineTunePhase.PENDING,
    COMPONENT_MERGER: FineTunePhase.MERGING,
    COMPONENT_EVALUATOR: FineTunePhase.EVALUATING,
}


def role(job: JobView) -> str:
    return ROLES.get(job.component, job.component)


def described(job: JobView) -> str:
    """e.g. the training JobSet gemma-train-0."""
    return f"the {role(job)} {job.kind} {job.name}"


def stage(b: Base) -> FineTunePhase | None:
    """The phase whose step runs: the job's own, or while it is Queued, the one its Job waits in."""
    return queued_stage(b) if b.st.phase == FineTunePhase.QUEUED else b.st.phase


def queued_stage(b: Base) -> FineTunePhase:
    """The stage a Queued job's Job waits in: the one stored when it was queued, else (queued by an operator
    that did not store it) the one whose condition says it is under way."""
    if b.st.queued_stage is not None:
        return b.st.queued_stage
    if b.has_condition(c.EVALUATED, "False", c.EVALUATING):
        return FineTunePhase.EVALUATING
    if b.has_condition(c.MERGED, "False", c.MERGING) or b.has_condition(c.MERGED, "False", c.EXPORTING):
        return FineTunePhase.MERGING
    return FineTunePhase.PREFLIGHT if b.st.attempt is None else FineTunePhase.PENDING


def queue_or_admit(ctx: Ctx, job: JobView) -> bool:
    """Move the job into Queued while Kueue holds `job` (suspended, with a Workload it has not admitted and has
    said why), and back to its stage once Kueue lets it go; True while it is held. Until Kueue has looked at a
    new Workload (it admits one that fits within moments) the job stays in its stage."""
    workload = ctx.workload_of(job)
    held = job.suspended and workload is not None and not workload.admitted
    if held and workload is not None and (workload.reason or ctx.st.phase == FineTunePhase.QUEUED):
        to_queued(ctx, role(job), described(job), workload, STAGES.get(job.component) or queued_stage(ctx))
        return True
    if ctx.st.phase == FineTunePhase.QUEUED and not held:
        queue = workload.queue if workload is not None else ctx.spec.queue_name or ""
        to_admitted(ctx, role(job), described(job), queue, queued_stage(ctx))
    return False


def settle(b: Base) -> None:
    """The Queued condition is True only while the job is Queued: one that left the queue otherwise than by
    admission (suspended, failed) says so."""
    if b.st.phase != FineTunePhase.QUEUED and b.has_condition(c.QUEUED):
        b.condition(c.QUEUED, "False", c.NOT_QUEUED, c.not_queued(str(b.st.phase)))
