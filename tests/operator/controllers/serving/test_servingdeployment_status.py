"""ServingDeployment status from what runs: the model source, the phase, and the model being served."""

from __future__ import annotations

from typing import Any

from tpuforge import api
from tpuforge.controllers.serving.controller import observe_rollout, pod_problem, resolve_model
from tpuforge.manifests.serving import ANNOTATION_MODEL_URI

P = api.ServingPhase
OLD, NEW = "gs://b/merged-v1", "gs://b/merged-v2"


def spec(**model: Any) -> api.ServingDeploymentSpec:
    return api.ServingDeploymentSpec.model_validate({"model": model})


def job(phase: str | None, merged: str | None = None, completion: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "completionTime": completion}
    if merged:
        status["outputs"] = {"mergedModelUri": merged}
    return {"metadata": {"uid": "u1"}, "spec": {"model": {"name": "gemma4-tiny"}}, "status": status}


def test_a_uri_is_served_as_is() -> None:
    src = resolve_model(spec(uri=OLD), None)
    assert (src.uri, src.available, src.revision) == (OLD, True, "")


def test_a_job_reference_waits_until_the_job_has_succeeded() -> None:
    ref = spec(fineTuneJobRef={"name": "ft"})
    assert resolve_model(ref, None).reason == "FineTuneJobNotFound"
    training = resolve_model(ref, job("Training"))
    assert (training.uri, training.available, training.failed) == (None, False, False)
    assert "Training" in training.message
    failed = resolve_model(ref, job("Failed"))
    assert failed.failed and failed.reason == "FineTuneJobFailed"
    done = resolve_model(ref, job("Succeeded", NEW))
    assert (done.uri, done.model_id, done.available) == (NEW, "gemma4-tiny", True)


def test_a_rerun_job_gives_a_new_revision_for_the_same_uri() -> None:
    ref = spec(fineTuneJobRef={"name": "ft"})
    first = resolve_model(ref, job("Succeeded", NEW, "2026-01-01T00:00:00Z"))
    second = resolve_model(ref, job("Succeeded", NEW, "2026-02-01T00:00:00Z"))
    assert first.uri == second.uri and first.revision != second.revision


def pod(model: str, ready: bool, node: str | None = "v6e-8-0", deleting: bool = False, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p-{model[-2:]}-{ready}", "annotations": {ANNOTATION_MODEL_URI: model}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conds = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"conditions": conds, **status}}


def deployment(replicas: int, ready: int, updated: int, generation: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            **extra,
        },
    }


def test_no_pod_scheduled_is_pending_then_loading_then_ready() -> None:
    r = observe_rollout(1, deployment(1, 0, 1), [pod(NEW, False, node=None)], NEW, None)
    assert (r.phase, r.ready_replicas) == (P.PENDING, 0)
    r = observe_rollout(1, deployment(1, 0, 1), [pod(NEW, False)], NEW, None)
    assert r.phase == P.LOADING and "compiling" in r.message
    r = observe_rollout(1, deployment(1, 1, 1), [pod(NEW, True)], NEW, None)
    assert (r.phase, r.ready_replicas, r.rolled_out, r.served_uri) == (P.READY, 1, True, NEW)


def test_while_a_recreate_rollout_replaces_the_pod_the_status_says_nothing_serves() -> None:
    """The pod holds ReadWriteOnce disks, so a new model replaces it (Recreate): the status is honest about the
    gap, and names the model being loaded."""
    rolling = deployment(1, 0, 1, generation=2)
    rolling["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    rolling["spec"] = {"strategy": {"type": "Recreate"}}
    r = observe_rollout(1, rolling, [pod(NEW, False)], NEW, OLD)
    assert (r.phase, r.ready_replicas, r.served_uri) == (P.LOADING, 0, NEW)
    assert "nothing serves until the new one is ready" in r.message
    first = {**rolling, "metadata": {"generation": 1}}  # the first rollout: nothing was served before
    assert "nothing serves" not in observe_rollout(1, first, [pod(NEW, False)], NEW, None).message


def test_mid_roll_the_old_model_is_what_is_served() -> None:
    pods = [pod(OLD, True), pod(NEW, False)]
    r = observe_rollout(1, deployment(2, 1, 1, generation=2), pods, NEW, OLD)
    assert (r.phase, r.rolled_out, r.served_uri) == (P.READY, False, OLD)
    r = observe_rollout(1, deployment(1, 1, 1, generation=2), [pod(NEW, True), pod(OLD, True, deleting=True)], NEW, OLD)
    assert (r.rolled_out, r.served_uri) == (True, NEW)


def test_a_failing_fetch_is_named_with_its_termination_message() -> None:
    failing = pod(NEW, False)
    failing["status"]["initContainerStatuses"] = [
        {
            "name": "fetch-model",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "message": "gs://b/m has no _COMPLETE marker"}},
        }
    ]
    reason, message = pod_problem(failing) or ("", "")
    assert reason == "ModelFetchFailed" and "_COMPLETE" in message and "exit code 1" in message
    r = observe_rollout(1, deployment(1, 0, 1), [failing], NEW, None)
    assert (r.phase, r.reason) == (P.LOADING, "ModelFetchFailed")


def test_an_unschedulable_pod_says_why() -> None:
    p = pod(NEW, False, node=None)
    p["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "Insufficient google.com/tpu"}
    )
    r = observe_rollout(1, deployment(1, 0, 1), [p], NEW, None)
    assert (r.phase, r.reason) == (P.PENDING, "Unschedulable") and "google.com/tpu" in r.message


def test_a_stalled_rollout_fails_and_zero_replicas_is_pending() -> None:
    stalled = deployment(1, 0, 1, conditions=[{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}])
    assert observe_rollout(1, stalled, [pod(NEW, False)], NEW, None).phase == P.FAILED
    r = observe_rollout(0, deployment(0, 0, 0), [], NEW, None)
    assert (r.phase, r.reason) == (P.PENDING, "ScaledToZero")
