"""How a finished pod's ending is read: success, preemption (resume) or failure (retry, or give up at once)."""

from __future__ import annotations

from typing import Any

import pytest

from tpuforge.controllers.finetune.children import config_view, job_view, pod_ending, pod_view


def raw_pod(
    phase: str,
    exit_code: int | None = None,
    message: str = "",
    reason: str = "",
    container_reason: str = "",
    disruption: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if reason:
        status["reason"], status["message"] = reason, f"the node said {reason}"
    if disruption:
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "spot"}
        )
    if exit_code is not None:
        term = {
            "exitCode": exit_code,
            "reason": container_reason,
            "message": message,
            "finishedAt": "2026-01-01T00:10:00Z",
        }
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": term}}]
    return {
        "metadata": {
            "name": "j-train-0-abcde",
            "labels": {"job-name": "j-train-0", "tpuforge.dev/attempt": "0", "app.kubernetes.io/component": "trainer"},
        },
        "spec": {"containers": [{"name": "trainer"}], "nodeName": "tpu-node-1"},
        "status": status,
    }


@pytest.mark.parametrize(
    ("pod", "outcome", "reason"),
    [
        (raw_pod("Succeeded", 0), "Succeeded", "Completed"),
        (raw_pod("Failed", 143, disruption=True), "Preempted", "DisruptionTarget"),
        (raw_pod("Failed", reason="Evicted"), "Preempted", "Evicted"),
        (raw_pod("Failed", reason="NodeLost"), "Preempted", "NodeLost"),
        (raw_pod("Failed", 137, reason="Terminated"), "Preempted", "Terminated"),
        (raw_pod("Failed", 83, "Preempted: checkpoint at step 40"), "Preempted", "TrainerCheckpointed"),
        (raw_pod("Failed", 1, "Preempted: saved step 7 before SIGTERM deadline"), "Preempted", "TrainerCheckpointed"),
        (raw_pod("Failed", 1, "Traceback ... ValueError: nan loss", container_reason="Error"), "Failed", "Error"),
        (raw_pod("Failed", 137, container_reason="OOMKilled"), "Failed", "OOMKilled"),
        (raw_pod("Failed", 2, "spec.lora.rank: must be > 0"), "Failed", "InvalidConfig"),
        (raw_pod("Failed", reason="UnexpectedAdmissionError"), "Failed", "UnexpectedAdmissionError"),
    ],
)
def test_pod_endings(pod: dict[str, Any], outcome: str, reason: str) -> None:
    end = pod_ending(pod_view(pod))
    assert end is not None
    assert (end.outcome, end.reason) == (outcome, reason)


def kubelet_stopped(reason: str, message: str, disruption: str | None) -> dict[str, Any]:
    """A trainer pod as the kubelet leaves it (pkg/kubelet/eviction, pkg/kubelet/nodeshutdown, ...)."""
    raw = raw_pod("Failed", 137, container_reason="Error")
    raw["status"]["reason"], raw["status"]["message"] = reason, message
    if disruption:
        raw["status"]["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption, "message": message}
        )
    return raw


MEMORY = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 20Mi. Container trainer was "
    "using 130Gi, request is 120Gi, has larger consumption of memory. "
)
DISK = (
    "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 2Gi. Container score "
    "was using 61Gi, request is 0, has larger consumption of ephemeral-storage. "
)
OTHERS = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 20Mi. "
EMPTY_DIR = 'Usage of EmptyDir volume "dshm" exceeds the limit "8Gi". '
CONTAINER_LIMIT = 'Container trainer exceeded its local ephemeral storage limit "1Gi". '
POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. "
SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
CRITICAL = "Preempted in order to admit critical pod"
BY_KUBELET = "TerminationByKubelet"


@pytest.mark.parametrize(
    ("pod", "outcome"),
    [
        (kubelet_stopped("Evicted", MEMORY, BY_KUBELET), "Failed"),
        (kubelet_stopped("Evicted", DISK, BY_KUBELET), "Failed"),
        (kubelet_stopped("Evicted", EMPTY_DIR, None), "Failed"),
        (kubelet_stopped("Evicted", CONTAINER_LIMIT, None), "Failed"),
        (kubelet_stopped("Evicted", POD_LIMIT, None), "Failed"),
        # The node short of memory through others: no container of this pod over its request.
        (kubelet_stopped("Evicted", OTHERS, BY_KUBELET), "Preempted"),
        (kubelet_stopped("Terminated", SHUTDOWN, BY_KUBELET), "Preempted"),
        (kubelet_stopped("Preempting", CRITICAL, BY_KUBELET), "Preempted"),
        (kubelet_stopped("", "", "PreemptionByScheduler"), "Preempted"),
        (kubelet_stopped("", "", "DeletionByTaintManager"), "Preempted"),
        (kubelet_stopped("", "", "EvictionByEvictionAPI"), "Preempted"),
        (kubelet_stopped("", "", "DeletionByPodGC"), "Preempted"),
    ],
)
def test_an_eviction_for_the_pods_own_use_is_a_failure_and_a_reclaim_is_a_preemption(
    pod: dict[str, Any], outcome: str
) -> None:
    end = pod_ending(pod_view(pod))
    assert end is not None and end.outcome == outcome
    if outcome == "Failed":
        assert end.reason == "Evicted" and not end.permanent
        assert pod["status"]["message"].strip() in end.message


def test_a_rejected_config_is_permanent_and_keeps_the_message() -> None:
    end = pod_ending(pod_view(raw_pod("Failed", 2, "spec.lora.rank: must be > 0")))
    assert end is not None and end.permanent
    assert "spec.lora.rank: must be > 0" in end.message and "exit code 2" in end.message


def test_a_failure_says_the_exit_code_and_the_termination_message() -> None:
    end = pod_ending(pod_view(raw_pod("Failed", 1, "ValueError: nan loss at step 12", container_reason="Error")))
    assert end is not None and not end.permanent
    assert "exit code 1" in end.message and "nan loss at step 12" in end.message
    assert end.at == "2026-01-01T00:10:00Z"


def test_long_termination_logs_keep_their_end() -> None:
    log = "x" * 5000 + "RuntimeError: the real cause"
    end = pod_ending(pod_view(raw_pod("Failed", 1, log)))
    assert end is not None and end.message.endswith("RuntimeError: the real cause)")
    assert len(end.message) < 1200


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_live_pods_have_no_ending(phase: str) -> None:
    assert pod_ending(pod_view(raw_pod(phase))) is None


def test_pod_view_reads_scheduling_and_running_state() -> None:
    raw = raw_pod("Pending")
    raw["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes have TPUs"}
    )
    view = pod_view(raw)
    assert view.unschedulable == "Unschedulable: 0/3 nodes have TPUs"
    assert (view.job_name, view.attempt, view.component) == ("j-train-0", 0, "trainer")
    running = raw_pod("Running")
    running["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}}}
    ]
    assert pod_view(running).running_since == "2026-01-01T00:01:00Z"


def test_job_view_reads_conditions() -> None:
    raw = {
        "metadata": {"name": "j-train-1", "labels": {"tpuforge.dev/attempt": "1"}},
        "status": {
            "failed": 1,
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "reached limit"}
            ],
        },
    }
    view = job_view(raw)
    assert view.failed and not view.complete and view.finished
    assert view.failure == "BackoffLimitExceeded: reached limit"
    assert view.attempt == 1


def test_config_view_tolerates_a_missing_or_broken_spec() -> None:
    assert config_view({"metadata": {"name": "c"}, "data": {}}).spec is None
    assert config_view({"metadata": {"name": "c"}, "data": {"finetunejob-spec.json": "{"}}).spec is None
