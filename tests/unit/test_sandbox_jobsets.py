"""The sandbox's JobSet emulation, its pure parts: the CRD it installs, child Jobs, indexes, the "DNS"
rewrite, status and exclusive placement. tests/integration/test_sandbox_jobset.py runs them on the sandbox."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.fixtures import upstream
from tpuforge.sandbox.agent.jobset_labels import (
    COMPLETION_INDEX,
    EXCLUSIVE_TOPOLOGY,
    JOB_KEY,
    JOBSET_NAME,
    LOOPBACK_PORTS,
)
from tpuforge.sandbox.agent.jobset_network import loopback_ip, pod_hostname, ports_in_env, rewrite_addresses
from tpuforge.sandbox.agent.jobsets import assign_indexes, child_jobs, desired_status, exclusive_nodes
from tpuforge.sandbox.jobset_crd import JOBSET_CRD_FILE, jobset_crd
from tpuforge.sandbox.nodes import GKE_NODEPOOL


def test_the_jobset_crd_in_the_repo_is_the_upstream_file_unchanged() -> None:
    try:
        reference = upstream.upstream_file(upstream.JOBSET_CRD)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert JOBSET_CRD_FILE.read_bytes() == reference.read_bytes()


def _walk(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [(k, v) for k, v in node.items()] + [kv for v in node.values() for kv in _walk(v)]
    if isinstance(node, list):
        return [kv for v in node for kv in _walk(v)]
    return []


def test_the_installed_crd_drops_only_what_kubernetes_1_20_rejects() -> None:
    original = yaml.safe_load(JOBSET_CRD_FILE.read_text())
    crd = jobset_crd()
    assert any(k == "x-kubernetes-validations" for k, _ in _walk(original))
    assert not any(k == "x-kubernetes-validations" for k, _ in _walk(crd))
    assert not any(k == "default" and v == "" for k, v in _walk(crd))
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha2"]
    pod = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicatedJobs"][
        "items"
    ]["properties"]["template"]["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    assert "name" in pod["properties"]["imagePullSecrets"]["items"]["required"]  # a map-list key without default
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


def js(name: str = "run-train-1", replicas: int = 1, hosts: int = 2, **spec: Any) -> dict[str, Any]:
    container = {"name": "t", "env": [{"name": "COORD", "value": f"{name}-trainer-0-0.{name}:8476"}]}
    template = {"spec": {"parallelism": hosts, "completions": hosts, "template": {"spec": {"containers": [container]}}}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": "u-1",
            "annotations": {EXCLUSIVE_TOPOLOGY: GKE_NODEPOOL, LOOPBACK_PORTS: '{"8476": 40001}'},
        },
        "spec": {"replicatedJobs": [{"name": "trainer", "replicas": replicas, "template": template}], **spec},
    }


def test_child_jobs_are_named_labelled_and_owned_as_jobset_does() -> None:
    jobs = child_jobs(js(replicas=2))
    assert [j["metadata"]["name"] for j in jobs] == ["run-train-1-trainer-0", "run-train-1-trainer-1"]
    job = jobs[1]
    assert job["metadata"]["ownerReferences"][0] | {"uid": None} == {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "name": "run-train-1",
        "uid": None,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod_meta = job["spec"]["template"]["metadata"]
    assert pod_meta["labels"][JOBSET_NAME] == "run-train-1"
    assert pod_meta["labels"]["jobset.sigs.k8s.io/job-index"] == "1"
    assert pod_meta["annotations"][EXCLUSIVE_TOPOLOGY] == GKE_NODEPOOL
    assert pod_meta["annotations"][LOOPBACK_PORTS] == '{"8476": 40001}'
    assert job["spec"]["template"]["spec"]["subdomain"] == "run-train-1"
    assert jobs[0]["metadata"]["labels"][JOB_KEY] != job["metadata"]["labels"][JOB_KEY]


def test_ports_and_the_dns_rewrite() -> None:
    assert ports_in_env(js()) == [8476]
    assert ports_in_env(js(network={"enableDNSHostnames": False})) == []
    pod = child_jobs(js())[0]["spec"]["template"]
    rewrite = lambda v: rewrite_addresses(v, pod)  # noqa: E731
    assert rewrite("run-train-1-trainer-0-0.run-train-1:8476") == "127.0.0.1:40001"
    assert rewrite("grpc://run-train-1-trainer-0-1.run-train-1.ns.svc:8476/x") == "grpc://127.0.0.1:40001/x"
    assert rewrite("run-train-1-trainer-0-0.run-train-1:9999") == "run-train-1-trainer-0-0.run-train-1:9999"
    assert rewrite("other-trainer-0-0.other:8476") == "other-trainer-0-0.other:8476"


def pod(uid: str, index: int | None = None, phase: str = "Pending", created: str = "t1") -> dict[str, Any]:
    annotations = {} if index is None else {COMPLETION_INDEX: str(index)}
    return {
        "metadata": {"uid": uid, "name": f"p-{uid}", "creationTimestamp": created, "annotations": annotations},
        "status": {"phase": phase},
    }


def test_indexes_go_to_new_pods_lowest_free_first_and_a_failed_pods_index_is_reused() -> None:
    job = {"spec": {"completions": 3}}
    assert assign_indexes(job, [pod("b", created="t2"), pod("a"), pod("c", created="t3")]) == {"a": 0, "b": 1, "c": 2}
    assert assign_indexes(job, [pod("a", 0, "Running"), pod("b", 1, "Failed"), pod("c")]) == {"c": 1}
    assert assign_indexes(job, [pod("a", 0), pod("b", 1), pod("c", 2, "Succeeded"), pod("d")]) == {}


def test_hostname_and_loopback_address_of_an_indexed_pod() -> None:
    p = {"metadata": {"labels": {"job-name": "x-trainer-0"}, "annotations": {COMPLETION_INDEX: "1"}}, "spec": {}}
    assert pod_hostname(p) == "x-trainer-0-1"
    assert pod_hostname({"metadata": {}, "spec": {"hostname": "h"}}) == "h"
    assert pod_hostname({"metadata": {}, "spec": {}}) is None
    assert [loopback_ip(i) for i in (0, 1, 255)] == ["127.0.0.1", "127.0.0.2", "127.0.1.0"]


def job(name: str, outcome: str | None = None) -> dict[str, Any]:
    conditions = [{"type": outcome, "status": "True"}] if outcome else []
    return {
        "metadata": {"name": name, "uid": name, "labels": {"jobset.sigs.k8s.io/replicatedjob-name": name[:-2]}},
        "spec": {"parallelism": 1},
        "status": {"conditions": conditions},
    }


def test_status_failure_policy_and_success_policy() -> None:
    two = js(replicas=2)
    assert desired_status(two, [job("trainer-0", "Complete"), job("trainer-1")], {}).get("terminalState") is None
    done = desired_status(two, [job("trainer-0", "Complete"), job("trainer-1", "Complete")], {})
    assert (done["terminalState"], done["reason"]) == ("Completed", "AllJobsCompleted")
    assert done["replicatedJobsStatus"] == [
        {"name": "trainer", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}
    ]
    failed = desired_status(two, [job("trainer-0", "Failed"), job("trainer-1")], {})
    assert (failed["terminalState"], failed["reason"]) == ("Failed", "FailedJobs")
    policy = js(replicas=2, failurePolicy={"maxRestarts": 0})
    assert desired_status(policy, [job("trainer-0", "Failed")], {})["reason"] == "ReachedMaxRestarts"
    any_ = js(replicas=2, successPolicy={"operator": "Any"})
    assert desired_status(any_, [job("trainer-0", "Complete"), job("trainer-1")], {})["terminalState"] == "Completed"


def node(name: str, pool: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {GKE_NODEPOOL: pool}}}


def placed(key: str, node_name: str) -> dict[str, Any]:
    return {"metadata": {"labels": {JOB_KEY: key}}, "spec": {"nodeName": node_name}, "status": {"phase": "Running"}}


def test_exclusive_placement_gives_each_job_a_node_pool_of_its_own() -> None:
    nodes = [node("a-0", "a"), node("a-1", "a"), node("b-0", "b")]
    mine = {"metadata": {"annotations": {EXCLUSIVE_TOPOLOGY: GKE_NODEPOOL}, "labels": {JOB_KEY: "k1"}}, "spec": {}}
    names = lambda ns: sorted(n["metadata"]["name"] for n in ns or [])  # noqa: E731
    assert names(exclusive_nodes(mine, [], nodes)) == ["a-0", "a-1", "b-0"]
    assert names(exclusive_nodes(mine, [placed("k1", "a-1")], nodes)) == ["a-0", "a-1"]  # follow the first pod
    assert names(exclusive_nodes(mine, [placed("k2", "a-0")], nodes)) == ["b-0"]  # another Job holds pool a
    assert exclusive_nodes({"metadata": {}, "spec": {}}, [], nodes) is None
