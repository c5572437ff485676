"""The FineTuneJob's phase changes, each named: it sets the phase, the condition that explains it and the Event
that reports it, together. Nothing else assigns `status.phase`.

    (new) -> [Preflight] -> Pending -> Training -> Merging -> [Evaluating] -> Succeeded
    Pending/Training -> Pending (the next attempt: preempted or retried) | Suspended -> Pending | Failed
    Preflight/Pending/Merging/Evaluating -> Queued (its Job waits for Kueue) -> the same phase, once admitted
"""

from __future__ import annotations

from tpuforge.api import FineTunePhase, Restarts, adapter_uri
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.children import PodView, WorkloadView
from tpuforge.controllers.finetune.context import Base, Ctx


def to_pending(ctx: Ctx, attempt: int) -> None:
    """Make `attempt` the current one (its Job is created by attempts.create)."""
    st = ctx.st
    st.attempt = attempt
    ctx.entry(attempt)
    st.restarts = st.restarts or Restarts()
    st.phase = FineTunePhase.PENDING
    ctx.condition(c.TRAINING, "False", c.PENDING, c.waiting_for_pod(attempt))


def to_preflight(ctx: Ctx) -> None:
    """Before the first attempt, the preflight Job compiles the step for the slice (preflight.py)."""
    s = ctx.slice
    ctx.st.phase = FineTunePhase.PREFLIGHT
    ctx.st.start_time = ctx.st.start_time or ctx.stamp
    ctx.condition(c.PREFLIGHT, "False", c.COMPILING, c.preflight_compiling(s.id, s.topology))
    ctx.event("Normal", ev.PREFLIGHT, ev.preflight_started(s.id))


def pending_if_new(b: Base) -> None:
    """A job the controller has just taken up is Pending until a transition says more."""
    b.st.phase = b.st.phase or FineTunePhase.PENDING


def to_training(ctx: Ctx, attempt: int, pods: list[PodView]) -> None:
    """Every host's pod runs (`pods` in host order)."""
    if ctx.st.phase == FineTunePhase.TRAINING:
        return
    ctx.st.phase = FineTunePhase.TRAINING
    if len(pods) > 1:
        nodes = sorted({p.node_name for p in pods if p.node_name})
        ctx.condition(c.TRAINING, "True", c.RUNNING, c.training_on_hosts(attempt, [p.name for p in pods], nodes))
        ctx.event("Normal", ev.TRAINING, ev.started_on_hosts(attempt, len(pods)))
    else:
        pod = pods[0]
        ctx.condition(c.TRAINING, "True", c.RUNNING, c.training_on_pod(attempt, pod.name, pod.node_name))
        ctx.event("Normal", ev.TRAINING, ev.started(attempt, pod.node_name))


def to_merging(ctx: Ctx, adapter_uri: str | None) -> None:
    """One merge Job exports what the spec asks for: the merged model, the PEFT adapter (`adapter_uri`), or both."""
    ctx.st.phase = FineTunePhase.MERGING
    if ctx.spec.merge.enabled:
        ctx.condition(c.MERGED, "False", c.MERGING, c.merging(ctx.spec.output.uri, adapter_uri))
        ctx.event("Normal", ev.MERGING, ev.merging(ctx.spec.output.uri))
    else:
        assert adapter_uri is not None  # merge off and no adapter: nothing to export, the job succeeded
        ctx.condition(c.MERGED, "False", c.EXPORTING, c.exporting(adapter_uri))
        ctx.event("Normal", ev.MERGING, ev.exporting(adapter_uri))


def to_evaluating(ctx: Ctx, message: str, slice_id: str, short: str | None = None) -> None:
    """`short`: the Event's text where not the slice it runs on (an evaluation run again)."""
    ctx.st.phase = FineTunePhase.EVALUATING
    ctx.condition(c.EVALUATED, "False", c.EVALUATING, message)
    ctx.event("Normal", ev.EVALUATING, short or ev.evaluating(slice_id))


def to_queued(ctx: Ctx, role: str, job: str, workload: WorkloadView) -> None:
    """`job` (the `role` Job or JobSet) waits for Kueue: the Queued condition carries Kueue's reason and
    message, kept current while it waits; the phase and the Event change once."""
    reason = workload.reason or c.WAITING_FOR_ADMISSION
    ctx.condition(c.QUEUED, "True", reason, c.queued(job, workload.queue, workload.message))
    if ctx.st.phase == FineTunePhase.QUEUED:
        return
    ctx.st.phase = FineTunePhase.QUEUED
    ctx.event("Normal", ev.QUEUED, ev.queued(role, workload.queue))


def to_admitted(ctx: Ctx, role: str, job: str, queue: str, stage: FineTunePhase) -> None:
    """Kueue let `job` go: the job is back in the `stage` it waited in."""
    ctx.st.phase = stage
    ctx.condition(c.QUEUED, "False", c.ADMITTED, c.admitted(job, queue))
    ctx.event("Normal", ev.ADMITTED, ev.admitted(role))


def to_suspended(ctx: Ctx, attempt: int | None) -> None:
    if ctx.st.phase == FineTunePhase.SUSPENDED:
        return
    ctx.st.phase = FineTunePhase.SUSPENDED
    ctx.condition(c.SUSPENDED, "True", c.SUSPENDED_REASON, c.SUSPENDED_MESSAGE)
    if attempt is not None:
        ctx.condition(c.TRAINING, "False", c.SUSPENDED_REASON, c.attempt_stopped(attempt))
    ctx.event("Normal", ev.SUSPENDED, ev.suspended())


def to_resumed(ctx: Ctx, attempt: int) -> None:
    """Out of Suspended, as attempt `attempt`; as for a Kubernetes Job, the deadline counts from here."""
    ctx.st.start_time = ctx.stamp
    to_pending(ctx, attempt)
    ctx.condition(c.SUSPENDED, "False", c.RESUMED, c.resumed(attempt))
    ckpt = ctx.st.progress.last_checkpoint_step if ctx.st.progress else None
    ctx.event("Normal", ev.RESUMED, ev.resumed(attempt, ckpt))


def to_succeeded(b: Base, message: str, short: str) -> None:
    """`message` for the condition; `short`, one describe line, for the Event."""
    b.st.phase = FineTunePhase.SUCCEEDED
    # Kept through an evaluation run again: ServingDeployments tell the outputs' revisions apart by it.
    b.st.completion_time = b.st.completion_time or b.stamp
    b.condition(c.SUCCEEDED, "True", c.SUCCEEDED_REASON, message)
    b.event("Normal", ev.SUCCEEDED, short)


def to_exported(ctx: Ctx, note: str = "") -> None:
    """The outputs are written: Succeeded, saying where they are (and `note`, e.g. the evaluation's verdict)."""
    adapter = adapter_uri(ctx.spec) if ctx.spec.merge.write_adapter else None
    if ctx.spec.merge.enabled:
        message, short = c.outputs(ctx.spec.output.uri, adapter), ev.merged(ctx.spec.output.uri)
    else:
        message, short = c.outputs(None, adapter_uri(ctx.spec)), ev.adapter_exported(adapter_uri(ctx.spec))
    to_succeeded(ctx, message + note, short)


def to_failed(b: Base, reason: str, message: str, short: str) -> None:
    """The condition carries `reason` and the whole `message`; the Event says `short` in one line. Every Job
    still running is stopped."""
    b.st.phase = FineTunePhase.FAILED
    b.st.completion_time = b.stamp
    b.condition(c.FAILED, "True", reason, message)
    b.event("Warning", ev.FAILED, short)
    b.stop_children()
