"""The FineTuneJob's phase changes, each named: what a change records besides the phase (the attempt, the
times, the Jobs stopped) and the texts of its condition and Event. The phase, the condition's type, status
and reason and the Event's reason come from the one table (finetune/edges), through `edges.move`: nothing else
assigns `status.phase`.

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
from tpuforge.controllers.finetune.edges import ADMITTED_TO, Edge, move, restate


def _attempt(ctx: Ctx, attempt: int) -> None:
    st = ctx.st
    st.attempt = attempt
    ctx.entry(attempt)
    st.restarts = st.restarts or Restarts()


def to_pending(ctx: Ctx, attempt: int) -> None:
    """Make `attempt` the current one (its Job is created by attempts.create)."""
    _attempt(ctx, attempt)
    move(ctx, "attempt", c.waiting_for_pod(attempt))


def to_preflight(ctx: Ctx) -> None:
    """Before the first attempt, the preflight Job compiles the step for the slice (preflight.py)."""
    s = ctx.slice
    ctx.st.start_time = ctx.st.start_time or ctx.stamp
    move(ctx, "preflight", c.preflight_compiling(s.id, s.topology), ev.preflight_started(s.id))


def pending_if_new(b: Base) -> None:
    """A job the controller has just taken up is Pending until a transition says more."""
    if not b.st.phase:
        move(b, "taken-up")


def to_training(ctx: Ctx, attempt: int, pods: list[PodView]) -> None:
    """Every host's pod runs (`pods` in host order)."""
    if ctx.st.phase == FineTunePhase.TRAINING:
        return
    if len(pods) > 1:
        nodes = sorted({p.node_name for p in pods if p.node_name})
        said = c.training_on_hosts(attempt, [p.name for p in pods], nodes)
        move(ctx, "training", said, ev.started_on_hosts(attempt, len(pods)))
    else:
        pod = pods[0]
        said = c.training_on_pod(attempt, pod.name, pod.node_name)
        move(ctx, "training", said, ev.started(attempt, pod.node_name))


def to_merging(ctx: Ctx, adapter_uri: str | None) -> None:
    """One merge Job exports what the spec asks for: the merged model, the PEFT adapter (`adapter_uri`), or both."""
    if ctx.spec.merge.enabled:
        move(ctx, "merging", c.merging(ctx.spec.output.uri, adapter_uri), ev.merging(ctx.spec.output.uri))
    else:
        assert adapter_uri is not None  # merge off and no adapter: nothing to export, the job succeeded
        move(ctx, "exporting", c.exporting(adapter_uri), ev.exporting(adapter_uri))


def to_evaluating(ctx: Ctx, message: str, slice_id: str, short: str | None = None) -> None:
    """`short`: the Event's text where not the slice it runs on (an evaluation run again)."""
    move(ctx, "evaluating", message, short or ev.evaluating(slice_id))


def to_queued(ctx: Ctx, role: str, job: str, workload: WorkloadView, stage: FineTunePhase) -> None:
    """`job` (the `role` Job or JobSet of `stage`) waits for Kueue: the Queued condition carries Kueue's reason
    and message, kept current while it waits; the phase and the Event change once. The stage is stored
    (status.queuedStage): the job goes back to it once admitted."""
    ctx.st.queued_stage = stage
    reason = workload.reason or c.WAITING_FOR_ADMISSION
    message = c.queued(job, workload.queue, workload.message)
    if ctx.st.phase == FineTunePhase.QUEUED:
        restate(ctx, "queued", message, reason)
        return
    move(ctx, "queued", message, ev.queued(role, workload.queue), reason)


def to_admitted(ctx: Ctx, role: str, job: str, queue: str, stage: FineTunePhase) -> None:
    """Kueue let `job` go: the job is back in the `stage` it waited in."""
    move(ctx, ADMITTED_TO[stage], c.admitted(job, queue), ev.admitted(role))


def to_suspended(ctx: Ctx, attempt: int | None) -> None:
    if ctx.st.phase == FineTunePhase.SUSPENDED:
        return
    move(ctx, "suspended", c.SUSPENDED_MESSAGE, ev.suspended())
    if attempt is not None:
        ctx.condition(c.TRAINING, "False", c.SUSPENDED_REASON, c.attempt_stopped(attempt))


def to_resumed(ctx: Ctx, attempt: int) -> None:
    """Out of Suspended, as attempt `attempt`; as for a Kubernetes Job, the deadline counts from here."""
    ctx.st.start_time = ctx.stamp
    _attempt(ctx, attempt)
    ctx.condition(c.TRAINING, "False", c.PENDING, c.waiting_for_pod(attempt))
    ckpt = ctx.st.progress.last_checkpoint_step if ctx.st.progress else None
    move(ctx, "resumed", c.resumed(attempt), ev.resumed(attempt, ckpt))


def to_succeeded(b: Base, edge: Edge, message: str, short: str) -> None:
    """`message` for the condition; `short`, one describe line, for the Event."""
    # Kept through an evaluation run again: ServingDeployments tell the outputs' revisions apart by it.
    b.st.completion_time = b.st.completion_time or b.stamp
    move(b, edge, message, short)


def to_exported(ctx: Ctx, edge: Edge, note: str = "") -> None:
    """The outputs are written (`edge`: by the merge, or also evaluated): Succeeded, saying where they are (and
    `note`, e.g. the evaluation's verdict)."""
    adapter = adapter_uri(ctx.spec) if ctx.spec.merge.write_adapter else None
    if ctx.spec.merge.enabled:
        message, short = c.outputs(ctx.spec.output.uri, adapter), ev.merged(ctx.spec.output.uri)
    else:
        message, short = c.outputs(None, adapter_uri(ctx.spec)), ev.adapter_exported(adapter_uri(ctx.spec))
    to_succeeded(ctx, edge, message + note, short)


def to_failed(b: Base, edge: Edge, message: str, short: str, reason: str | None = None) -> None:
    """The condition carries the reason (the table's for `edge`, else `reason`) and the whole `message`; the
    Event says `short` in one line. Every Job still running is stopped."""
    b.st.completion_time = b.stamp
    move(b, edge, message, short, reason)
    b.stop_children()
