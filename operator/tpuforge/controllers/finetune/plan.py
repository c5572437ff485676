"""The FineTuneJob decisions: from what is observed (the object and its children) to the status it should
have and the actions that get there. Pure: no I/O, and `now` is passed in.

Level-based and idempotent: every decision is a function of the stored status and the current attempt's
children, and writes absolute values (attempt n, failures k), never increments of what was read. Running it
twice, or on a stale view, gives the same result; the status patch carries the resourceVersion it was
computed from, so a stale plan is refused by the apiserver rather than applied.

Where each decision lives (one module per phase, each a handful of functions over a small context):

    context      Observed, Plan, and the context the decisions share (Base; Ctx adds the spec)
    spec         the spec a job runs with: invalid specs, frozen fields after the start
    starting_model  spec.model.fineTuneJobRef: another job's merged model, waited for, then kept (status.model)
    machine      which step follows which: the table from a phase's outcome to what begins next
    edges        every phase change: the one table (phase, edge) -> transition, and `move`, which alone sets it
    outcomes     what a phase's step can end in
    preflight    Preflight: the step compiled for the slice on a CPU node before the first attempt
    attempts     Pending and Training: create, follow and end attempts; a preemption becomes a resume in
                 `preempted`, a failure a retry (or the end) in `failed`
    children     what the children say, and how an attempt ended (`attempt_end`, beside `pod_ending`)
    records      what a pod wrote as its termination message (`termination_record`: one parser)
    onepod       where a one-pod Job (preflight, merge, evaluation) stands: the one follower
    suspend      Suspended, and back
    queue        Queued: a Job that Kueue holds (spec.queueName), and back to its stage
    merge        Merging
    evaluation   Evaluating
    policies     the deadline, the TTL after finishing, and the derived status (percent, ETA, cost)
    transitions  each phase change named, with its texts and what else it records (through edges.move)
    conditions   condition types, reasons and messages; events, the Event texts
"""

from __future__ import annotations

from datetime import datetime

from tpuforge.api import FineTuneJobStatus
from tpuforge.api.finetune_reasons import (
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
from tpuforge.controllers.finetune import evaluation as evaluation
from tpuforge.controllers.finetune import machine as machine
from tpuforge.controllers.finetune import policies as policies
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune import spec as spec_changes
from tpuforge.controllers.finetune import starting_model as starting_model
from tpuforge.controllers.finetune.context import Base, ChildRef, Event, Obj, Observed, Plan
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
    rerun = evaluation.requested_run(b) is not None
    if b.st.phase in TERMINAL and not rerun:
        b.stop_children()  # a finished job holds no slice
    else:
        ctx = spec_changes.resolve(b)  # None: the spec is invalid and the job has failed
        ctx = starting_model.locate(ctx) if ctx is not None else None  # None: no model yet, or never
        if ctx is not None and rerun:
            evaluation.again(ctx)
        elif ctx is not None and not policies.end_past_deadline(ctx):
            machine.step(ctx)
            policies.wake_at_deadline(ctx)
    queue.settle(b)
    if b.st.phase in TERMINAL:
        policies.expire(b)
    policies.derive(b, ctx.spec if ctx is not None else None)
    b.st.observed_generation = b.o.generation


# Status fields the operator writes. `progress` belongs to the trainer except the derived keys.
OWNED_FIELDS = (
    "phase",
    "queuedStage",
    "conditions",
    "observedGeneration",
    "restarts",
    "attempt",
    "attempts",
    "startTime",
    "completionTime",
    "model",
    "outputs",
    "checkpoint",
    "evaluation",
    "preflight",
    "cost",
    "images",
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
