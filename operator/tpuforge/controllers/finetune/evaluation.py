"""The evaluation (spec.evaluation): after the merge, one evaluation Job scores the adapter and the base model;
its `score` container's result becomes status.evaluation and the EvaluationPassed condition. The job ends
Succeeded whatever the evaluation says, its outputs being fine; whether the adapter is promoted is that
condition's business. An evaluation that gives no verdict (its Job failed, its result is unreadable, the job's
deadline passed while it ran) says EvaluationFailed (the Evaluated and EvaluationPassed conditions' reason, a
Warning Event, status.evaluation.result Error) and the job still succeeds with its outputs: a paid training run
is never thrown away for its evaluation. Raising spec.evaluation.rerun after the end runs the evaluation again,
in a Job of its own, without retraining.
"""

from __future__ import annotations

from tpuforge.api import EvaluationStatus, FineTuneJobSpec, FineTunePhase, display, eval_dataset, evaluation_verdict
from tpuforge.api import finetune_reasons as c
from tpuforge.api.configs import output_subdir
from tpuforge.api.constants import EVALUATION_SUBDIR
from tpuforge.api.evaluation import checks
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import onepod as onepod
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune.children import JobView, PodView
from tpuforge.controllers.finetune.context import Base, Ctx
from tpuforge.controllers.finetune.records import eval_result
from tpuforge.controllers.finetune.transitions import to_evaluating, to_exported
from tpuforge.controllers.runtime import defaults
from tpuforge.manifests import finetune_evaluation as m
from tpuforge.manifests.common import Obj
from tpuforge.manifests.finetune_common import COMPONENT_EVALUATOR, eval_job_name

# Pods of one evaluation Job taken away (DisruptionTarget, which its pod failure policy does not count against
# backoffLimit) before the evaluation fails: a drain or an upgrade now and then is retried, a loop is not.
EVAL_MAX_DISRUPTIONS = 3


def objects(ctx: Ctx) -> list[Obj]:
    """The evaluation's ConfigMap and Job, its model volume on the operator's StorageClass unless the spec names
    one."""
    return m.eval_objects(ctx.owner, with_storage_class(ctx.spec, defaults.current().storage_class))


def with_storage_class(spec: FineTuneJobSpec, storage_class: str | None) -> FineTuneJobSpec:
    ev = spec.evaluation
    if ev is None or storage_class is None or ev.model_storage.storage_class_name:
        return spec
    storage = ev.model_storage.model_copy(update={"storage_class_name": storage_class})
    return spec.model_copy(update={"evaluation": ev.model_copy(update={"model_storage": storage})})


def begin(ctx: Ctx, short: str | None = None) -> None:
    e = ctx.spec.evaluation
    assert e is not None
    uri, held_out = eval_dataset(ctx.spec)
    dataset = f"the records spec.dataset.evalFraction holds out of {uri}" if held_out else uri
    to_evaluating(ctx, c.evaluating(list(e.metrics), e.max_examples, dataset, e.slice), e.slice, short)
    ctx.plan.create.extend(objects(ctx))


def requested_run(b: Base) -> int | None:
    """The spec.evaluation.rerun a job that has ended asks for, when no result is from it yet: None when nothing
    is asked, or nothing can be evaluated (no exported adapter)."""
    evaluation = b.o.spec.get("evaluation")
    if b.st.phase not in c.TERMINAL or not isinstance(evaluation, dict):
        return None
    run = evaluation.get("rerun") or 0
    done = b.st.evaluation.run if b.st.evaluation is not None and b.st.evaluation.run is not None else 0
    exported = b.st.outputs is not None and b.st.outputs.adapter_uri
    return run if isinstance(run, int) and run > done and exported else None


def again(ctx: Ctx) -> None:
    """Evaluate the exported outputs again (spec.evaluation.rerun was raised after the end): no retraining. A
    job that failed at its evaluation before it was kept as Succeeded takes this way too."""
    e = ctx.spec.evaluation
    assert e is not None
    ctx.st.evaluation = None
    if ctx.has_condition(c.FAILED):
        ctx.condition(c.FAILED, "False", c.EVALUATING_AGAIN, c.evaluating_again(e.rerun))
    ctx.condition(c.SUCCEEDED, "False", c.EVALUATING_AGAIN, c.evaluating_again(e.rerun))
    ctx.condition(c.EVALUATION_PASSED, "False", c.EVALUATING_AGAIN, c.evaluating_again(e.rerun))
    begin(ctx, ev.evaluating_again(e.rerun))


def step(ctx: Ctx) -> None:
    """Evaluating: (re)create the evaluation Job and follow it to its result."""
    if ctx.spec.evaluation is None:
        # The evaluation was taken out of the spec while it ran: there is nothing left to wait for.
        for job in ctx.o.jobs:
            if job.component == COMPONENT_EVALUATOR and ctx.live(job):
                ctx.delete_job(job)
        ctx.condition(c.EVALUATED, "False", c.NOT_EVALUATED, c.EVALUATION_REMOVED)
        to_exported(ctx, "evaluated", c.NOT_EVALUATED_SUFFIX)
        return
    at = onepod.follow(ctx, current_job(ctx), max_disruptions=EVAL_MAX_DISRUPTIONS)
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
            "run": spec.rerun,
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
    to_exported(ctx, "evaluated", f"; {outcome}: {verdict}")


def current_job(ctx: Ctx) -> str:
    """The evaluation Job of this run (spec.evaluation.rerun)."""
    assert ctx.spec.evaluation is not None
    return eval_job_name(ctx.o.name, ctx.spec.evaluation.rerun)


def failed(ctx: Ctx, reason: str, message: str, detail: str, short: str | None = None) -> None:
    """The evaluation could not give a verdict (`reason`, `message` the whole story, `detail` the last word):
    EvaluationFailed, said by the Evaluated and EvaluationPassed conditions, status.evaluation (result Error) and
    an Event; its Job is stopped; the job keeps its outputs and succeeds."""
    said = message if reason == c.EVALUATION_FAILED else f"{reason}: {message}"
    run = ctx.spec.evaluation.rerun if ctx.spec.evaluation is not None else 0
    ctx.condition(c.EVALUATED, "False", c.EVALUATION_FAILED, said)
    ctx.condition(c.EVALUATION_PASSED, "False", c.EVALUATION_FAILED, c.no_verdict(detail))
    ctx.st.evaluation = EvaluationStatus(
        run=run, result="Error", result_display="Error", message=c.evaluation_error(said)
    )
    # Reason Evaluated, as for a verdict: a reason as long as EvaluationFailed would narrow every Event's line.
    ctx.event("Warning", ev.EVALUATED, short or ev.eval_failed())
    for job in ctx.o.jobs:
        if job.component == COMPONENT_EVALUATOR and ctx.live(job):
            ctx.delete_job(job)
    to_exported(ctx, "evaluated", c.evaluation_failed_note(reason))


def under_way(b: Base) -> bool:
    """The job evaluates (or its evaluation Job waits in Kueue)."""
    return queue.stage(b) == FineTunePhase.EVALUATING


def past_deadline(ctx: Ctx, ran: float, limit: int) -> bool:
    """spec.runPolicy.activeDeadlineSeconds passed: while evaluating, only the evaluation ends (True)."""
    if not under_way(ctx):
        return False
    failed(ctx, c.DEADLINE_EXCEEDED, c.evaluation_deadline(ran, limit), c.evaluation_deadline(ran, limit))
    return True
