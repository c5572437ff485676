"""The FineTuneJob decisions: from what is observed (the object and its children) to the status it should
have and the actions that get there. Pure: no I/O, and `now` is passed in.

Level-based and idempotent: every decision is a function of the stored status and the current attempt's
children, and writes absolute values (attempt n, failures k), never increments of what was read. Running it
twice, or on a stale view, gives the same result; the status patch carries the resourceVersion it was
computed from, so a stale plan is refused by the apiserver rather than applied.

Where each decision lives (one module per phase, each a handful of functions over a small context):

    finetune_context      Observed, Plan, and the context the decisions share (Base; Ctx adds the spec)
    finetune_spec         the spec a job runs with: invalid specs, frozen fields after the start
    finetune_preflight    Preflight: the step compiled for the slice on a CPU node before the first attempt
    finetune_attempts     Pending and Training: create, follow and end attempts; a preemption becomes a
                          resume in `preempted`, a failure a retry (or the end) in `failed`
    finetune_children     what the children say, and how an attempt ended (`attempt_end`, beside `pod_ending`)
    finetune_suspend      Suspended, and back
    finetune_queue        Queued: a Job that Kueue holds (spec.queueName), and back to its stage
    finetune_merge        Merging
    finetune_evaluation   Evaluating
    finetune_policies     the deadline, the TTL after finishing, and the derived status (percent, ETA, cost)
    finetune_transitions  every phase change, with its condition and Event
    finetune_conditions   condition types, reasons and messages; finetune_events, the Event texts
"""

from __future__ import annotations

from datetime import datetime

from tpuforge.api import FineTuneJobStatus, FineTunePhase
from tpuforge.controllers.finetune import attempts as attempts
from tpuforge.controllers.finetune import evaluation as evaluation
from tpuforge.controllers.finetune import merge as merge
from tpuforge.controllers.finetune import policies as policies
from tpuforge.controllers.finetune import preflight as preflight
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune import spec as spec_changes
from tpuforge.controllers.finetune import suspend as suspend
from tpuforge.controllers.finetune.conditions import (
    EVALUATED,
    EVALUATION_PASSED,
    FAILED,
    MERGED,
    SPEC_CHANGE_NOT_APPLIED,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    TRAINING,
)
from tpuforge.controllers.finetune.context import Base, ChildRef, Ctx, Event, Obj, Observed, Plan
from tpuforge.controllers.finetune.policies import eta_seconds, tpu_hours

__all__ = [
    "EVALUATED",
    "EVALUATION_PASSED",
    "FAILED",
    "MERGED",
    "SPEC_CHANGE_NOT_APPLIED",
    "SUCCEEDED",
    "SUSPENDED",
    "TRAINING",
    "ChildRef",
    "Event",
    "Observed",
    "Plan",
    "eta_seconds",
    "plan",
    "status_patch",
    "tpu_hours",
]


def plan(o: Observed, now: datetime) -> Plan:
    """The status `o` should have at `now`, and the creates, deletes and Events that get it there."""
    b = Base(o, now)
    run(b)
    return b.plan


def run(b: Base) -> None:
    """One reconcile's decisions, in order."""
    if b.o.deleting:
        return
    ctx = None
    if b.st.phase in TERMINAL:
        b.stop_children()  # a finished job holds no slice
    else:
        ctx = spec_changes.resolve(b)  # None: the spec is invalid and the job has failed
        if ctx is not None and not policies.deadline_passed(ctx):
            step(ctx)
            policies.wake_at_deadline(ctx)
    queue.settle(b)
    if b.st.phase in TERMINAL:
        policies.expire(b)
    policies.derive(b, ctx.spec if ctx is not None else None)
    b.st.observed_generation = b.o.generation


def step(ctx: Ctx) -> None:
    """The current phase's step (while Queued, that of the stage its Job waits in)."""
    phase = queue.stage(ctx)
    if phase == FineTunePhase.MERGING:
        merge.step(ctx)
    elif phase == FineTunePhase.EVALUATING:
        evaluation.step(ctx)
    elif phase == FineTunePhase.SUSPENDED:
        suspend.step(ctx)
    elif ctx.spec.run_policy.suspend:
        suspend.stop(ctx)
    elif preflight.needed(ctx):
        preflight.step(ctx)
    else:
        preflight.stop(ctx)  # one switched off while it ran
        attempts.step(ctx)


# Status fields the operator writes. `progress` belongs to the trainer except the derived keys.
OWNED_FIELDS = (
    "phase",
    "conditions",
    "observedGeneration",
    "restarts",
    "attempt",
    "attempts",
    "startTime",
    "completionTime",
    "outputs",
    "checkpoint",
    "evaluation",
    "preflight",
    "cost",
)
DERIVED_PROGRESS_FIELDS = ("percent", "percentDisplay", "etaSeconds", "etaDisplay")


def status_patch(current: FineTuneJobStatus, desired: FineTuneJobStatus) -> Obj:
    """The JSON merge patch from `current` to `desired` over the operator's fields only (empty: no change)."""
    cur = current.model_dump(mode="json", by_alias=True, exclude_none=True)
    new = desired.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch: Obj = {k: new.get(k) for k in OWNED_FIELDS if cur.get(k) != new.get(k)}
    cur_p, new_p = cur.get("progress") or {}, new.get("progress") or {}
    derived = {k: new_p.get(k) for k in DERIVED_PROGRESS_FIELDS if cur_p.get(k) != new_p.get(k)}
    if derived:
        patch["progress"] = derived
    return patch
