"""The FineTuneJob decisions, driven through whole lifecycles on a small simulated cluster: what the plan
creates and deletes is applied to the simulated children, its status is stored, and pods are moved by hand
(as the integration tests do by patching pods/status)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from tests.fixtures.finetune.world import NAME, World, raw_spec, train
from tpuforge import api
from tpuforge.api.constants import CONFIG_FILE
from tpuforge.controllers.finetune.plan import (
    FAILED,
    SPEC_CHANGE_NOT_APPLIED,
    Plan,
    plan,
    status_patch,
)
from tpuforge.manifests.finetune_common import merge_job_name
from tpuforge.manifests.finetune_training import SPEC_KEY


def test_happy_path_to_succeeded_with_the_merged_uri() -> None:
    w = World()
    p = w.step()
    assert [o["kind"] for o in p.create] == ["Role", "RoleBinding", "ConfigMap", "Job"]
    assert w.phase() == api.FineTunePhase.PENDING and w.status.attempt == 0
    assert w.status.start_time is not None and w.status.restarts == api.Restarts()
    w.pod(train(0), "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    assert w.status.attempts[0].pod_name == f"{train(0)}-pod"
    w.pod(train(0), "Succeeded", exit_code=0)
    p = w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    assert [o["kind"] for o in p.create] == ["ConfigMap", "Job"]
    assert w.status.outputs is not None and w.status.outputs.checkpoint_uri == "gs://b/jobs/gemma-verilog/checkpoints"
    w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    w.job_done(merge_job_name(NAME))
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.status.outputs.merged_model_uri == "gs://b/jobs/gemma-verilog/merged"
    assert w.status.completion_time is not None
    assert w.reasons() == ["Created", "Training", "Merging", "Succeeded"]
    assert w.status.attempts[0].outcome == "Succeeded"


def test_reconciling_again_changes_nothing() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Running")
    w.step()
    before = w.status.model_copy(deep=True)
    p = plan(w.observed(), w.now)
    assert p.create == [] and p.delete == [] and p.events == []
    assert status_patch(before, p.status) == {}


def test_the_same_stale_view_gives_the_same_absolute_decision() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Failed", exit_code=1, message="boom")
    a = plan(w.observed(), w.now)
    b = plan(w.observed(), w.now)
    assert a.status == b.status and a.create == b.create
    assert a.status.restarts is not None and a.status.restarts.failures == 1


def test_invalid_spec_fails_naming_the_field_and_creates_nothing() -> None:
    w = World(raw_spec(tpu={"slice": "v5p-8", "mesh": {"fsdp": 1, "tp": 3}}))
    p = w.step()
    assert p.create == []
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "InvalidSpec" and "spec.tpu.mesh" in cond.message
    assert w.events[0][:2] == ("Warning", "Failed") and "spec.tpu.mesh" in w.events[0][2]


def test_preemption_starts_a_new_attempt_that_resumes_and_counts_as_a_preemption() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Running")
    w.step()
    w.status.progress = api.Progress(step=40, total_steps=1000, last_checkpoint_step=40)
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByKubelet", "message": "spot"}
    w.pod(
        train(0),
        "Failed",
        conditions=[disrupted],
        pod_status={"reason": "Terminated"},
        exit_code=83,
        message="Preempted: checkpoint at step 40",
    )
    p = w.step()
    assert w.status.restarts == api.Restarts(preemptions=1, failures=0)
    assert w.status.attempt == 1 and w.phase() == api.FineTunePhase.PENDING
    assert train(1) in [o["metadata"]["name"] for o in p.create if o["kind"] == "Job"]
    cm = next(o for o in p.create if o["kind"] == "ConfigMap")
    assert api.TrainConfig.model_validate_json(cm["data"][CONFIG_FILE]).attempt == 1
    assert w.status.attempts[0].outcome == "Preempted"
    assert w.status.attempts[1].start_step == 40
    assert w.events[-2:] == [
        ("Warning", "Preempted", "attempt 0 preempted on tpu-node"),
        ("Normal", "Resuming", "attempt 1 from step 40, 0 steps lost"),
    ]
    assert w.status.attempts[0].node_name == "tpu-node"
    assert p.delete == []  # the preempted Job has ended: kept for its logs
    w.pod(train(1), "Running")
    w.step()
    w.pod(train(1), "Succeeded", exit_code=0)
    w.step()
    w.job_done(merge_job_name(NAME))
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.status.restarts.preemptions == 1


def test_steps_lost_count_only_what_the_preempted_attempt_did_past_the_checkpoint() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Running")
    w.step()
    stamp = (w.now + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    w.status.progress = api.Progress(step=523, total_steps=1000, last_checkpoint_step=500, updated_at=stamp)
    w.pod(train(0), "Failed", pod_status={"reason": "Evicted"})
    w.step(5)
    assert w.events[-1] == ("Normal", "Resuming", "attempt 1 from step 500, 23 steps lost")
    w.step(30)
    w.pod(train(1), "Running")  # started after the last report: a preemption now loses nothing new
    w.step()
    w.pod(train(1), "Failed", pod_status={"reason": "Evicted"})
    w.step()
    assert w.events[-1] == ("Normal", "Resuming", "attempt 2 from step 500, 0 steps lost")


def test_a_vanished_pod_is_a_preemption_and_its_replacement_is_stopped() -> None:
    w = World()
    w.step()
    first = w.pod(train(0), "Running")
    w.step()
    w.gone(first)
    w.pod(train(0), "Pending", name="replacement")  # the Job controller replaced it
    p = w.step()
    assert w.status.restarts is not None and w.status.restarts.preemptions == 1
    assert w.status.attempts[0].reason == "PodDeleted"
    assert [d.name for d in p.delete] == [train(0)]
    assert w.status.attempt == 1


# The kubelet's eviction of a trainer that outgrew its memory request: status.reason Evicted, the eviction
# manager's message, and DisruptionTarget with TerminationByKubelet (as a node shutdown also sets).
MEMORY_EVICTION = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. Container trainer was "
    "using 131Gi, request is 120Gi, has larger consumption of memory. "
)


def test_an_eviction_for_the_trainers_own_memory_is_a_failure_counted_against_max_restarts() -> None:
    w = World(raw_spec(runPolicy={"maxRestarts": 1}))
    w.step()
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
    for n in range(2):
        w.pod(train(n), "Running")
        w.step()
        w.pod(
            train(n),
            "Failed",
            conditions=[{**disrupted, "message": MEMORY_EVICTION}],
            pod_status={"reason": "Evicted", "message": MEMORY_EVICTION},
            exit_code=83,  # the trainer checkpointed on SIGTERM: still its own doing
            message="Preempted: checkpoint at step 40",
        )
        w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.status.restarts == api.Restarts(failures=2, preemptions=0)
    assert w.status.attempts[0].outcome == "Failed" and w.status.attempts[0].reason == "Evicted"
    cond = w.condition(FAILED)
    assert "Container trainer was using 131Gi, request is 120Gi" in cond.message and "maxRestarts=1" in cond.message


def test_preemptions_resume_up_to_max_preemptions_then_the_job_fails_saying_so() -> None:
    w = World(raw_spec(runPolicy={"maxPreemptions": 2}))
    w.step()
    shutdown = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "TerminationByKubelet",
        "message": "Pod was terminated in response to imminent node shutdown.",
    }
    for n in range(3):
        w.pod(train(n), "Running")
        w.step()
        w.pod(train(n), "Failed", conditions=[shutdown], pod_status={"reason": "Terminated"}, exit_code=83)
        w.step(30)
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.status.restarts == api.Restarts(failures=0, preemptions=3)
    cond = w.condition(FAILED)
    assert cond.reason == "TooManyPreemptions"
    assert "spec.runPolicy.maxPreemptions=2" in cond.message and "imminent node shutdown" in cond.message
    assert w.events[-1] == ("Warning", "Failed", "gave up after 3 preemptions")
    assert train(3) not in w.jobs


def test_max_preemptions_defaults_to_a_generous_limit() -> None:
    assert api.RunPolicy().max_preemptions == 20


def test_failures_are_retried_up_to_max_restarts_then_fail_with_the_message() -> None:
    w = World(raw_spec(runPolicy={"maxRestarts": 2}))
    w.step()
    for n in range(3):
        w.pod(train(n), "Running")
        w.step()
        w.pod(train(n), "Failed", exit_code=1, message=f"ValueError: nan loss (attempt {n})")
        w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.status.restarts == api.Restarts(failures=3, preemptions=0)
    cond = w.condition(FAILED)
    assert cond.reason == "TrainingFailed"
    assert "nan loss (attempt 2)" in cond.message and "maxRestarts=2" in cond.message
    assert w.reasons().count("Retrying") == 2 and w.reasons()[-1] == "Failed"
    assert w.events[-1][2] == "attempt 2 failed (Error); gave up"
    assert w.status.attempt == 2 and train(3) not in w.jobs


def test_a_rejected_config_fails_at_once() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Failed", exit_code=2, message="spec.training.maxSeqLen: too long for the tokenizer")
    p = w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.condition(FAILED).reason == "InvalidConfig"
    assert "maxSeqLen" in w.condition(FAILED).message
    assert not any(o["kind"] == "Job" for o in p.create)


def test_suspend_removes_the_job_and_resume_waits_for_the_old_pod_then_resumes() -> None:
    w = World()
    w.step()
    pod0 = w.pod(train(0), "Running")
    w.step()
    w.spec["runPolicy"] = {"suspend": True}
    w.generation += 1
    p = w.step()
    assert [d.name for d in p.delete] == [train(0)]
    assert w.phase() == api.FineTunePhase.SUSPENDED
    assert w.status.attempts[0].outcome == "Suspended"
    w.step()
    w.spec["runPolicy"] = {"suspend": False}
    w.generation += 1
    p = w.step()
    assert w.phase() == api.FineTunePhase.PENDING and w.status.attempt == 1
    assert p.create == []  # the old trainer is still writing its checkpoint
    assert w.condition("Training").reason == "WaitingForPreviousAttempt"
    w.gone(pod0)
    p = w.step()
    assert train(1) in [o["metadata"]["name"] for o in p.create]
    assert w.reasons()[-2:] == ["Suspended", "Resumed"]
    assert w.status.restarts == api.Restarts()


def test_created_suspended_starts_nothing_until_resumed() -> None:
    w = World(raw_spec(runPolicy={"suspend": True}))
    p = w.step()
    assert p.create == [] and w.phase() == api.FineTunePhase.SUSPENDED
    w.spec["runPolicy"] = {}
    p = w.step()
    assert w.status.attempt == 0 and train(0) in [o["metadata"]["name"] for o in p.create]


def test_deadline_fails_the_job_and_stops_the_trainer() -> None:
    w = World(raw_spec(runPolicy={"activeDeadlineSeconds": 600}))
    p = w.step()
    assert p.requeue_after == 600
    w.pod(train(0), "Running")
    w.step()
    p = w.step(seconds=700)
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.condition(FAILED).reason == "DeadlineExceeded"
    assert [d.name for d in p.delete] == [train(0)]


def test_ttl_deletes_the_finished_job_after_the_delay() -> None:
    w = World(raw_spec(runPolicy={"ttlSecondsAfterFinished": 60}, merge={"enabled": False}))
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    p = w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.status.outputs is not None and w.status.outputs.merged_model_uri is None
    assert p.requeue_after == 60 and not p.delete_self
    p = w.step(seconds=30)
    assert p.requeue_after == 30 and not p.delete_self
    assert w.step(seconds=30).delete_self


def test_changes_to_training_fields_are_not_applied_and_said_once() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Running")
    w.step()
    w.spec["training"] = {**w.spec["training"], "learningRate": 0.5}
    w.spec["runPolicy"] = {"maxRestarts": 7}
    w.spec["images"] = {"trainer": "tpuforge/trainer:hotfix"}
    w.generation += 1
    w.step()
    cond = w.condition(SPEC_CHANGE_NOT_APPLIED)
    assert cond.status == "True" and "spec.training.learningRate" in cond.message
    assert cond.observed_generation == 2 and w.status.observed_generation == 2
    w.step()
    assert w.reasons().count("SpecFrozen") == 1
    # The next attempt keeps the maths it started with and takes the other changes.
    w.pod(train(0), "Failed", exit_code=1, message="boom")
    p = w.step()
    cm = next(o for o in p.create if o["kind"] == "ConfigMap")
    assert api.TrainConfig.model_validate_json(cm["data"][CONFIG_FILE]).training.learning_rate == 1e-4
    job = next(o for o in p.create if o["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "tpuforge/trainer:hotfix"
    assert json.loads(cm["data"][SPEC_KEY])["runPolicy"]["maxRestarts"] == 7
    # Reverting clears the condition.
    w.spec["training"] = {k: v for k, v in w.spec["training"].items() if k != "learningRate"}
    w.step()
    assert w.condition(SPEC_CHANGE_NOT_APPLIED).status == "False"


def test_an_invalid_edit_after_the_start_keeps_the_job_running() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Running")
    w.step()
    w.spec["tpu"] = {"slice": "v5p-8", "mesh": {"fsdp": 1, "tp": 3}}
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    assert "spec.tpu.mesh" in w.condition(SPEC_CHANGE_NOT_APPLIED).message


def test_merge_failure_fails_with_the_merge_pods_message() -> None:
    w = World()
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    merge = merge_job_name(NAME)
    w.pods["merge-pod"] = {
        "metadata": {"name": "merge-pod", "labels": {"job-name": merge, "app.kubernetes.io/component": "merger"}},
        "spec": {"containers": [{"name": "merger"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "merger", "state": {"terminated": {"exitCode": 1, "message": "403 Forbidden on gs://b"}}}
            ],
        },
    }
    w.job_done(merge, complete=False)
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    assert w.condition(FAILED).reason == "MergeFailed"
    assert "403 Forbidden" in w.condition(FAILED).message


def test_unschedulable_pods_say_why_once_a_scale_up_would_have_happened() -> None:
    w = World()
    w.step()
    since = w.now.isoformat().replace("+00:00", "Z")
    unsched = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "no TPU nodes",
        "lastTransitionTime": since,
    }
    w.pod(train(0), "Pending", conditions=[unsched])
    p = w.step()
    assert w.condition("Training").reason == "Pending"  # node pools scale up for pods like this one
    assert p.requeue_after == 299
    w.step(seconds=299)
    assert w.phase() == api.FineTunePhase.PENDING
    assert w.condition("Training").reason == "Unschedulable"
    assert "no TPU nodes" in w.condition("Training").message
    w.pod(train(0), "Pending")  # scheduled at last
    w.step()
    assert w.condition("Training").reason == "Pending"


def test_status_patch_covers_the_operators_fields_and_never_the_trainers() -> None:
    current = api.FineTuneJobStatus.model_validate(
        {"phase": "Training", "progress": {"step": 10, "totalSteps": 100, "loss": 1.2, "updatedAt": "t"}}
    )
    desired = current.model_copy(deep=True)
    desired.phase = api.FineTunePhase.MERGING
    assert desired.progress is not None
    desired.progress = desired.progress.model_copy(update={"percent": 10.0, "step": 999, "loss": 0.0})
    assert status_patch(current, desired) == {"phase": "Merging", "progress": {"percent": 10.0}}
    assert status_patch(current, current) == {}


def trained(w: World, result: api.TrainResult) -> Plan:
    """The trainer of attempt 0 ran and exited 0, writing `result` as its termination message."""
    w.step()
    w.pod(train(0), "Running")
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0, message=result.model_dump_json(by_alias=True, exclude_none=True))
    return w.step()


def merge_config_of(p: Plan) -> dict[str, Any]:
    cm = next(o for o in p.create if o["kind"] == "ConfigMap")
    return json.loads(cm["data"][CONFIG_FILE])  # type: ignore[no-any-return]


BEST_SPEC = {
    "dataset": {"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
    "checkpoint": {"uri": "gs://b/jobs/gemma-verilog/checkpoints", "everySteps": 100, "select": "best"},
    "training": {
        "maxSeqLen": 3072,
        "maxSteps": 1000,
        "warmupSteps": 10,
        "earlyStopping": {"patience": 3, "minDelta": 0.01},
    },
}


def test_early_stop_merges_the_best_step_and_says_why() -> None:
    w = World(raw_spec(**BEST_SPEC))
    result = api.TrainResult(
        message="Stopped early at step 700 of 1000",
        step=700,
        total_steps=1000,
        loss=0.41,
        best=api.StepLoss(step=400, loss=0.8123),
        last_eval=api.StepLoss(step=700, loss=0.83),
        stopped_early=api.EarlyStop(step=700, evals=3, min_delta=0.01),
    )
    p = trained(w, result)
    assert w.phase() == api.FineTunePhase.MERGING
    cfg = merge_config_of(p)
    assert (cfg["step"], cfg["select"]) == (400, "best")
    assert w.status.checkpoint == api.CheckpointStatus(
        select="best",
        last_step=700,
        best_step=400,
        best_eval_loss=0.8123,
        selected_step=400,
        selected_eval_loss=0.8123,
        stopped_early_at=700,
        message=w.status.checkpoint.message if w.status.checkpoint else None,
    )
    cond = w.condition("Training")
    assert cond.reason == "StoppedEarly"
    assert cond.message.startswith(
        "stopped early at step 700: eval loss did not improve by more than 0.01 for 3 evals; "
        "best step 400 (loss 0.8123)"
    )
    assert "merging step 400 (loss 0.8123), the lowest eval loss; training ended at step 700" in cond.message
    assert ("Normal", "EarlyStop", "stopped early at step 700; best step 400") in w.events
    assert "checkpoint" in status_patch(api.FineTuneJobStatus(), w.status)
    # A merge Job deleted meanwhile comes back for the same step.
    del w.objects[("ConfigMap", merge_job_name(NAME))]
    w.jobs.pop(merge_job_name(NAME))
    assert merge_config_of(w.step())["step"] == 400


def test_select_last_merges_the_latest_and_still_reports_the_best() -> None:
    w = World(raw_spec(dataset=BEST_SPEC["dataset"]))
    result = api.TrainResult(
        message="Trained to step 1000 of 1000",
        step=1000,
        total_steps=1000,
        best=api.StepLoss(step=800, loss=0.7),
        last_eval=api.StepLoss(step=1000, loss=0.75),
    )
    p = trained(w, result)
    cfg = merge_config_of(p)
    assert cfg.get("step") is None and cfg["select"] == "last"
    chosen = w.status.checkpoint
    assert chosen is not None
    assert (chosen.selected_step, chosen.selected_eval_loss, chosen.best_step) == (1000, 0.75, 800)
    assert chosen.stopped_early_at is None
    cond = w.condition("Training")
    assert cond.reason == "Completed" and cond.message.startswith("training finished at step 1000")
    assert "EarlyStop" not in w.reasons()


def test_select_best_without_a_readable_result_leaves_the_step_to_the_merge() -> None:
    w = World(raw_spec(**BEST_SPEC))
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0, message="Trained to step 1000 of 1000; loss 0.4")  # an older trainer
    p = w.step()
    cfg = merge_config_of(p)
    assert cfg.get("step") is None and cfg["select"] == "best"
    assert w.status.checkpoint is not None and w.status.checkpoint.selected_step is None
    assert "eval record" in (w.status.checkpoint.message or "")
