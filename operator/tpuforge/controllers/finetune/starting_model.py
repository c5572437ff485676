"""spec.model.fineTuneJobRef: a job that starts from another FineTuneJob's merged model. Before its first stage
the reference is resolved (tpuforge.api.job_models, as ServingDeployments read a job) and the URI kept in
status.model: every later stage, and an operator restarted, read that one even if the other job is deleted or
runs again. Until that job has Succeeded the job waits, Pending, its Training condition WaitingForModel; a job
that failed, succeeded without a merged model or trains another model fails this one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuforge.api import FineTuneJobSpec, FineTunePhase, ModelStatus
from tpuforge.api import finetune_reasons as c
from tpuforge.api.job_models import job_model
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.transitions import pending_if_new, to_failed


@dataclass(frozen=True)
class Resolution:
    """What the reference gives now: the merged model's `uri`, or none, and then why (`reason`, `message`);
    `final` when it never will."""

    uri: str | None
    reason: str = ""
    message: str = ""
    final: bool = False


def resolve(job_name: str, model_name: str, job: dict[str, Any] | None) -> Resolution:
    """The model the FineTuneJob `job` (named `job_name`; None when it does not exist) offers a job of catalog
    model `model_name` to start from."""
    if job is None:
        return Resolution(None, c.WAITING_FOR_MODEL, c.model_job_missing(job_name))
    found = job_model(job)
    if found.name and found.name != model_name:
        return Resolution(None, c.MODEL_MISMATCH, c.model_mismatch(job_name, found.name, model_name), final=True)
    if found.uri is not None:
        return Resolution(found.uri)
    if found.failed:
        return Resolution(None, c.MODEL_JOB_FAILED, c.model_job_failed(job_name), final=True)
    if found.phase == FineTunePhase.SUCCEEDED:
        return Resolution(None, c.NO_MERGED_MODEL, c.no_merged_model(job_name), final=True)
    return Resolution(None, c.WAITING_FOR_MODEL, c.waiting_for_model(job_name, found.phase))


def located(spec: FineTuneJobSpec, uri: str) -> FineTuneJobSpec:
    """`spec` with its model read from `uri` (what the pods' configs carry as the base model)."""
    return spec.model_copy(update={"model": spec.model.resolved(uri)})


def locate(ctx: Ctx) -> Ctx | None:
    """`ctx` with the spec's model located: as it is for a spec.model.uri, else the URI kept in status.model,
    else the referenced job's now (then kept). None while the job waits for that model, or once it failed."""
    ref = ctx.spec.model.fine_tune_job_ref
    if ref is None:
        return ctx
    kept = ctx.st.model
    if kept is None or kept.fine_tune_job != ref.name:
        found = resolve(ref.name, ctx.spec.model.name, ctx.o.model_job)
        if found.uri is None:
            _unavailable(ctx, ref.name, found)
            return None
        kept = ctx.st.model = ModelStatus(fine_tune_job=ref.name, uri=found.uri)
    return Ctx(ctx, located(ctx.spec, kept.uri))


def _unavailable(ctx: Ctx, job_name: str, found: Resolution) -> None:
    if found.final:
        to_failed(ctx, "no-model", found.message, ev.no_model(job_name), found.reason)
        return
    if not ctx.has_condition(c.TRAINING, "False", c.WAITING_FOR_MODEL):
        ctx.event("Normal", ev.NO_MODEL_YET, ev.waiting_for_model(job_name))
    pending_if_new(ctx)
    ctx.condition(c.TRAINING, "False", c.WAITING_FOR_MODEL, found.message)
