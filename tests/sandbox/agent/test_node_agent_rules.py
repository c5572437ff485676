"""The node agent's rules that need no cluster: scheduling, environment, path mapping, node pools, images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpuforge.api.constants import GKE_SPOT, GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, TPU_RESOURCE
from tpuforge_sandbox.agent.attachments import Attachments
from tpuforge_sandbox.agent.podenv import ConfigError, PathMap, container_env, expand
from tpuforge_sandbox.agent.runtimes import project_bin, runtime_for
from tpuforge_sandbox.agent.scheduling import pick_node, tolerates, tpu_in_use, tpu_request
from tpuforge_sandbox.config import parse_node_pools
from tpuforge_sandbox.nodes import emulated_nodes, node_status


def api_nodes(spec: str) -> list[dict[str, Any]]:
    """Node JSON as the apiserver returns it for the agent's own nodes."""
    out = []
    for n in emulated_nodes(parse_node_pools(spec)):
        obj = n.manifest()
        obj["status"] = node_status(n, "2026-01-01T00:00:00Z", 10250)
        out.append(obj)
    return out


def tpu_pod(chips: int, accelerator: str = "tpu-v5p-slice", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "nodeSelector": {GKE_TPU_ACCELERATOR: accelerator},
            "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "resources": {"limits": {TPU_RESOURCE: str(chips)}}}],
            **spec,
        },
    }


def test_node_pools_parse_and_become_gke_labelled_nodes() -> None:
    nodes = emulated_nodes(parse_node_pools("v5p-8:spot=1,v6e-8=2,v5p-16=1,cpu=1"))
    assert [n.name for n in nodes] == [
        "v5p-8-spot-0",
        "v6e-8-0",
        "v6e-8-1",
        "v5p-16-0-0",
        "v5p-16-0-1",
        "cpu-0",
    ]
    v5p = nodes[0]
    assert v5p.labels[GKE_TPU_ACCELERATOR] == "tpu-v5p-slice"
    assert v5p.labels[GKE_TPU_TOPOLOGY] == "2x2x1"
    assert v5p.labels[GKE_SPOT] == "true"
    assert v5p.resources()[TPU_RESOURCE] == "4"
    assert v5p.taints == [{"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    assert nodes[1].labels[GKE_TPU_TOPOLOGY] == "2x4" and nodes[1].chips == 8
    assert GKE_SPOT not in nodes[1].labels
    assert nodes[3].chips == 4  # one host of a two-host v5p-16
    assert nodes[-1].taints == [] and TPU_RESOURCE not in nodes[-1].resources()


@pytest.mark.parametrize(
    ("spec", "words"),
    [("v9-8=1", "unknown node kind 'v9-8'"), ("v5p-8=x", "not an integer"), ("cpu:big=1", "unknown option")],
)
def test_bad_node_pool_specs_name_the_problem(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_node_pools(spec)


def test_tpu_pods_go_to_the_matching_node_while_chips_are_free() -> None:
    nodes = api_nodes("v5p-8=1,v6e-8=1,cpu=1")
    assert pick_node(tpu_pod(4), nodes, {}) == ("v5p-8-0", "")
    assert pick_node(tpu_pod(8, "tpu-v6e-slice"), nodes, {}) == ("v6e-8-0", "")
    node, why = pick_node(tpu_pod(4), nodes, {"v5p-8-0": 4})
    assert node is None
    assert why == f"0/3 nodes are available: 1 Insufficient {TPU_RESOURCE}, 2 node(s) didn't match node selector."


def test_untolerated_taints_keep_plain_pods_on_the_cpu_node() -> None:
    nodes = api_nodes("v5p-8=1,cpu=1")
    plain = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert pick_node(plain, nodes, {}) == ("cpu-0", "")
    node, why = pick_node(plain, nodes[:1], {})
    assert node is None and "had taint {google.com/tpu: present}, that the pod didn't tolerate" in why


def test_required_node_affinity_is_honoured() -> None:
    nodes = api_nodes("v5p-8=1,v6e-8=1")
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GKE_TPU_TOPOLOGY, "operator": "In", "values": ["2x4"]}]}
                ]
            }
        }
    }
    pod = tpu_pod(4, affinity=affinity)
    pod["spec"].pop("nodeSelector")
    assert pick_node(pod, nodes, {})[0] == "v6e-8-0"


def test_tolerations_match_like_kubernetes() -> None:
    taint = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
    assert tolerates([{"operator": "Exists"}], taint)
    assert tolerates([{"key": TPU_RESOURCE, "operator": "Exists"}], taint)
    assert tolerates([{"key": TPU_RESOURCE, "value": "present"}], taint)
    assert not tolerates([{"key": TPU_RESOURCE, "value": "other"}], taint)
    assert not tolerates([{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoExecute"}], taint)


def test_tpu_requests_count_init_containers_and_finished_pods_free_their_chips() -> None:
    pod = {
        "spec": {
            "containers": [{"resources": {"requests": {TPU_RESOURCE: "4"}}}, {}],
            "initContainers": [{"resources": {"limits": {TPU_RESOURCE: "8"}}}],
        }
    }
    assert tpu_request(pod) == 8
    pods = [
        {"metadata": {"uid": "a"}, "spec": {"nodeName": "n", **tpu_pod(4)["spec"]}, "status": {"phase": "Running"}},
        {"metadata": {"uid": "b"}, "spec": {"nodeName": "n", **tpu_pod(4)["spec"]}, "status": {"phase": "Succeeded"}},
        {"metadata": {"uid": "c"}, "spec": {"nodeName": "n", **tpu_pod(2)["spec"]}, "status": {"phase": "Running"}},
    ]
    assert tpu_in_use(pods)["n"] == 6
    assert tpu_in_use(pods, finished={"c"})["n"] == 4


def test_env_sources_and_dollar_expansion() -> None:
    data = {("ConfigMap", "cm"): {"A": b"1", "B": b"2"}, ("Secret", "s"): {"k": b"v"}}
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}}, "spec": {"nodeName": "n"}}
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "MISSING_OK", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
            {"name": "MSG", "value": "$(POD) in $(UNKNOWN) costs $$5"},
        ],
    }
    env = container_env(pod, container, lambda kind, name: data.get((kind, name)), {})
    assert env == {"CM_A": "1", "CM_B": "2", "POD": "p", "APP": "x", "K": "v", "MSG": "p in $(UNKNOWN) costs $5"}
    assert expand("$(A)-$(B)", {"A": "x"}) == "x-$(B)"
    with pytest.raises(ConfigError, match='configmap "gone" not found'):
        container_env(pod, {"envFrom": [{"configMapRef": {"name": "gone"}}]}, lambda kind, name: None, {})


def test_path_map_rewrites_container_paths_only_where_they_start_a_path() -> None:
    paths = PathMap(
        {"/etc/tpuforge": "/s/cfg", "/etc/tpuforge/extra/": "/s/extra", "/dev/termination-log": "/s/tl", "/": "/never"}
    )
    assert paths.apply("/etc/tpuforge/config.json") == "/s/cfg/config.json"
    assert paths.apply("--config=/etc/tpuforge/config.json") == "--config=/s/cfg/config.json"
    assert paths.apply("/etc/tpuforge/extra/x") == "/s/extra/x"  # the longest mount wins
    assert paths.apply("a:/etc/tpuforge,b /dev/termination-log") == "a:/s/cfg,b /s/tl"
    assert paths.apply("/etc/tpuforge2/x") == "/etc/tpuforge2/x"
    assert paths.apply("/opt/etc/tpuforge") == "/opt/etc/tpuforge"
    assert paths.apply("/usr/bin/python") == "/usr/bin/python"


def test_images_map_to_local_runtimes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert runtime_for("tpuforge/trainer:0.1.0").bin_dir == project_bin()
    assert runtime_for("python:3.11").bin_dir == project_bin()
    monkeypatch.setenv("TPUFORGE_VLLM_VENV", str(tmp_path / "none"))
    missing = runtime_for("vllm/vllm-tpu:v0.27.0")
    assert missing.bin_dir is None and "TPUFORGE_VLLM_VENV" in (missing.error or "")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    monkeypatch.setenv("TPUFORGE_VLLM_VENV", str(tmp_path / "venv"))
    assert runtime_for("vllm/vllm-tpu:v0.27.0").bin_dir == tmp_path / "venv" / "bin"


def test_read_write_once_claims_attach_to_one_node_at_a_time() -> None:
    att = Attachments()
    rwo, rwx = {"cache": ["ReadWriteOnce"]}, {"shared": ["ReadWriteMany"]}
    assert att.attach("ns", rwo, "u1", "old", "v6e-8-0") is None
    assert att.attach("ns", rwo, "u2", "beside", "v6e-8-0") is None  # same node: fine
    refused = att.attach("ns", rwo | rwx, "u3", "surge", "v6e-8-1")
    assert refused == 'Multi-Attach error for volume "cache" Volume is already used by pod(s) beside, old'
    assert att.attach("ns", rwx, "u3", "surge", "v6e-8-1") is None  # many nodes may mount ReadWriteMany
    assert att.attach("other", rwo, "u4", "elsewhere", "v6e-8-1") is None  # another namespace's claim
    att.release("u1")
    assert att.attach("ns", rwo, "u3", "surge", "v6e-8-1") is not None  # still used on v6e-8-0
    att.release("u2")
    assert att.attach("ns", rwo, "u3", "surge", "v6e-8-1") is None
