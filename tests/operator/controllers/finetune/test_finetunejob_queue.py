"""FineTuneJobs through the real Kueue controller: the chart's Kueue objects (ResourceFlavors, a ClusterQueue,
a LocalQueue, as `helm template` renders them with kueue.enabled) on the sandbox, with quota for one v6e-4
slice. Two jobs name the queue: Kueue admits the first and holds the second, which shows phase Queued with
Kueue's own reason and accrues nothing; when the first's training ends, Kueue admits the second.

The jobs' pods have no node to run on (the test plays their kubelet), as in test_finetunejob.py beside this
file; Kueue admits by quota, not by nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, Operator, running_operator, until
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox
from tpuforge_sandbox.demo.kueue import KUEUE_PLURALS, kueue_objects
from tpuforge_sandbox.kubeapi import Kube

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[4]

QUEUE = "tpu"
# One v6e-4 slice of quota (4 chips), and the CPU flavor the merge Jobs are admitted to.
FLAVOR = {
    "name": "tpu-v6e-4",
    "accelerator": "tpu-v6e-slice",
    "topology": "2x2",
    "spot": False,
    "tpu": 4,
    "cpu": 200,
    "memory": "800Gi",
}


def kueue_objects_for(namespace: str, tmp_path: Path) -> list[dict[str, Any]]:
    values = {
        "kueue": {
            "enabled": True,
            "clusterQueue": f"cq-{namespace}",
            "flavors": [FLAVOR],
            "localQueues": [{"namespace": namespace, "name": QUEUE}],
        }
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return kueue_objects(ROOT, path)


@pytest.fixture
def queue(api_client: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[str]:
    custom = client.CustomObjectsApi(api_client)
    objs = kueue_objects_for(namespace, tmp_path)
    for obj in objs:  # ResourceFlavors are cluster-wide and shared between tests
        Kube(api_client).apply_custom_object(obj, KUEUE_PLURALS[obj["kind"]])
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    group, version = cq["apiVersion"].split("/")
    name = cq["metadata"]["name"]

    def active() -> bool:
        obj = custom.get_cluster_custom_object(group, version, "clusterqueues", name)
        return any(c["type"] == "Active" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))

    until(active, "the ClusterQueue to be active")
    yield QUEUE
    custom.delete_cluster_custom_object(group, version, "clusterqueues", name)


@pytest.fixture
def operator(sandbox: Sandbox, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    yield from running_operator(sandbox, namespace, tmp_path)


def workload_of(cluster: Cluster, job: str) -> dict[str, Any] | None:
    for w in kube_objects.list_objects(cluster.api, "kueue.x-k8s.io/v1beta2", "Workload", cluster.ns):
        if any(r["kind"] == "Job" and r["name"] == job for r in w["metadata"].get("ownerReferences") or []):
            return w
    return None


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def test_the_second_job_waits_queued_with_kueues_reason_and_runs_when_the_first_finishes(
    api_client: client.ApiClient, namespace: str, queue: str, operator: Operator
) -> None:
    cluster = Cluster(api_client, namespace)
    first = cluster.create(queueName=queue)
    cluster.wait_phase(first, "Pending")
    assert cluster.wait_job(cluster.train(first, 0))["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    # Kueue admitted the first: its Workload holds the quota and its Job is no longer suspended.
    admitted = until(
        lambda: (w := workload_of(cluster, cluster.train(first, 0))) and condition(w, "Admitted") and w,
        "the first job's Workload to be admitted",
    )
    assert condition(admitted, "Admitted")["status"] == "True"  # type: ignore[index]
    until(lambda: not cluster.wait_job(cluster.train(first, 0))["spec"].get("suspend"), "the first Job to run")

    second = cluster.create(queueName=queue)
    st = cluster.wait_phase(second, "Queued")
    queued = cluster.condition(second, "Queued")
    assert queued["status"] == "True"
    assert "insufficient" in queued["message"] or "quota" in queued["message"], queued
    wl = until(lambda: workload_of(cluster, cluster.train(second, 0)), "the second job's Workload")
    reserved = condition(wl, "QuotaReserved")
    assert reserved is not None and reserved["status"] == "False"
    assert reserved["message"] in queued["message"]  # Kueue's own words
    assert cluster.wait_job(cluster.train(second, 0))["spec"]["suspend"] is True
    # Nothing counts while queued: no ETA, no TPU time or cost.
    assert not (st.get("progress") or {}).get("etaDisplay")
    assert not (st.get("cost") or {}).get("estimatedUSD")
    kind, _, message = cluster.wait_event(second, "Queued")
    assert kind == "Normal" and message

    # The first trains and finishes; its quota frees, and Kueue admits the second.
    cluster.set_pod(cluster.train(first, 0), "Running")
    cluster.wait_phase(first, "Training")
    cluster.set_pod(cluster.train(first, 0), "Succeeded", exit_code=0)
    cluster.wait_phase(first, "Merging")
    cluster.wait_event(second, "Admitted")
    st = cluster.wait_phase(second, "Pending")
    assert cluster.condition(second, "Queued")["status"] == "False"
    assert not cluster.wait_job(cluster.train(second, 0))["spec"].get("suspend")
    cluster.set_pod(cluster.train(second, 0), "Running")
    cluster.wait_phase(second, "Training")
