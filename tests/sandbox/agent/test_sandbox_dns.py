"""The node agent's stand-ins for cluster DNS and the scheduler's exclusive placement, for the pods the real
JobSet and Job controllers make: hostname.subdomain names become loopback ports, pods named so get loopback
addresses of their own, and each child Job of an exclusive JobSet gets a node pool of its own."""

from __future__ import annotations

from typing import Any

from tpuforge_sandbox.agent.dns import OWN_ADDRESS, LoopbackDns, loopback_ip, pod_hostname
from tpuforge_sandbox.agent.scheduling import EXCLUSIVE_TOPOLOGY, JOB_KEY, exclusive_nodes
from tpuforge_sandbox.nodes import GKE_NODEPOOL


def pod(uid: str, hostname: str = "", subdomain: str = "run", ns: str = "ns") -> dict[str, Any]:
    spec = {"hostname": hostname, "subdomain": subdomain} if subdomain else {}
    return {"metadata": {"uid": uid, "namespace": ns, "name": uid}, "spec": spec}


def test_names_under_the_pods_subdomain_become_one_loopback_port_per_host_and_port() -> None:
    dns = LoopbackDns()
    p0, p1 = pod("a", "run-trainer-0-0"), pod("b", "run-trainer-0-1")
    coord = dns.rewrite("run-trainer-0-0.run:8476", p0)
    assert coord.startswith("127.0.0.1:") and coord != "127.0.0.1:8476"
    # Every pod that names that host and port gets the same address, however fully it is qualified.
    assert dns.rewrite("grpc://run-trainer-0-0.run.ns.svc.cluster.local:8476/x", p1) == f"grpc://{coord}/x"
    assert dns.rewrite("run-trainer-0-1.run:8476", p0) != coord  # another host
    assert dns.rewrite("run-trainer-0-0.run:9999", p0) != coord  # another port
    # Names under another subdomain, and pods with none, are left alone.
    assert dns.rewrite("x-0.other:8476", p0) == "x-0.other:8476"
    assert dns.rewrite("run-trainer-0-0.run:8476", pod("c", subdomain="")) == "run-trainer-0-0.run:8476"
    # The same names in another namespace are other hosts.
    assert dns.rewrite("run-trainer-0-0.run:8476", pod("d", "h", ns="other")) != coord


def test_pods_named_by_hostname_get_loopback_addresses_of_their_own_and_give_them_back() -> None:
    dns = LoopbackDns()
    assert dns.pod_ip(pod("plain", subdomain="")) == "127.0.0.1"
    a, b = dns.pod_ip(pod("a", "h-0")), dns.pod_ip(pod("b", "h-1"))
    assert len({a, b, "127.0.0.1"}) == 3 and a.startswith("127.") and b.startswith("127.")
    assert dns.pod_ip(pod("a", "h-0")) == a  # stable for the pod's life
    dns.release("a")
    assert dns.pod_ip(pod("c", "h-2")) == a  # reused once free
    assert [loopback_ip(i) for i in (0, 1, 255)] == ["127.0.0.1", "127.0.0.2", "127.0.1.0"]
    # A pod without a subdomain that asks for one (a Deployment's replicas on fixed ports) gets one too.
    own = pod("own", subdomain="")
    own["metadata"]["annotations"] = {OWN_ADDRESS: "true"}
    assert dns.pod_ip(own) not in {a, b, "127.0.0.1"}
    assert pod_hostname({"spec": {"hostname": "x-trainer-0-1"}}) == "x-trainer-0-1"
    assert pod_hostname({"spec": {}}) is None


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
