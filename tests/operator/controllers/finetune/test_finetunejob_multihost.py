"""The FineTuneJob controller on a multi-host slice (v5p-16: two hosts), as `tpuforge operator` on the
sandbox's kube-apiserver: the attempt's JobSet is created, accepted by the apiserver under JobSet's own CRD
and webhooks, and run by the real JobSet and Job controllers, whose pods the node agent schedules. The test
plays the containers (the test's namespace tells the node agent to start none; the test moves each host's
pod through its phases), so that every ending is exact: a preemption of one host starts the next attempt, a
failure of one host is counted. tests/pipelines/test_multihost.py runs real ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, Operator, eventually, running_operator, until
from tpuforge.api.constants import (
    EXIT_PREEMPTED,
    JOB_COMPLETION_INDEX,
    JOBSET_API_VERSION,
    JOBSET_KIND,
    LABEL_JOBSET_NAME,
)
from tpuforge.controllers.runtime import informer
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_common import train_job_name
from tpuforge.manifests.finetune_training import TRAINER_CONTAINER
from tpuforge_sandbox import Sandbox
from tpuforge_sandbox.agent.agent import CONTAINERS_PLAYED
from tpuforge_sandbox.kubeapi import Kube

pytestmark = pytest.mark.cluster

HOSTS = 2
SLICE = {"slice": "v5p-16"}
JOBSET_CRD_NAME = "jobsets.jobset.x-k8s.io"


@pytest.fixture(scope="module")
def jobset_crd(sandbox: Sandbox, api_client: client.ApiClient) -> str:
    """JobSet's CRD, as its release installs it."""
    assert Kube(api_client).crd_established(JOBSET_CRD_NAME)
    return JOBSET_CRD_NAME


@pytest.fixture
def operator(
    jobset_crd: str, sandbox: Sandbox, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    key, value = CONTAINERS_PLAYED.split("=")
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": {key: value}}})
    yield from running_operator(sandbox, namespace, tmp_path)


@pytest.fixture
def cluster(api_client: client.ApiClient, namespace: str, operator: Operator) -> Cluster:
    return Cluster(api_client, namespace)


def train(name: str, attempt: int) -> str:
    return train_job_name(name, attempt, HOSTS)


def wait_jobset(cluster: Cluster, name: str) -> dict[str, Any]:
    return until(
        lambda: kube_objects.get(cluster.api, JOBSET_API_VERSION, JOBSET_KIND, cluster.ns, name), f"JobSet {name}"
    )


def host_pods(cluster: Cluster, jobset: dict[str, Any]) -> list[str]:
    """The JobSet's pods, one per host in completion-index order, once the Job controller has made them and
    the node agent has placed them (JobSet's webhook admits the second host's pod only once the first is
    placed, for exclusive placement)."""
    js = jobset["metadata"]["name"]
    hosts = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"]

    def placed() -> list[str] | None:
        pods = [
            p
            for p in kube_objects.list_objects(cluster.api, "v1", "Pod", cluster.ns, f"{LABEL_JOBSET_NAME}={js}")
            if not p["metadata"].get("deletionTimestamp")
        ]
        if len(pods) != hosts or not all(p["spec"].get("nodeName") for p in pods):
            return None
        pods.sort(key=lambda p: int(p["metadata"]["annotations"][JOB_COMPLETION_INDEX]))
        return [p["metadata"]["name"] for p in pods]

    return until(placed, f"the {hosts} pods of JobSet {js}, placed")


def set_pod(cluster: Cluster, pod: str, phase: str, exit_code: int | None = None, **status: Any) -> None:
    """The kubelet's part for one pod (by name)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cs: dict[str, Any] = {"name": TRAINER_CONTAINER, "image": "x", "imageID": "", "ready": False, "restartCount": 0}
    if phase == "Running":
        cs.update(ready=True, state={"running": {"startedAt": now}})
    elif exit_code is not None:
        term = {"exitCode": exit_code, "reason": "Error", "message": status.pop("message", "")}
        cs["state"] = {"terminated": {**term, "startedAt": now, "finishedAt": now}}
    body = {"phase": phase, "startTime": now, "containerStatuses": [cs], **status}
    kube_objects.patch(cluster.api, "v1", "Pod", cluster.ns, pod, {"status": body}, subresource="status")


def _assert(ok: bool) -> None:
    assert ok


def test_a_multi_host_job_runs_as_a_jobset_the_apiserver_accepts(cluster: Cluster) -> None:
    name = cluster.create(tpu=SLICE)
    js = wait_jobset(cluster, train(name, 0))
    # Stored as sent: nothing the operator set was pruned by the schema.
    assert js["metadata"]["ownerReferences"][0]["kind"] == "FineTuneJob"
    assert js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == (
        "cloud.google.com/gke-nodepool"
    )
    assert js["spec"]["network"]["enableDNSHostnames"] is True  # (JobSet's webhook adds its defaults)
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 0  # (the schema adds its default restartStrategy)
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["completions"], job["parallelism"], job["completionMode"]) == (HOSTS, HOSTS, "Indexed")
    env = {e["name"] for e in job["template"]["spec"]["containers"][0]["env"]}
    assert {"TPUFORGE_NUM_PROCESSES", "TPUFORGE_PROCESS_ID", "TPUFORGE_COORDINATOR_ADDRESS"} <= env
    assert cluster.children("Job", name) == []  # no plain Job for a multi-host slice
    st = cluster.wait_phase(name, "Pending")
    assert st["attempts"][0]["jobName"] == train(name, 0)
    _, _, created = cluster.wait_event(name, "Created")
    assert created == "training on v5p-16 (2 hosts)"

    pods = host_pods(cluster, js)
    set_pod(cluster, pods[0], "Running")
    set_pod(cluster, pods[1], "Running")
    st = cluster.wait_phase(name, "Training")
    eventually(lambda: _assert(cluster.status(name)["attempts"][0].get("pods") == pods), "every host's pod is named")
    for pod in pods:
        set_pod(cluster, pod, "Succeeded", exit_code=0)
    cluster.wait_phase(name, "Merging")


def test_a_preempted_host_starts_the_next_attempt_and_a_failed_host_counts_one_failure(cluster: Cluster) -> None:
    name = cluster.create(tpu=SLICE, runPolicy={"maxRestarts": 1})
    pods = host_pods(cluster, wait_jobset(cluster, train(name, 0)))
    for pod in pods:
        set_pod(cluster, pod, "Running")
    cluster.wait_phase(name, "Training")

    # Host 1's VM is reclaimed; both hosts agree on a step, checkpoint it and exit 83.
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByKubelet", "message": "Spot"}
    said = "Preempted: checkpoint at step 40"
    set_pod(cluster, pods[1], "Failed", EXIT_PREEMPTED, message=said, conditions=[disrupted])
    set_pod(cluster, pods[0], "Failed", EXIT_PREEMPTED, message=said)
    js = wait_jobset(cluster, train(name, 1))
    st = cluster.wait_phase(name, "Pending")
    assert st["restarts"] == {"failures": 0, "preemptions": 1} and st["attempt"] == 1
    assert st["attempts"][0]["outcome"] == "Preempted"
    kind, _, message = cluster.wait_event(name, "Preempted")
    assert kind == "Warning" and "host 1/2 preempted" in message
    assert f"host 1 of 2 (pod {pods[1]}" in st["attempts"][0]["message"]

    # Attempt 1: host 0 fails; host 1 is stopped by the operator (the JobSet is deleted, its pods with it).
    pods = host_pods(cluster, js)
    for pod in pods:
        set_pod(cluster, pod, "Running")
    cluster.wait_phase(name, "Training")
    set_pod(cluster, pods[0], "Failed", 1, message="FloatingPointError: loss is NaN at step 41")
    eventually(
        lambda: _assert(
            kube_objects.get(cluster.api, JOBSET_API_VERSION, JOBSET_KIND, cluster.ns, train(name, 1)) is None
        ),
        "the failed attempt's JobSet is deleted",
    )
    wait_jobset(cluster, train(name, 2))  # once host 1's pod is gone (garbage-collected with its JobSet)
    st = cluster.status(name)
    assert st["restarts"] == {"failures": 1, "preemptions": 1} and st["attempt"] == 2
    kind, _, message = cluster.wait_event(name, "Retrying")
    assert kind == "Warning" and message.startswith("attempt 1 failed")
    assert "host 0 of 2" in st["attempts"][1]["message"] and "loss is NaN at step 41" in st["attempts"][1]["message"]


def test_an_informer_of_a_kind_the_cluster_does_not_serve_is_ready_and_empty(
    jobset_crd: str, sandbox: Sandbox, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without JobSet's CRD the operator still starts (its JobSet informer lists nothing and says the kind is
    not served); with it, the same informer is served."""
    kube_client.configure(sandbox.kubeconfig)
    monkeypatch.setattr(informer, "UNSERVED_RETRY_SECONDS", 0.2)

    async def start(api_version: str) -> tuple[bool, int]:
        inf: informer.Informer[str, str] = informer.Informer(
            api_version=api_version,
            kind=JOBSET_KIND,
            label_selector="a=b",
            namespaces=[namespace],
            view=lambda obj: "",
            owner=lambda obj: None,
            on_change=lambda owner, before, after: None,
        )
        await asyncio.wait_for(inf.start(), 10)
        await asyncio.sleep(0.5)  # a second look, after the retry delay, changes nothing
        inf.stop()
        return inf.served, len(inf)

    assert asyncio.run(start("jobset.x-k8s.io/v1alpha9")) == (False, 0)  # no such version is served
    assert asyncio.run(start(JOBSET_API_VERSION)) == (True, 0)
