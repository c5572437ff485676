"""The merge: after training, one merge Job exports what spec.merge asks for (the merged model, the PEFT
adapter, or both) from the checkpoint step spec.checkpoint.select picks (status.checkpoint); the phase Merging,
what follows (the evaluation, which scores the exported adapter, so that same step, or Succeeded) is the state
machine's (finetune/machine.py)."""

from __future__ import annotations

from tpuforge.api import CheckpointStatus, FineTuneJobSpec, Outputs, TrainResult, adapter_uri
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import onepod as onepod
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.outcomes import EXPORTED, NOTHING_TO_EXPORT, Outcome
from tpuforge.controllers.finetune.transitions import to_failed, to_merging
from tpuforge.manifests import finetune_merge as m
from tpuforge.manifests.finetune_common import merge_job_name


def checkpoint_choice(spec: FineTuneJobSpec, result: TrainResult | None) -> CheckpointStatus:
    """The step the merge exports, from what the trainer reported (`result`, None when unread). With select
    best and no best step reported, the step is left to the merge (it reads the trainer's eval record)."""
    select = spec.checkpoint.select
    best = result.best if result else None
    last = result.step if result else None
    if select == "best":
        step, loss = (best.step, best.loss) if best else (None, None)
    else:
        step = last
        loss = result.last_eval.loss if result and result.last_eval and result.last_eval.step == last else None
    stop = result.stopped_early if result else None
    return CheckpointStatus(
        select=select,
        last_step=last,
        best_step=best.step if best else None,
        best_eval_loss=best.loss if best else None,
        selected_step=step,
        selected_eval_loss=loss,
        stopped_early_at=stop.step if stop else None,
        message=c.checkpoint_selected(select, step, loss, last),
    )


def selected_step(ctx: Ctx) -> int | None:
    """The step the merge Job exports: status.checkpoint's choice for select best; the latest for last."""
    chosen = ctx.st.checkpoint
    return chosen.selected_step if chosen and ctx.spec.checkpoint.select == "best" else None


def begin(ctx: Ctx, result: TrainResult | None = None) -> Outcome | None:
    """Training succeeded (to its last step, or stopped early): record the checkpoint and the step chosen from
    it, then merge (or, with nothing to export, succeed)."""
    st, spec = ctx.st, ctx.spec
    st.outputs = (st.outputs or Outputs()).model_copy(update={"checkpoint_uri": spec.checkpoint.uri})
    st.checkpoint = checkpoint_choice(spec, result)
    stop = result.stopped_early if result else None
    if stop is not None:
        best = result.best if result else None
        said = c.stopped_early(
            stop.step, stop.evals, stop.min_delta, best.step if best else None, best.loss if best else None
        )
        ctx.condition(c.TRAINING, "False", c.STOPPED_EARLY, f"{said}; {st.checkpoint.message}")
        ctx.event("Normal", ev.EARLY_STOP, ev.stopped_early(stop.step, best.step if best else None))
    else:
        trained = st.progress.step if st.progress and st.progress.step is not None else None
        if result is not None:
            trained = result.step
        ctx.condition(c.TRAINING, "False", c.COMPLETED, f"{c.training_finished(trained)}; {st.checkpoint.message}")
    if not spec.merge.enabled and not spec.merge.write_adapter:
        return NOTHING_TO_EXPORT
    to_merging(ctx, adapter_uri(spec) if spec.merge.write_adapter else None)
    ctx.plan.create.extend(m.merge_objects(ctx.owner, spec, selected_step(ctx)))
    return None


def step(ctx: Ctx) -> Outcome | None:
    """Merging: (re)create the merge Job, and follow it to its end (it may wait in Kueue first). Its result is
    the outputs it commits to GCS, so its completion is enough."""
    at = onepod.follow(ctx, merge_job_name(ctx.o.name), result=None, reject=False)
    if at.state == "absent":
        ctx.plan.create.extend(m.merge_objects(ctx.owner, ctx.spec, selected_step(ctx)))
    elif at.state == "done":
        return merged(ctx)
    elif at.state == "failed":
        assert at.job is not None
        ctx.condition(c.MERGED, "False", c.MERGE_FAILED, at.detail)
        message = c.merge_failed(at.job.name, m.MERGE_BACKOFF_LIMIT + 1, at.detail)
        to_failed(ctx, "merge-failed", message, ev.merge_failed())
    return None


def merged(ctx: Ctx) -> Outcome:
    """The merge Job committed its outputs: the merged model, the adapter, or both."""
    spec, merge = ctx.spec, ctx.spec.merge
    update: dict[str, str] = {}
    if merge.enabled:
        update["merged_model_uri"] = spec.output.uri
    if merge.write_adapter:
        update["adapter_uri"] = adapter_uri(spec)
    ctx.st.outputs = (ctx.st.outputs or Outputs()).model_copy(update=update)
    if merge.enabled:
        said = c.merged(spec.output.uri, adapter_uri(spec) if merge.write_adapter else None)
        ctx.condition(c.MERGED, "True", c.MERGED_REASON, said)
    else:
        ctx.condition(c.MERGED, "True", c.ADAPTER_EXPORTED, c.adapter_exported(adapter_uri(spec)))
    return EXPORTED
