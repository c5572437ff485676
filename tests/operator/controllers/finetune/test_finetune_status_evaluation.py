"""The FineTuneJob's export and evaluation decisions, on the simulated cluster of test_finetune_status_plan:
adapter-only jobs (the merge Job exports just the PEFT adapter), then the evaluation Job, whose `score`
container's termination message carries the scores. A result below the thresholds still ends Succeeded (the
outputs are fine) with EvaluationPassed False; an evaluation that gives no verdict (its Job failed, its result
is unreadable, the deadline passed) says EvaluationFailed and the job still succeeds with its outputs, and
spec.evaluation.rerun runs the evaluation again without retraining."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.finetune.evaluation import EVAL, OUT, REPORT, eval_pod, eval_spec, result
from tests.fixtures.finetune.world import NAME, World, raw_spec, train
from tpuforge import api
from tpuforge.api.constants import CONFIG_FILE, EXIT_BAD_CONFIG
from tpuforge.controllers.finetune.children import JobView
from tpuforge.controllers.finetune.evaluation import EVAL_MAX_DISRUPTIONS, with_storage_class
from tpuforge.controllers.finetune.plan import (
    EVALUATED,
    EVALUATION_PASSED,
    FAILED,
    MERGED,
    SUCCEEDED,
    ChildRef,
    plan,
    status_patch,
)
from tpuforge.manifests.finetune_common import eval_job_name, merge_job_name
from tpuforge.manifests.finetune_evaluation import EVAL_BACKOFF_LIMIT
from tpuforge.metrics import FineTuneJobCollector, finetunejob_sample

ADAPTER = f"{OUT}/adapter"
MERGE = merge_job_name(NAME)


def evaluation_failed(w: World, event: str = "evaluation failed, outputs kept") -> api.Condition:
    """The evaluation gave no verdict: the job kept its outputs and succeeded, saying EvaluationFailed (the
    Evaluated and EvaluationPassed conditions, status.evaluation, a Warning). The Evaluated condition."""
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.status.outputs is not None and w.status.outputs.adapter_uri == ADAPTER
    assert FAILED not in [c.type for c in w.status.conditions]
    cond = w.condition(EVALUATED)
    assert (cond.status, cond.reason) == ("False", "EvaluationFailed")
    passed = w.condition(EVALUATION_PASSED)
    assert (passed.status, passed.reason) == ("False", "EvaluationFailed")
    e = w.status.evaluation
    assert e is not None and (e.result, e.passed, e.run) == ("Error", None, 0)
    assert e.message is not None and "raise spec.evaluation.rerun" in e.message
    assert "evaluation failed" in w.condition(SUCCEEDED).message
    assert ("Warning", "Evaluated", event) in w.events
    return cond


def to_evaluating(w: World) -> None:
    """Train and export: the job is Evaluating, its eval Job created."""
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    w.job_done(MERGE)
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING


def test_adapter_only_exports_the_adapter_and_succeeds_with_its_uri() -> None:
    w = World(raw_spec(merge={"enabled": False, "writeAdapter": True}))
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    p = w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    assert [o["kind"] for o in p.create] == ["ConfigMap", "Job"]
    config = json.loads(p.create[0]["data"][CONFIG_FILE])
    assert config["writeAdapter"] is True and config["writeMerged"] is False
    assert w.condition(MERGED).reason == "Exporting" and ADAPTER in w.condition(MERGED).message
    w.job_done(MERGE)
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.status.outputs is not None
    assert w.status.outputs.adapter_uri == ADAPTER and w.status.outputs.merged_model_uri is None
    merged = w.condition(MERGED)
    assert (merged.status, merged.reason, merged.message) == (
        "True",
        "AdapterExported",
        f"adapter exported to {ADAPTER}",
    )
    assert "no merged model" in w.condition(SUCCEEDED).message
    assert w.reasons() == ["Created", "Merging", "Succeeded"]
    assert w.events[1][2].startswith("exporting") and w.events[2][2].startswith("adapter in")
    assert w.status.evaluation is None and not any(k == "Job" and n == EVAL for k, n in w.objects)


def test_a_merge_with_an_adapter_records_both_outputs() -> None:
    w = World(raw_spec(merge={"enabled": True, "writeAdapter": True}))
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    p = w.step()
    assert json.loads(p.create[0]["data"][CONFIG_FILE])["writeMerged"] is True
    w.job_done(MERGE)
    w.step()
    assert w.status.outputs is not None
    assert (w.status.outputs.merged_model_uri, w.status.outputs.adapter_uri) == (OUT, ADAPTER)
    assert w.condition(MERGED).message == f"merged model in {OUT}; adapter in {ADAPTER}"


def test_merged_adapter_and_a_passing_evaluation() -> None:
    w = World(eval_spec(merged=True))
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    w.job_done(MERGE)
    p = w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    assert [(o["kind"], o["metadata"]["name"]) for o in p.create] == [("ConfigMap", EVAL), ("Job", EVAL)]
    assert w.status.outputs is not None and w.status.outputs.adapter_uri == ADAPTER
    evaluated = w.condition(EVALUATED)
    assert (evaluated.status, evaluated.reason) == ("False", "Evaluating")
    assert "gs://b/data/eval.jsonl" in evaluated.message and "v6e-8" in evaluated.message
    assert w.status.progress is None or w.status.progress.eta_seconds in (None, 0)

    eval_pod(w, "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    assert w.condition(EVALUATED).message == "pod eval-pod is evaluating on node tpu-v6e-node"
    eval_pod(w, "Succeeded", exit_code=0, message=result(em=1.0, loss=0.5))
    w.job_done(EVAL)
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    e = w.status.evaluation
    assert e is not None
    assert e.metrics == {"exactMatch": 1.0, "loss": 0.5} and e.base_metrics == {"exactMatch": 0.0, "loss": 3.25}
    assert (e.examples, e.report_uri, e.passed, e.result, e.result_display) == (20, REPORT, True, "Passed", "Passed")
    assert e.message == "loss 0.5 <= maxLoss 1.5; exactMatch 1.00 >= minExactMatch 0.50"
    assert (w.condition(EVALUATED).status, w.condition(EVALUATED).reason) == ("True", "Evaluated")
    assert REPORT in w.condition(EVALUATED).message and "20 records" in w.condition(EVALUATED).message
    passed = w.condition(EVALUATION_PASSED)
    assert (passed.status, passed.reason, passed.message) == ("True", "Passed", e.message)
    assert (w.status.outputs.merged_model_uri, w.status.outputs.adapter_uri) == (OUT, ADAPTER)
    assert w.reasons() == ["Created", "Merging", "Evaluating", "Evaluated", "Succeeded"]
    assert ("Normal", "Evaluated", "eval passed: em 1.00 (base 0.00)") in w.events
    assert "evaluation passed" in w.condition(SUCCEEDED).message


def test_below_threshold_still_succeeds_but_does_not_pass() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Succeeded", exit_code=0, message=result(em=0.2, loss=0.5))
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    e = w.status.evaluation
    assert e is not None and (e.passed, e.result) == (False, "Failed")
    assert e.message == "exactMatch 0.20 < minExactMatch 0.50; loss 0.5 <= maxLoss 1.5"
    cond = w.condition(EVALUATION_PASSED)
    assert (cond.status, cond.reason, cond.message) == ("False", "BelowThreshold", e.message)
    assert ("Warning", "Evaluated", "eval below threshold: em 0.20 < 0.50") in w.events
    assert w.condition(SUCCEEDED).status == "True" and FAILED not in [c.type for c in w.status.conditions]
    assert w.status.outputs is not None and w.status.outputs.adapter_uri == ADAPTER


def test_a_missing_thresholded_metric_fails_the_verdict_not_the_job() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Succeeded", exit_code=0, message=json.dumps({"metrics": {"exactMatch": 0.9}, "examples": 3}))
    w.step()
    e = w.status.evaluation
    assert w.phase() == api.FineTunePhase.SUCCEEDED and e is not None and e.passed is False
    assert e.message is not None and e.message.startswith("loss missing from the result (maxLoss 1.5)")
    assert e.report_uri == REPORT  # the pod did not say: where the evaluation writes it
    assert ("Warning", "Evaluated", "eval below threshold") in w.events


def test_evaluating_again_and_after_the_end_changes_nothing() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Running")
    w.step()
    for _ in range(2):
        before = w.status.model_copy(deep=True)
        p = plan(w.observed(), w.now)
        assert p.create == [] and p.delete == [] and p.events == []
        assert status_patch(before, p.status) == {}
    eval_pod(w, "Succeeded", exit_code=0, message=result())
    w.job_done(EVAL)
    w.step()
    before = w.status.model_copy(deep=True)
    p = plan(w.observed(), w.now)
    assert p.create == [] and p.delete == [] and p.events == []
    assert status_patch(before, p.status) == {}


def test_an_operator_restart_mid_evaluation_decides_the_same() -> None:
    """A restarted operator sees the stored status and the children from its first LIST: the Job is there, so
    nothing is created; before the Job shows up, creating it again is the same deterministic object."""
    w = World(eval_spec())
    to_evaluating(w)
    stored = api.FineTuneJobStatus.model_validate(w.status.model_dump(mode="json", by_alias=True))
    w.status = stored
    p = plan(w.observed(), w.now)
    assert p.create == [] and p.events == [] and status_patch(stored, p.status) == {}
    job = w.jobs.pop(EVAL)
    again = plan(w.observed(), w.now)
    assert [o["metadata"]["name"] for o in again.create] == [EVAL, EVAL]
    assert again.create[1] == w.objects[("Job", EVAL)] and again.events == []
    w.jobs[EVAL] = job
    eval_pod(w, "Succeeded", exit_code=0, message=result())
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED


def test_a_rejected_eval_config_fails_at_once_with_the_message() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Failed", exit_code=EXIT_BAD_CONFIG, message="dataset gs://b/data/eval.jsonl has no records")
    w.step()  # before the Job's own Failed (its pod failure policy fails it on this exit code)
    cond = evaluation_failed(w)
    assert "has no records" in cond.message and "not retried" in cond.message
    assert "has no records" in w.condition(EVALUATION_PASSED).message


def test_a_crash_is_left_to_the_jobs_retries_then_fails_with_the_last_message() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Failed", name="eval-1", exit_code=1, message="vLLM: out of memory")
    p = w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING and p.delete == []
    eval_pod(w, "Failed", name="eval-2", exit_code=1, message="loss: RESOURCE_EXHAUSTED on device", init=True)
    w.job_done(EVAL, complete=False)
    w.step()
    cond = evaluation_failed(w)
    assert f"after {EVAL_BACKOFF_LIMIT + 1} tries" in cond.message
    assert "RESOURCE_EXHAUSTED" in cond.message  # the init container's message, the pod's last word


def test_a_job_failed_by_its_pod_failure_policy_says_it_was_not_retried() -> None:
    """On clusters with pod failure policies the Job fails itself on a rejected config, and that can be seen
    before the pod's own ending."""
    w = World(eval_spec())
    to_evaluating(w)
    v = w.jobs[EVAL]
    w.jobs[EVAL] = JobView(v.name, v.component, None, False, True, "PodFailurePolicy: exit code 2", False)
    w.step()
    assert "failed at once (a rejected config); last: PodFailurePolicy" in evaluation_failed(w).message


def test_an_unreadable_result_fails_with_a_clear_reason() -> None:
    for message, said in (
        ("Traceback: done", "not JSON"),
        (json.dumps({"examples": 3}), "without metrics"),
        (json.dumps({"metrics": {"exactMatch": "high"}}), "metrics.exactMatch"),
        ("", "without writing its result"),
    ):
        w = World(eval_spec())
        to_evaluating(w)
        eval_pod(w, "Succeeded", exit_code=0, message=message)
        w.step()
        cond = evaluation_failed(w, "evaluation result unreadable")
        assert cond.message.startswith("EvaluationResultUnreadable: ") and said in cond.message, cond.message


def test_a_completed_job_whose_pod_is_gone_fails_saying_so() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    w.job_done(EVAL)
    w.step()
    cond = evaluation_failed(w)
    assert cond.message.startswith("EvaluationResultMissing: ") and "spec.evaluation.rerun" in cond.message


def test_a_completed_job_waits_for_its_pods_news() -> None:
    """The Job's Complete can arrive before the pod's Succeeded (two watches): wait for the pod."""
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Running")
    w.job_done(EVAL)
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    eval_pod(w, "Succeeded", exit_code=0, message=result())
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED


def test_removing_the_evaluation_midway_stops_it_and_succeeds() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Running")
    w.spec = {k: v for k, v in w.spec.items() if k != "evaluation"}
    w.generation = 2
    p = w.step()
    assert ChildRef("batch/v1", "Job", EVAL) in p.delete
    assert w.phase() == api.FineTunePhase.SUCCEEDED and w.status.evaluation is None
    assert w.condition(EVALUATED).reason == "NotEvaluated"


def test_the_evaluation_status_is_the_operators_to_write() -> None:
    current = api.FineTuneJobStatus(phase=api.FineTunePhase.EVALUATING)
    desired = current.model_copy(
        update={"phase": api.FineTunePhase.SUCCEEDED, "evaluation": api.EvaluationStatus(passed=True)}
    )
    assert status_patch(current, desired) == {
        "phase": "Succeeded",
        "evaluation": {"metrics": {}, "baseMetrics": {}, "passed": True},
    }


def scraped(collector: FineTuneJobCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_carry_the_scores_and_the_verdict_and_go_with_the_object() -> None:
    collector = FineTuneJobCollector()
    passed, below, crashed, evaluating = World(eval_spec()), World(eval_spec()), World(eval_spec()), World(eval_spec())
    for w in (passed, below, crashed, evaluating):
        to_evaluating(w)
    eval_pod(passed, "Succeeded", exit_code=0, message=result(em=1.0, loss=0.5))
    eval_pod(below, "Succeeded", exit_code=0, message=result(em=0.2, loss=0.5))
    eval_pod(crashed, "Failed", exit_code=1, message="boom")
    crashed.job_done(EVAL, complete=False)
    for name, w in (("passed", passed), ("below", below), ("crashed", crashed), ("evaluating", evaluating)):
        w.step()
        collector.set("ns", name, finetunejob_sample("ns", name, w.spec, w.status))
    got = scraped(collector)

    def value(family: str, name: str, **labels: str) -> float | None:
        return got.get((family, tuple(sorted({"namespace": "ns", "name": name, **labels}.items()))))

    eval_metric = "tpuforge_finetunejob_eval_metric"
    assert value(eval_metric, "passed", metric="exactMatch", model="adapter") == 1.0
    assert value(eval_metric, "passed", metric="exactMatch", model="base") == 0.0
    assert value(eval_metric, "passed", metric="loss", model="adapter") == 0.5
    assert value(eval_metric, "passed", metric="loss", model="base") == 3.25
    assert value(eval_metric, "below", metric="exactMatch", model="adapter") == 0.2
    assert [value("tpuforge_finetunejob_eval_passed", n) for n in ("passed", "below", "crashed", "evaluating")] == [
        1,
        0,
        None,  # no verdict: the series is absent, not 0
        None,
    ]
    assert [value("tpuforge_finetunejob_eval_failed", n) for n in ("passed", "below", "crashed", "evaluating")] == [
        0,
        0,
        1,
        0,
    ]
    assert value(eval_metric, "crashed", metric="loss", model="adapter") is None
    collector.forget("ns", "passed")
    assert not any(dict(labels).get("name") == "passed" for _, labels in scraped(collector))


def test_pass_at_k_is_held_to_its_threshold_headlined_and_exported() -> None:
    checker = {"image": "c", "command": ["true"]}
    spec = eval_spec(metrics=["passAtK"], code={"checker": checker}, thresholds={"minPassAt": {"1": 0.6}})
    collector = FineTuneJobCollector()
    good, bad = World(spec), World(spec)
    for w, at1 in ((good, 0.8), (bad, 0.2)):
        to_evaluating(w)
        message = {"metrics": {"pass@1": at1, "pass@5": 1.0}, "baseMetrics": {"pass@1": 0.0, "pass@5": 0.0},
                   "examples": 12, "reportUri": REPORT}  # fmt: skip
        eval_pod(w, "Succeeded", exit_code=0, message=json.dumps(message))
        w.step()
        assert w.phase() == api.FineTunePhase.SUCCEEDED
    g, b = good.status.evaluation, bad.status.evaluation
    assert g is not None and b is not None
    assert (g.passed, g.message) == (True, "pass@1 0.80 >= minPassAt.1 0.60")
    assert (b.passed, b.result, b.message) == (False, "Failed", "pass@1 0.20 < minPassAt.1 0.60")
    assert (g.result_display, b.result_display) == ("Passed (pass@1 0.80)", "Failed (pass@1 0.20)")  # kubectl's EVAL
    assert g.base_metrics == {"pass@1": 0.0, "pass@5": 0.0}
    assert ("Normal", "Evaluated", "eval passed: pass@1 0.80 (base 0.00)") in good.events  # as much as fits
    assert ("Warning", "Evaluated", "eval below threshold: pass@1 0.20 < 0.60") in bad.events
    assert bad.condition(EVALUATION_PASSED).reason == "BelowThreshold"
    collector.set("ns", "good", finetunejob_sample("ns", "good", good.spec, good.status))
    got = scraped(collector)
    labels = {"namespace": "ns", "name": "good", "metric": "pass@1", "model": "adapter"}
    assert got[("tpuforge_finetunejob_eval_metric", tuple(sorted(labels.items())))] == 0.8


def test_pass_at_k_is_held_by_its_intervals_low_bound_and_the_failures_are_kept() -> None:
    checker = {"image": "c", "command": ["true"]}
    spec = eval_spec(metrics=["passAtK"], code={"checker": checker}, thresholds={"minPassAt": {"1": 0.6}})
    worlds = {}
    for name, low in (("confident", 0.65), ("lucky", 0.45)):
        w = World(spec)
        to_evaluating(w)
        message = {"metrics": {"pass@1": 0.7, "pass@5": 1.0}, "baseMetrics": {"pass@1": 0.1, "pass@5": 0.3},
                   "intervals": {"pass@1": {"low": low, "high": 0.8}, "pass@5": {"low": 1.0, "high": 1.0}},
                   "baseIntervals": {"pass@1": {"low": 0.0, "high": 0.2}, "pass@5": {"low": 0.1, "high": 0.5}},
                   "failures": {"mismatch": 7, "truncated": 2}, "baseFailures": {"syntax": 40},
                   "examples": 12, "reportUri": REPORT}  # fmt: skip
        eval_pod(w, "Succeeded", exit_code=0, message=json.dumps(message))
        w.step()
        worlds[name] = w
    good, bad = worlds["confident"].status.evaluation, worlds["lucky"].status.evaluation
    assert good is not None and bad is not None
    assert (good.passed, good.message) == (True, "pass@1 0.70 (95% CI 0.65-0.80): low 0.65 >= minPassAt.1 0.60")
    assert (bad.passed, bad.message) == (False, "pass@1 0.70 (95% CI 0.45-0.80): low 0.45 < minPassAt.1 0.60")
    assert bad.intervals is not None and bad.intervals["pass@1"] == api.ConfidenceInterval(low=0.45, high=0.8)
    assert (bad.failures, bad.base_failures) == ({"mismatch": 7, "truncated": 2}, {"syntax": 40})
    wire = bad.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["baseIntervals"]["pass@5"] == {"low": 0.1, "high": 0.5}
    assert ("Warning", "Evaluated", "eval below: pass@1 low 0.45 < 0.60") in worlds["lucky"].events


def taken_away(w: World, name: str, reason: str, message: str, disruption: str | None) -> None:
    """An evaluation pod the kubelet or a controller stopped: its pod-level reason and DisruptionTarget."""
    eval_pod(w, "Failed", name=name, exit_code=137)
    status = w.pods[name]["status"]
    status["reason"], status["message"] = reason, message
    if disruption is not None:
        status["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": message}
        ]


def test_an_evaluation_evicted_for_its_own_disk_use_fails_at_once_naming_what_to_raise() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    taken_away(w, "eval-1", "Evicted", 'Usage of EmptyDir volume "models" exceeds the limit "73Gi". ', None)
    w.step()
    cond = evaluation_failed(w)
    assert 'EmptyDir volume "models"' in cond.message and "spec.evaluation.modelStorage.size" in cond.message


def test_evaluation_pods_taken_away_are_retried_a_few_times_then_the_evaluation_fails() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    drained = ("", "Eviction API: evicting", "EvictionByEvictionAPI")
    for i in range(EVAL_MAX_DISRUPTIONS):
        taken_away(w, f"eval-{i}", *drained)
        w.step()
        assert w.phase() == api.FineTunePhase.EVALUATING  # the Job's pod failure policy ignores it: a new pod
    taken_away(w, "eval-last", *drained)
    w.step()
    assert f"taken away {EVAL_MAX_DISRUPTIONS + 1} times" in evaluation_failed(w).message


def test_an_evaluation_past_its_deadline_fails_naming_the_field() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    v = w.jobs[EVAL]
    failure = "DeadlineExceeded: Job was active longer than specified deadline"
    w.jobs[EVAL] = JobView(v.name, v.component, None, False, True, failure, False)
    w.step()
    assert "spec.evaluation.activeDeadlineSeconds=14400" in evaluation_failed(w).message


def test_the_evaluation_volume_takes_the_operators_storage_class_unless_the_spec_names_one() -> None:
    spec = api.validate_finetune(eval_spec())
    assert spec.evaluation is not None
    chosen = with_storage_class(spec, "hyperdisk-balanced")
    assert chosen.evaluation is not None and chosen.evaluation.model_storage.storage_class_name == "hyperdisk-balanced"
    assert with_storage_class(spec, None) == spec
    own = spec.model_copy(
        update={
            "evaluation": spec.evaluation.model_copy(
                update={"model_storage": api.EvalModelStorage(storageClassName="x")}
            )
        }
    )
    assert with_storage_class(own, "hyperdisk-balanced") == own


def test_the_jobs_deadline_passing_while_it_evaluates_ends_only_the_evaluation() -> None:
    """An evaluation Pending for hours on busy nodes does not throw away the training run at the deadline."""
    w = World({**eval_spec(), "runPolicy": {"activeDeadlineSeconds": 3600}})
    to_evaluating(w)
    eval_pod(w, "Pending")
    p = w.step(3600)
    cond = evaluation_failed(w)
    assert cond.message.startswith("DeadlineExceeded: spec.runPolicy.activeDeadlineSeconds=3600 passed")
    assert ChildRef("batch/v1", "Job", EVAL) in p.delete  # the stuck evaluation gives its node back


def test_raising_rerun_evaluates_the_exported_outputs_again_in_a_job_of_its_own_without_retraining() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    eval_pod(w, "Failed", exit_code=1, message="vLLM: out of memory")
    w.job_done(EVAL, complete=False)
    w.step()
    evaluation_failed(w)
    done_at, trained = w.status.completion_time, [n for n in w.jobs if n != EVAL]
    assert plan(w.observed(), w.now).create == []  # nothing asked: the job stays as it ended
    w.spec = {**w.spec, "evaluation": {**w.spec["evaluation"], "rerun": 1}}
    w.generation += 1
    p = w.step()
    again = eval_job_name(NAME, 1)
    assert w.phase() == api.FineTunePhase.EVALUATING
    assert [(o["kind"], o["metadata"]["name"]) for o in p.create] == [("ConfigMap", again), ("Job", again)]
    assert [n for n in w.jobs if n not in (EVAL, again)] == trained  # no training or merge Job again
    assert w.condition(SUCCEEDED).status == "False" and w.status.evaluation is None
    assert [(e.type, e.reason, e.message) for e in p.events] == [("Normal", "Evaluating", "evaluating again (rerun 1)")]
    eval_pod(w, "Succeeded", name="eval-again", exit_code=0, message=result(em=0.9))
    w.pods["eval-again"]["metadata"]["labels"]["job-name"] = again
    w.step(7200)  # long past any deadline of the first run: a rerun has only its Job's own
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    e = w.status.evaluation
    assert e is not None and (e.run, e.passed, e.metrics["exactMatch"]) == (1, True, 0.9)
    assert w.condition(EVALUATION_PASSED).status == "True"
    # The outputs did not change: the completion time, which tells ServingDeployments a new model, stays.
    assert w.status.completion_time == done_at
    before = w.status.model_copy(deep=True)
    p = plan(w.observed(), w.now)
    assert p.create == [] and p.events == [] and status_patch(before, p.status) == {}


def test_a_job_failed_at_its_evaluation_by_an_older_operator_can_be_evaluated_again() -> None:
    w = World(eval_spec())
    to_evaluating(w)
    w.status.phase = api.FineTunePhase.FAILED
    w.status.conditions = api.set_condition(w.status.conditions, FAILED, "True", "EvaluationFailed", "old", 1, "t")
    w.spec = {**w.spec, "evaluation": {**w.spec["evaluation"], "rerun": 1}}
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    assert (w.condition(FAILED).status, w.condition(FAILED).reason) == ("False", "EvaluatingAgain")
