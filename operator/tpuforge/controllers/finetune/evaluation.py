"""The evaluation (spec.evaluation): after the merge, one evaluation Job scores the adapter and the base model;
its `score` container's result becomes status.evaluation and the EvaluationPassed condition. The job ends
Succeeded either way (its outputs are fine); whether the adapter is promoted is that condition's business.
"""

from __future__ import annotations

import os

from tpuforge.api import FineTuneJobSpec, display, eval_dataset, evaluation_verdict
from tpuforge.api import finetune_reasons as c
from tpuforge.api.configs import output_subdir
from tpuforge.api.constants import EVALUATION_SUBDIR
from tpuforge.api.evaluation import checks
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import onepod as onepod
from tpuforge.controllers.finetune.children import JobView, PodView
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.records import eval_result
from tpuforge.controllers.finetune.transitions import to_evaluating, to_exported, to_failed
from tpuforge.manifests import finetune_evaluation as m
from tpuforge.manifests.common import Obj
from tpuforge.manifests.finetune_common import eval_job_name

# The operator's StorageClass (the chart's Hyperdisk Balanced class; servingdeployment reads the same variable)
# for the evaluation's model volume where spec.evaluation.modelStorage names none.
ENV_STORAGE_CLASS = "TPUFORGE_STORAGE_CLASS"
# Pods of one evaluation Job taken away (DisruptionTarget, which its pod failure policy does not count against
# backoffLimit) before the evaluation fails: a drain or an upgrade now and then is retried, a loop is not.
EVAL_MAX_DISRUPTIONS = 3


def objects(ctx: Ctx) -> list[Obj]:
    """The evaluation's ConfigMap and Job, its model volume on the operator's StorageClass unless the spec names
    one."""
    return m.eval_objects(ctx.owner, with_storage_class(ctx.spec, os.environ.get(ENV_STORAGE_CLASS) or None))


def with_storage_class(spec: FineTuneJobSpec, storage_class: str | None) -> FineTuneJobSpec:
    ev = spec.evaluation
    if ev is None or storage_class is None or ev.model_storage.storage_class_name:
        return spec
    storage = ev.model_storage.model_copy(update={"storage_class_name": storage_class})
    return spec.model_copy(update={"evaluation": ev.model_copy(update={"model_storage": storage})})


def begin(ctx: Ctx) -> None:
    e = ctx.spec.evaluation
    assert e is not None
    uri, held_out = eval_dataset(ctx.spec)
    dataset = f"the records spec.dataset.evalFraction holds out of {uri}" if held_out else uri
    to_evaluating(ctx, c.evaluating(list(e.metrics), e.max_examples, dataset, e.slice), e.slice)
    ctx.plan.create.extend(objects(ctx))


def step(ctx: Ctx) -> None:
    """Evaluating: (re)create the evaluation Job and follow it to its result."""
    if ctx.spec.evaluation is None:
        # The evaluation was taken out of the spec while it ran: there is nothing left to wait for.
        job = ctx.job(eval_job_name(ctx.o.name))
        if job is not None and ctx.live(job):
            ctx.delete_job(job)
        ctx.condition(c.EVALUATED, "False", c.NOT_EVALUATED, c.EVALUATION_REMOVED)
        to_exported(ctx, c.NOT_EVALUATED_SUFFIX)
        return
    at = onepod.follow(ctx, eval_job_name(ctx.o.name), max_disruptions=EVAL_MAX_DISRUPTIONS)
    name = at.job.name if at.job is not None else ""
    if at.state == "absent":
        ctx.plan.create.extend(objects(ctx))
    elif at.state == "done":
        assert at.job is not None and at.pod is not None
        evaluated(ctx, at.job, at.pod)
    elif at.state == "rejected":
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_rejected(name, at.detail), at.detail)
    elif at.state == "evicted":
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_evicted(name, at.detail), at.detail)
    elif at.state == "disrupted":
        message = c.evaluation_job_failed(name, f"after its pod was taken away {at.count} times", at.detail)
        failed(ctx, c.EVALUATION_FAILED, message, at.detail)
    elif at.state == "failed":
        if at.at_once:
            tries = "at once (a rejected config)"
        elif at.past_deadline:
            limit = ctx.spec.evaluation.active_deadline_seconds
            tries = f"past spec.evaluation.activeDeadlineSeconds={limit} (raise it for a larger model or dataset)"
        else:
            tries = f"after {m.EVAL_BACKOFF_LIMIT + 1} tries"
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_job_failed(name, tries, at.detail), at.detail)
    elif at.state == "missing":
        failed(ctx, c.EVALUATION_RESULT_MISSING, c.evaluation_result_missing(name), c.EVALUATION_POD_GONE)
    elif at.state == "running" and at.pod is not None:
        ctx.condition(c.EVALUATED, "False", c.EVALUATING, c.evaluating_on(at.pod.name, at.pod.node_name))


def evaluated(ctx: Ctx, job: JobView, pod: PodView) -> None:
    """The `score` container's result: record it, say the verdict, and end the job Succeeded either way."""
    spec = ctx.spec.evaluation
    assert spec is not None
    try:
        result = eval_result(pod)
    except ValueError as exc:
        message = c.evaluation_unreadable(job.name, exc)
        failed(ctx, c.EVALUATION_RESULT_UNREADABLE, message, str(exc), ev.eval_unreadable())
        return
    found = checks(spec, result.metrics, result.intervals)
    passed, verdict = evaluation_verdict(spec, result.metrics, result.intervals)
    report = result.report_uri or output_subdir(ctx.spec, EVALUATION_SUBDIR)
    ctx.st.evaluation = result.model_copy(
        update={
            "passed": passed,
            "result": "Passed" if passed else "Failed",
            "result_display": display.verdict(passed, result.metrics),
            "message": verdict,
            "report_uri": report,
        }
    )
    ctx.condition(c.EVALUATED, "True", c.EVALUATED_REASON, c.scored(result.examples, report))
    if passed:
        ctx.condition(c.EVALUATION_PASSED, "True", c.PASSED, verdict)
        ctx.event("Normal", ev.EVALUATED, ev.eval_passed(result.metrics, result.base_metrics))
    else:
        ctx.condition(c.EVALUATION_PASSED, "False", c.BELOW_THRESHOLD, verdict)
        ctx.event("Warning", ev.EVALUATED, ev.eval_below(next((x for x in found if not x.passed), None)))
    outcome = "evaluation passed" if passed else "evaluation below threshold"
    to_exported(ctx, f"; {outcome}: {verdict}")


def failed(ctx: Ctx, reason: str, message: str, detail: str, short: str | None = None) -> None:
    """The evaluation could not give a verdict: Evaluated False, and the job fails with `reason`."""
    ctx.condition(c.EVALUATED, "False", c.EVALUATION_FAILED, detail)
    to_failed(ctx, reason, message, short or ev.eval_failed())
