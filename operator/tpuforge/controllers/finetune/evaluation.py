"""The evaluation (spec.evaluation): after the merge, one evaluation Job scores the adapter and the base model;
its `score` container's result becomes status.evaluation and the EvaluationPassed condition. The job ends
Succeeded either way (its outputs are fine); whether the adapter is promoted is that condition's business.
"""

from __future__ import annotations

import os

from tpuforge.api import FineTuneJobSpec, display, eval_dataset, evaluation_verdict
from tpuforge.api.configs import output_subdir
from tpuforge.api.constants import EVALUATION_SUBDIR
from tpuforge.api.evaluation import checks
from tpuforge.controllers.finetune import conditions as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune.children import EVICTED, JobView, PodView, eval_result, pod_ending
from tpuforge.controllers.finetune.context import Ctx
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
    job = ctx.job(eval_job_name(ctx.o.name))
    if ctx.spec.evaluation is None:
        # The evaluation was taken out of the spec while it ran: there is nothing left to wait for.
        if job is not None and ctx.live(job):
            ctx.delete_job(job)
        ctx.condition(c.EVALUATED, "False", c.NOT_EVALUATED, c.EVALUATION_REMOVED)
        to_exported(ctx, c.NOT_EVALUATED_SUFFIX)
        return
    if job is None:
        ctx.plan.create.extend(objects(ctx))
        return
    if job.deleting:
        return  # someone removed it: it is recreated once it is gone
    pods = ctx.pods_of(job)
    done = next((p for p in pods if p.phase == "Succeeded"), None)
    if done is not None:
        evaluated(ctx, job, done)
        return
    endings = [e for e in (pod_ending(p) for p in pods) if e is not None]
    failures = [e for e in endings if e.outcome == "Failed"]
    rejected = next((e for e in failures if e.permanent), None)
    # Ignored by the Job's pod failure policy (DisruptionTarget), so counted here: the pods taken away, and
    # those the kubelet evicted for their own use (the same every time: not retried).
    disrupted = [e for e in endings if e.outcome == "Preempted"]
    evicted = next((e for e in failures if e.reason == EVICTED), None)
    if rejected is not None:
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_rejected(job.name, rejected.message), rejected.message)
    elif evicted is not None:
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_evicted(job.name, evicted.message), evicted.message)
    elif len(disrupted) > EVAL_MAX_DISRUPTIONS:
        detail = disrupted[-1].message
        message = c.evaluation_job_failed(job.name, f"after its pod was taken away {len(disrupted)} times", detail)
        failed(ctx, c.EVALUATION_FAILED, message, detail)
    elif job.failed:
        detail = failures[-1].message if failures else job.failure
        # The Job's pod failure policy ends it at the first rejected config (its reason says so), which
        # can be seen before the pod's own ending.
        if job.failure.startswith("PodFailurePolicy"):
            tries = "at once (a rejected config)"
        elif job.failure.startswith("DeadlineExceeded"):
            limit = ctx.spec.evaluation.active_deadline_seconds
            tries = f"past spec.evaluation.activeDeadlineSeconds={limit} (raise it for a larger model or dataset)"
        else:
            tries = f"after {m.EVAL_BACKOFF_LIMIT + 1} tries"
        failed(ctx, c.EVALUATION_FAILED, c.evaluation_job_failed(job.name, tries, detail), detail)
    elif job.complete and not any(not p.terminal for p in pods):
        failed(ctx, c.EVALUATION_RESULT_MISSING, c.evaluation_result_missing(job.name), c.EVALUATION_POD_GONE)
    elif not queue.waiting(ctx, job):
        running = next((p for p in pods if p.phase == "Running" and not p.deleting), None)
        if running is not None:
            ctx.condition(c.EVALUATED, "False", c.EVALUATING, c.evaluating_on(running.name, running.node_name))


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
