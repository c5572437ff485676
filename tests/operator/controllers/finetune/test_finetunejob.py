"""The FineTuneJob controller, as `tpuforge operator`, on the sandbox's real kube-apiserver and
kube-controller-manager (Job controller, garbage collector): every phase and way of ending."""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.finetunejob import (
    GC_WAIT,
    Cluster,
    Operator,
    eventually,
)
from tpuforge.api import TrainConfig
from tpuforge.api.constants import CONFIG_FILE, EXIT_PREEMPTED
from tpuforge.kube import objects as kube_objects

pytestmark = pytest.mark.cluster


def test_happy_path_to_succeeded(cluster: Cluster, operator: Operator) -> None:
    name = cluster.create()
    job = cluster.wait_job(cluster.train(name, 0))
    assert job["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"
    for kind in ("ConfigMap", "Role", "RoleBinding", "Job"):
        assert len(cluster.children(kind, name)) == 1, kind
    st = cluster.wait_phase(name, "Pending")
    assert st["attempt"] == 0 and st["restarts"] == {"failures": 0, "preemptions": 0}

    cluster.set_pod(cluster.train(name, 0), "Running")
    cluster.wait_phase(name, "Training")
    # The trainer's report: the operator derives percent and keeps the trainer's keys.
    kube_objects.patch(
        cluster.api,
        "tpuforge.dev/v1alpha1",
        "FineTuneJob",
        cluster.ns,
        name,
        {"status": {"progress": {"step": 25, "totalSteps": 100, "loss": 1.25, "tokensPerSecond": 700.0}}},
        subresource="status",
    )
    eventually(lambda: _assert(cluster.status(name)["progress"].get("percent") == 25.0), "percent is derived")
    assert cluster.status(name)["progress"]["loss"] == 1.25

    cluster.set_pod(cluster.train(name, 0), "Succeeded", exit_code=0)
    cluster.wait_phase(name, "Merging")
    cluster.wait_job(cluster.merge(name))
    cluster.set_pod(cluster.merge(name), "Succeeded", exit_code=0)
    st = cluster.wait_phase(name, "Succeeded")
    assert st["outputs"]["mergedModelUri"] == f"gs://b/jobs/{name}/merged"
    assert st["completionTime"] and st["observedGeneration"] == 1
    # Event timestamps have one-second resolution: compare what was said, not the order.
    assert sorted(r for _, r, _ in cluster.said(name, "Succeeded")) == ["Created", "Merging", "Succeeded", "Training"]
    eventually(  # the series follow the status write
        lambda: _assert(
            operator.metric("tpuforge_finetunejob_phase", namespace=cluster.ns, name=name, phase="Succeeded") == 1
        ),
        "the phase series says Succeeded",
    )


def _assert(ok: bool) -> None:
    assert ok


def test_preemption_starts_a_new_attempt_that_resumes(cluster: Cluster, operator: Operator) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Running")
    cluster.wait_phase(name, "Training")
    disrupted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByKubelet",
        "message": "Spot VM reclaimed",
    }
    cluster.set_pod(
        cluster.train(name, 0),
        "Failed",
        exit_code=EXIT_PREEMPTED,
        message="Preempted: checkpoint at step 40",
        conditions=[disrupted],
        reason="Terminated",
    )
    cluster.wait_job(cluster.train(name, 1))
    st = cluster.wait_phase(name, "Pending")
    assert st["restarts"] == {"failures": 0, "preemptions": 1} and st["attempt"] == 1
    assert st["attempts"][0]["outcome"] == "Preempted"
    cm = kube_objects.get(cluster.api, "v1", "ConfigMap", cluster.ns, cluster.train(name, 1))
    assert cm is not None and TrainConfig.model_validate_json(cm["data"][CONFIG_FILE]).attempt == 1
    kind, _, message = cluster.wait_event(name, "Preempted")
    assert kind == "Warning" and message.startswith("attempt 0 preempted")
    kind, _, message = cluster.wait_event(name, "Resuming")
    assert kind == "Normal" and message.startswith("attempt 1 ")

    cluster.set_pod(cluster.train(name, 1), "Running")
    cluster.wait_phase(name, "Training")
    cluster.set_pod(cluster.train(name, 1), "Succeeded", exit_code=0)
    cluster.wait_job(cluster.merge(name))
    cluster.set_pod(cluster.merge(name), "Succeeded", exit_code=0)
    st = cluster.wait_phase(name, "Succeeded")
    assert st["restarts"] == {"failures": 0, "preemptions": 1}
    assert (
        operator.metric("tpuforge_finetunejob_restarts_total", namespace=cluster.ns, name=name, reason="preemption")
        == 1
    )


def test_failures_are_retried_then_fail_with_the_reason_and_message(cluster: Cluster) -> None:
    name = cluster.create(runPolicy={"maxRestarts": 1})
    for attempt in (0, 1):
        cluster.wait_job(cluster.train(name, attempt))
        cluster.set_pod(cluster.train(name, attempt), "Running")
        cluster.wait_phase(name, "Training")
        cluster.set_pod(
            cluster.train(name, attempt),
            "Failed",
            exit_code=1,
            message=f"FloatingPointError: loss is NaN at step {10 + attempt}",
        )
    st = cluster.wait_phase(name, "Failed")
    assert st["restarts"] == {"failures": 2, "preemptions": 0}
    failed = cluster.condition(name, "Failed")
    assert failed["reason"] == "TrainingFailed"
    assert "loss is NaN at step 11" in failed["message"] and "maxRestarts=1" in failed["message"]
    reasons = [r for _, r, _ in cluster.said(name, "Failed")]
    assert reasons.count("Retrying") == 1 and reasons.count("Failed") == 1
    assert len(cluster.children("Job", name)) == 2  # no third attempt


def test_a_rejected_config_fails_at_once(cluster: Cluster) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Failed", exit_code=2, message="training.maxSeqLen exceeds the model")
    cluster.wait_phase(name, "Failed")
    failed = cluster.condition(name, "Failed")
    assert failed["reason"] == "InvalidConfig" and "maxSeqLen exceeds the model" in failed["message"]
    assert len(cluster.children("Job", name)) == 1


def test_an_invalid_spec_fails_naming_the_field_and_creates_nothing(cluster: Cluster) -> None:
    # A check that needs the model catalog, which the CRD's rules leave to the operator: fsdp x tp is the
    # slice's 8 chips on its one host, but tp=8 does not divide the 31B's 4 global kv heads.
    name = cluster.create(tpu={"slice": "v6e-8", "mesh": {"fsdp": 1, "tp": 8}})
    cluster.wait_phase(name, "Failed")
    failed = cluster.condition(name, "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.tpu.mesh" in failed["message"]
    kind, _, message = cluster.wait_event(name, "Failed")
    assert kind == "Warning" and "spec.tpu.mesh" in message
    for kind in ("ConfigMap", "Role", "RoleBinding", "Job"):
        assert cluster.children(kind, name) == [], kind


def test_suspend_removes_the_job_and_resume_starts_a_new_attempt(cluster: Cluster) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Running")
    cluster.wait_phase(name, "Training")
    cluster.edit(name, {"runPolicy": {"suspend": True}})
    cluster.wait_phase(name, "Suspended")
    eventually(
        lambda: _assert(kube_objects.get(cluster.api, "batch/v1", "Job", cluster.ns, cluster.train(name, 0)) is None),
        "the training Job is removed",
    )
    assert cluster.condition(name, "Suspended")["status"] == "True"
    cluster.edit(name, {"runPolicy": {"suspend": False}})
    cluster.wait_job(cluster.train(name, 1))
    st = cluster.wait_phase(name, "Pending")
    assert st["attempt"] == 1 and st["restarts"] == {"failures": 0, "preemptions": 0}
    reasons = [r for _, r, _ in cluster.said(name, "Resumed")]
    assert reasons.count("Suspended") == 1 and reasons.count("Resumed") == 1


def test_active_deadline_fails_the_job_and_stops_training(cluster: Cluster) -> None:
    name = cluster.create(runPolicy={"activeDeadlineSeconds": 3})
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Running")
    cluster.wait_phase(name, "Failed", timeout=20)
    assert cluster.condition(name, "Failed")["reason"] == "DeadlineExceeded"
    eventually(lambda: _assert(cluster.children("Job", name) == []), "the training Job is removed")


def test_ttl_deletes_the_finished_job_and_its_children(cluster: Cluster) -> None:
    name = cluster.create(runPolicy={"ttlSecondsAfterFinished": 2}, merge={"enabled": False})
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Succeeded", exit_code=0)
    st = cluster.wait_phase(name, "Succeeded")
    assert st["outputs"] == {"checkpointUri": f"gs://b/jobs/{name}/checkpoints"}
    eventually(lambda: _assert(cluster.get(name) is None), "the FineTuneJob is deleted", timeout=20)
    eventually(lambda: _assert(cluster.children("Job", name) == []), "its Jobs are garbage-collected")


def test_deleting_the_job_garbage_collects_every_child(cluster: Cluster, operator: Operator) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    info = {"namespace": cluster.ns, "name": name, "model": "gemma4-31b", "slice": "v6e-4"}
    eventually(lambda: _assert(operator.metric("tpuforge_finetunejob_info", **info) == 1), "its series exist")
    cluster.delete(name)
    kinds = ("ConfigMap", "Role", "RoleBinding", "Job", "Pod")
    eventually(lambda: _assert(all(cluster.children(k, name) == [] for k in kinds)), "every child is gone", GC_WAIT)
    eventually(lambda: _assert(operator.metric("tpuforge_finetunejob_info", **info) is None), "its series are gone")


def test_spec_changes_to_training_fields_are_not_applied(cluster: Cluster) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Running")
    cluster.wait_phase(name, "Training")
    cluster.edit(name, {"training": {"learningRate": 0.5}, "lora": {"rank": 8}})
    eventually(lambda: _assert(cluster.status(name).get("observedGeneration") == 2), "the edit is observed")
    cond = cluster.condition(name, "SpecChangeNotApplied")
    assert cond["status"] == "True"
    assert "spec.lora.rank" in cond["message"] and "spec.training.learningRate" in cond["message"]
    kind, _, message = cluster.wait_event(name, "SpecFrozen")
    assert kind == "Warning" and message == "2 frozen fields not applied"  # the condition names them
    # A retry keeps the maths the run started with.
    cluster.set_pod(cluster.train(name, 0), "Failed", exit_code=1, message="transient")
    cluster.wait_job(cluster.train(name, 1))
    cm = kube_objects.get(cluster.api, "v1", "ConfigMap", cluster.ns, cluster.train(name, 1))
    assert cm is not None
    cfg = TrainConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg.lora.rank == 64 and cfg.training.learning_rate == 1e-4


def test_a_job_waits_for_the_job_it_starts_from_then_trains_from_its_merged_model(cluster: Cluster) -> None:
    sft = f"sft-{uuid.uuid4().hex[:6]}"
    name = cluster.create(model={"name": "gemma4-31b", "fineTuneJobRef": {"name": sft}})
    cluster.wait_phase(name, "Pending")
    waiting = cluster.condition(name, "Training")
    assert waiting["reason"] == "WaitingForModel" and repr(sft) in waiting["message"]
    assert cluster.wait_event(name, "NoModelYet")[0] == "Normal"
    assert cluster.children("Job", name) == []

    cluster.create(sft)
    cluster.wait_job(cluster.train(sft, 0))
    cluster.set_pod(cluster.train(sft, 0), "Succeeded", exit_code=0)
    cluster.wait_job(cluster.merge(sft))
    cluster.set_pod(cluster.merge(sft), "Succeeded", exit_code=0)
    merged = cluster.wait_phase(sft, "Succeeded")["outputs"]["mergedModelUri"]
    # The referenced job's change wakes the waiting one.
    cluster.wait_job(cluster.train(name, 0))
    assert cluster.status(name)["model"] == {"fineTuneJob": sft, "uri": merged}
    cm = kube_objects.get(cluster.api, "v1", "ConfigMap", cluster.ns, cluster.train(name, 0))
    assert cm is not None and TrainConfig.model_validate_json(cm["data"][CONFIG_FILE]).model_uri == merged
