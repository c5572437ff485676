"""Training attempts: the phases Pending and Training. Each attempt is one training Job (a JobSet on a
multi-host slice) with its own name; how it ended is classified once (`children.attempt_end`), then:

    Succeeded -> `trained` (the state machine, finetune/machine.py, begins the merge)
    Preempted -> the next attempt, resuming from the last checkpoint, while spec.runPolicy.maxPreemptions
                 allows (`preempted`), else the job fails
    Failed    -> the next attempt while spec.runPolicy.maxRestarts allows (`failed`), else the job fails;
                 a rejected config (exit 3) fails it at once; an eviction for the pod's own use of memory or
                 disk is a failure (children.self_evicted), not a preemption
"""

from __future__ import annotations

from tpuforge.api import Restarts
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune.children import (
    AttemptEnd,
    JobView,
    PodView,
    attempt_end,
    host_order,
)
from tpuforge.controllers.finetune.context import Ctx, attempt_entry, parse_time, rfc3339
from tpuforge.controllers.finetune.outcomes import Outcome, trained
from tpuforge.controllers.finetune.records import train_result
from tpuforge.controllers.finetune.transitions import pending_if_new, to_failed, to_pending, to_training
from tpuforge.manifests import finetune_training as m
from tpuforge.manifests.finetune_common import COMPONENT_TRAINER

# Where a multi-host job waits for JobSet to be installed, it looks again this often.
JOBSET_RECHECK_SECONDS = 60.0
# A pod the scheduler cannot place yet is how a node pool is asked to scale up (TPU nodes take minutes); only
# after this long does the status say that the training pod cannot be scheduled, and why.
UNSCHEDULABLE_REPORT_SECONDS = 300.0
# While a trainer runs, TPU time (and so cost) grows without any event: look again this often.
COST_REFRESH_SECONDS = 60.0


def step(ctx: Ctx) -> Outcome | None:
    """Pending or Training (or a job just taken up): start, follow or end the current attempt (`trained`:
    it succeeded)."""
    st = ctx.st
    if st.attempt is None:
        if jobset_missing(ctx):
            return None
        to_pending(ctx, 0)
        st.start_time = st.start_time or ctx.stamp  # set already when a preflight ran first
        s = ctx.slice
        ctx.event("Normal", ev.CREATED, ev.created(s.id, s.topology, ctx.spec.tpu.spot, s.hosts))
    n = st.attempt
    assert n is not None
    job = ctx.train_job(n)
    if job is None:
        create(ctx, n)
        return None
    if job.deleting:
        return None  # someone removed it: it is recreated once it is gone
    pods = ctx.pods_of(job)
    record_start(ctx, n, pods)
    end = attempt_end(job, pods, ctx.hosts, ctx.entry(n))
    if end is None:
        if queue.queue_or_admit(ctx, job):
            return None
        running = [p for p in pods if p.phase == "Running" and not p.deleting]
        if running and len(running) >= ctx.hosts:
            started(ctx, n, running)
        elif ctx.hosts > 1 or not any(p.phase == "Running" for p in pods):
            pending(ctx, n, pods)
        return None
    ctx.close_attempt(n, end.outcome, end.reason, end.message, end.at)
    if end.outcome == "Succeeded":
        return trained(train_result(pods))
    if end.outcome == "Preempted":
        preempted(ctx, n, job, end)
    else:
        failed(ctx, n, job, end)
    return None


def record_start(ctx: Ctx, n: int, pods: list[PodView]) -> None:
    """The first pod of the attempt that reached a node: its name and when TPU time began. On several hosts,
    every host's pod as it reaches its node."""
    on_nodes = [p for p in pods if p.running_since or p.start_time]
    first = next(iter(on_nodes), None)
    e = ctx.entry(n)
    if first is not None and e.pod_name is None:
        e.pod_name = first.name
        e.start_time = e.start_time or first.running_since or first.start_time
    if first is not None and e.node_name is None and first.node_name:
        e.node_name = first.node_name
    if ctx.hosts > 1:
        known = list(e.pods or [])
        new = [p.name for p in on_nodes if p.name not in known]
        if new:  # in host order, whichever host reached its node first
            by_name = {p.name: p for p in pods}
            e.pods = sorted(
                known + new, key=lambda name: host_order(by_name[name]) if name in by_name else (1 << 30, name)
            )


def jobset_missing(ctx: Ctx) -> bool:
    """A multi-host slice on a cluster without JobSet: say so, create nothing, and look again later."""
    if ctx.hosts == 1 or ctx.o.jobset_served:
        return False
    if not ctx.has_condition(c.TRAINING, "False", c.JOBSET_NOT_INSTALLED):
        ctx.event("Warning", ev.NO_JOBSET, ev.no_jobset(ctx.spec.tpu.slice))
    pending_if_new(ctx)
    ctx.condition(c.TRAINING, "False", c.JOBSET_NOT_INSTALLED, c.no_jobset(ctx.spec.tpu.slice, ctx.hosts))
    ctx.plan.requeue(JOBSET_RECHECK_SECONDS)
    return True


def create(ctx: Ctx, n: int) -> None:
    """Create attempt `n`'s Job (or JobSet), once no trainer of an earlier attempt runs."""
    if jobset_missing(ctx):
        return
    busy = [p for p in ctx.o.pods if p.component == COMPONENT_TRAINER and not p.terminal]
    if busy:
        # Two trainers must never write the same checkpoint directory.
        ctx.condition(c.TRAINING, "False", c.WAITING_FOR_PREVIOUS_ATTEMPT, c.previous_attempt_running(n, busy[0].name))
        return
    ctx.plan.create.extend(m.attempt_objects(ctx.owner, ctx.spec, n, ctx.st.preflight))
    pending_if_new(ctx)
    if not ctx.has_condition(c.TRAINING, "False") or ctx.has_condition(c.TRAINING, "False", c.JOBSET_NOT_INSTALLED):
        what = "JobSet" if ctx.hosts > 1 else "Job"
        ctx.condition(c.TRAINING, "False", c.PENDING, c.created_job(n, what, ctx.train_name(n)))


def started(ctx: Ctx, n: int, pods: list[PodView]) -> None:
    """Every host's pod runs: the attempt is training (and its TPU time grows: look again for the cost)."""
    pods = sorted(pods, key=host_order)
    pod = pods[0]
    e = ctx.entry(n)
    e.pod_name = e.pod_name or pod.name
    e.node_name = e.node_name or pod.node_name
    e.start_time = e.start_time or pod.running_since or pod.start_time or ctx.stamp
    to_training(ctx, n, pods)
    ctx.plan.requeue(COST_REFRESH_SECONDS)


def pending(ctx: Ctx, n: int, pods: list[PodView]) -> None:
    """Say why the pod does not start once it has waited longer than a TPU node pool takes to scale up
    (before that, an unschedulable pod is the normal way to ask for a node)."""
    stuck = next((p for p in pods if p.unschedulable), None)
    if stuck is not None:
        since = parse_time(stuck.unschedulable_since) if stuck.unschedulable_since else ctx.now
        wait = UNSCHEDULABLE_REPORT_SECONDS - (ctx.now - since).total_seconds()
        if wait > 0:
            ctx.plan.requeue(wait)
            return
        message = c.unschedulable(n, stuck.name, rfc3339(since), stuck.unschedulable or "")
        ctx.condition(c.TRAINING, "False", c.UNSCHEDULABLE, message)
    elif any(x.type == c.TRAINING and x.reason == c.UNSCHEDULABLE for x in ctx.st.conditions):
        ctx.condition(c.TRAINING, "False", c.PENDING, c.waiting_for_pod(n))


def resuming(ctx: Ctx, n: int) -> None:
    """Say where attempt `n` picks up: the last checkpoint, and the steps since it that are done again."""
    prog = ctx.st.progress
    if prog is None or prog.step is None:  # the trainer never reported: the operator cannot tell
        ctx.event("Normal", ev.RESUMING, ev.resuming(n, None, None))
        return
    ckpt = prog.last_checkpoint_step or 0  # the trainer reports one from its start; none means step 0
    # Progress older than the ended attempt's start is its predecessor's: that attempt did no step.
    ended = attempt_entry(ctx.st, n - 1)
    stale = bool(
        prog.updated_at
        and ended is not None
        and ended.start_time
        and parse_time(prog.updated_at) < parse_time(ended.start_time)
    )
    ctx.event("Normal", ev.RESUMING, ev.resuming(n, ckpt, 0 if stale else max(prog.step - ckpt, 0)))


def next_attempt(ctx: Ctx, n: int, job: JobView) -> None:
    if ctx.live(job):
        ctx.delete_job(job)  # e.g. a replacement pod the Job controller started after a node loss
    to_pending(ctx, n + 1)
    create(ctx, n + 1)


def preempted(ctx: Ctx, n: int, job: JobView, end: AttemptEnd) -> None:
    """Where a preemption becomes a resume: count it, say which host or node, and start attempt n + 1 from the
    last checkpoint. Preemptions are not failures (maxRestarts does not count them), but past
    spec.runPolicy.maxPreemptions the job fails: something keeps taking its pods away."""
    st = ctx.st
    preemptions = (st.restarts.preemptions if st.restarts else 0) + 1
    st.restarts = (st.restarts or Restarts()).model_copy(update={"preemptions": preemptions})
    limit = ctx.spec.run_policy.max_preemptions
    if preemptions > limit:
        to_failed(
            ctx,
            "too-many-preemptions",
            c.preemptions_exhausted(n, end.message, preemptions, limit),
            ev.preemptions_exhausted(n, preemptions),
        )
        return
    ckpt = st.progress.last_checkpoint_step if st.progress else None
    resume = f"from checkpoint step {ckpt}" if ckpt is not None else "from the latest checkpoint"
    if ctx.hosts > 1:
        ctx.event("Warning", ev.PREEMPTED, ev.host_preempted(n, end.host, ctx.hosts, end.node))
        why = f" ({end.message})"
    else:
        ctx.event("Warning", ev.PREEMPTED, ev.preempted(n, ctx.entry(n).node_name))
        why = ""
    resuming(ctx, n + 1)
    next_attempt(ctx, n, job)
    ctx.condition(c.TRAINING, "False", c.PREEMPTED, c.preempted(n, why, resume))


def failed(ctx: Ctx, n: int, job: JobView, end: AttemptEnd) -> None:
    """A failed attempt: retried as attempt n + 1 while spec.runPolicy.maxRestarts allows; a rejected config
    is not retried."""
    st = ctx.st
    failures = (st.restarts.failures if st.restarts else 0) + 1
    st.restarts = (st.restarts or Restarts()).model_copy(update={"failures": failures})
    limit = ctx.spec.run_policy.max_restarts
    if end.permanent:
        to_failed(ctx, "attempt-rejected", c.rejected(n, end.message), ev.rejected_config(n), end.reason)
        return
    if failures > limit:
        to_failed(
            ctx, "training-failed", c.gave_up(n, end.message, failures, limit), ev.gave_up(n, end.reason, failures)
        )
        return
    ctx.event("Warning", ev.RETRYING, ev.retrying(n, end.reason, failures, limit))
    resuming(ctx, n + 1)
    next_attempt(ctx, n, job)
    ctx.condition(c.TRAINING, "False", c.RETRYING, c.retrying(n))
