"""JobSet for real in the sandbox: a hand-written JobSet on the emulated v5p-16 slice (two hosts), through the
apiserver with JobSet's webhooks, the JobSet controller, the Job controller and garbage collector, and the node
agent (scheduler, kubelet and the DNS stand-in by which the hosts reach each other)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import (
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    JOB_COMPLETION_INDEX,
    LABEL_JOBSET_NAME,
    TPU_RESOURCE,
)
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.agent.scheduling import EXCLUSIVE_TOPOLOGY
from tpuforge_sandbox.nodes import GKE_NODEPOOL

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
HOSTS = ("v5p-16-spot-0-0", "v5p-16-spot-0-1")
# Process 0 listens on the coordinator address, process 1 connects to it by process 0's DNS name; each
# prints what it saw. Both exit 0.
RENDEZVOUS = """
import json, os, socket, time
host, port = os.environ['COORD'].rsplit(':', 1)
seen = {k: os.environ.get(k) for k in ('HOSTNAME', 'JOB_COMPLETION_INDEX', 'PROCESS_ID', 'COORD',
                                       'TPUFORGE_METRICS_ADDR', 'XLA_FLAGS')}
if os.environ['PROCESS_ID'] == '0':
    with socket.create_server(('127.0.0.1', int(port))) as s:
        conn, _ = s.accept()
        seen['heard'] = conn.recv(100).decode()
else:
    for _ in range(200):
        try:
            with socket.create_connection((host, int(port))) as c:
                c.sendall(b'hello from ' + os.environ['HOSTNAME'].encode())
            break
        except OSError:
            time.sleep(0.1)
print(json.dumps(seen), flush=True)
"""
# Exits 83 on SIGTERM (a trainer that saved its checkpoint), else waits; process `FAIL` exits 3 at once.
WAIT_OR_FAIL = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(83))
print('started', flush=True)
if os.environ['PROCESS_ID'] == os.environ.get('FAIL'):
    sys.exit(3)
time.sleep(300)
"""


def jobset(name: str, code: str, *, suspend: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A JobSet as the operator writes one for a two-host v5p-16 slice."""
    tpu_slice = TPU_SLICES["v5p-16"]
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", code],
        "env": [
            {"name": "COORD", "value": f"{name}-trainer-0-0.{name}:8476"},
            {
                "name": "PROCESS_ID",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_COMPLETION_INDEX}']"}},
            },
            *({"name": k, "value": v} for k, v in (env or {}).items()),
        ],
        "resources": {"limits": {TPU_RESOURCE: str(tpu_slice.chips_per_host)}},
    }
    pod_spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "nodeSelector": {GKE_TPU_ACCELERATOR: tpu_slice.accelerator, GKE_TPU_TOPOLOGY: tpu_slice.topology},
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    job_spec = {
        "parallelism": tpu_slice.hosts,
        "completions": tpu_slice.hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": pod_spec},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "annotations": {EXCLUSIVE_TOPOLOGY: GKE_NODEPOOL}},
        "spec": {
            "suspend": suspend,
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [{"name": "trainer", "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def read_jobset(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return obj


def terminal(custom: client.CustomObjectsApi, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    js = wait_for(
        lambda: (js := read_jobset(custom, ns, name)).get("status", {}).get("terminalState") and js,
        timeout,
        f"JobSet {ns}/{name} to finish",
    )
    return dict(js)


def condition(js: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in js.get("status", {}).get("conditions", []) if c["type"] == type_), None)


def jobset_pods(core: client.CoreV1Api, ns: str, name: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector=f"{LABEL_JOBSET_NAME}={name}").items
    return sorted(pods, key=lambda p: int(p.metadata.annotations.get(JOB_COMPLETION_INDEX, "-1")))


def test_a_jobset_runs_one_indexed_pod_per_host_that_reach_each_other_by_name(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, api_client: client.ApiClient, namespace: str
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, jobset("rdv", RENDEZVOUS))
    js = terminal(custom, namespace, "rdv")
    assert js["status"]["terminalState"] == "Completed"
    done = condition(js, "Completed")
    assert done is not None and (done["status"], done["reason"]) == ("True", "AllJobsCompleted")
    counts = ("name", "ready", "succeeded", "failed", "active", "suspended")
    assert [{k: r.get(k, 0) for k in counts} for r in js["status"]["replicatedJobsStatus"]] == [
        {"name": "trainer", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]

    # One child Job, owned by the JobSet, named <jobset>-<replicatedJob>-<jobIndex>.
    jobs = client.BatchV1Api(api_client).list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs] == ["rdv-trainer-0"]
    assert [(r.kind, r.name, r.controller) for r in jobs[0].metadata.owner_references] == [("JobSet", "rdv", True)]

    # Two pods, indexes 0 and 1, one on each host of the one v5p-16 node pool.
    pods = jobset_pods(core, namespace, "rdv")
    assert [p.metadata.annotations[JOB_COMPLETION_INDEX] for p in pods] == ["0", "1"]
    assert [p.metadata.labels[JOB_COMPLETION_INDEX] for p in pods] == ["0", "1"]
    assert sorted(p.spec.node_name for p in pods) == list(HOSTS)
    pools = {core.read_node(h).metadata.labels[GKE_NODEPOOL] for h in HOSTS}
    assert pools == {"v5p-16-spot"}
    assert {p.spec.subdomain for p in pods} == {"rdv"}
    assert {p.status.phase for p in pods} == {"Succeeded"}

    seen = [json.loads(core.read_namespaced_pod_log(p.metadata.name, namespace)) for p in pods]
    for i, s in enumerate(seen):
        assert s["HOSTNAME"] == f"rdv-trainer-0-{i}"
        assert s["JOB_COMPLETION_INDEX"] == s["PROCESS_ID"] == str(i)  # the Job controller's own variable
        assert s["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    # "DNS": process 0's name became one loopback port, the same in both hosts' environment.
    assert seen[0]["COORD"] == seen[1]["COORD"] and seen[0]["COORD"].startswith("127.0.0.1:")
    assert seen[0]["COORD"] != "127.0.0.1:8476"
    # Each host has its own loopback address, so two hosts' servers on one port do not collide.
    ips = [p.status.pod_ip for p in pods]
    assert [s["TPUFORGE_METRICS_ADDR"] for s in seen] == ips
    assert len(set(ips)) == 2 and all(ip.startswith("127.") for ip in ips)
    assert seen[0]["heard"] == "hello from rdv-trainer-0-1"

    # The headless Service the pods' subdomain names, owned by the JobSet.
    svc = core.read_namespaced_service("rdv", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.selector == {LABEL_JOBSET_NAME: "rdv"}
    assert [r.name for r in svc.metadata.owner_references] == ["rdv"]

    # Deleting the JobSet deletes its Jobs, pods and Service (the garbage collector, by owner references).
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "rdv")

    def gone() -> bool:
        batch = client.BatchV1Api(api_client)
        try:
            core.read_namespaced_service("rdv", namespace)
            return False
        except ApiException as e:
            if e.status != 404:
                raise
        return not batch.list_namespaced_job(namespace).items and not jobset_pods(core, namespace, "rdv")

    wait_for(gone, 60, "the JobSet's children to be garbage collected")


def test_one_failing_pod_fails_the_jobset_and_stops_the_other(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, namespace: str
) -> None:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, jobset("bad", WAIT_OR_FAIL, env={"FAIL": "1"})
    )
    js = terminal(custom, namespace, "bad")
    assert js["status"]["terminalState"] == "Failed"
    failed = condition(js, "Failed")
    assert failed is not None and (failed["status"], failed["reason"]) == ("True", "ReachedMaxRestarts")
    assert js["status"]["replicatedJobsStatus"][0]["failed"] == 1

    def others_stopped() -> bool:
        pods = jobset_pods(core, namespace, "bad")
        return all(p.status.phase in ("Succeeded", "Failed") for p in pods)

    wait_for(others_stopped, 30, "the other host's pod to be stopped")
    codes = {
        p.metadata.annotations[JOB_COMPLETION_INDEX]: p.status.container_statuses[0].state.terminated.exit_code
        for p in jobset_pods(core, namespace, "bad")
    }
    assert codes["1"] == 3
    assert codes.get("0", 83) == 83  # SIGTERM from the Job controller's deletion (or already deleted)


def test_preempting_one_host_fails_the_jobset(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, sandbox: Sandbox, namespace: str
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, jobset("spot", WAIT_OR_FAIL))

    def both_started() -> bool:
        pods = jobset_pods(core, namespace, "spot")
        return len(pods) == 2 and all(
            sandbox.pod_log(namespace, p.metadata.name, "main").exists()
            and "started" in sandbox.pod_log(namespace, p.metadata.name, "main").read_text()
            for p in pods
        )

    wait_for(both_started, 60, "both hosts' pods to start")
    victim = next(p for p in jobset_pods(core, namespace, "spot") if p.spec.node_name == HOSTS[1])
    sandbox.preempt(HOSTS[1])

    p = core.read_namespaced_pod(victim.metadata.name, namespace)
    assert (p.status.phase, p.status.reason) == ("Failed", "Terminated")
    disruption = next(c for c in p.status.conditions if c.type == "DisruptionTarget")
    assert (disruption.status, disruption.reason) == ("True", "TerminationByKubelet")
    assert p.status.container_statuses[0].state.terminated.exit_code == 83
    js = terminal(custom, namespace, "spot")
    assert js["status"]["terminalState"] == "Failed"


def test_a_suspended_jobset_runs_nothing_until_resumed(
    custom: client.CustomObjectsApi, core: client.CoreV1Api, api_client: client.ApiClient, namespace: str
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, jobset("later", "pass", suspend=True))
    js = wait_for(
        lambda: condition(read_jobset(custom, namespace, "later"), "Suspended"),
        30,
        "the Suspended condition",
    )
    assert (js["status"], js["reason"]) == ("True", "SuspendedJobs")
    # Its Jobs exist, suspended, and no pod runs.
    jobs = client.BatchV1Api(api_client).list_namespaced_job(namespace).items
    assert jobs and all(j.spec.suspend for j in jobs)
    assert jobset_pods(core, namespace, "later") == []
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "later", {"spec": {"suspend": False}})
    done = terminal(custom, namespace, "later")
    assert done["status"]["terminalState"] == "Completed"
    resumed = condition(done, "Suspended")
    assert resumed is not None and (resumed["status"], resumed["reason"]) == ("False", "ResumeJobs")
