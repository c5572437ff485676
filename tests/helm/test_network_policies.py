"""The chart's NetworkPolicies for the pods the operator creates (networkPolicy.workloads.enabled), tested
against those pods as the operator builds them: each policy selects the pods it is for, and each connection
the pods need is admitted by a rule whose peers select the pod at the other end, on a port the pod declares.
The requirements (multi-host trainers talk on 8476 and 8471; the operator calls vLLM and its adapters sidecar;
Prometheus scrapes; GCS and the metadata server): docs/platform-team.md, "Network"."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from tests.fixtures.helm import NAMESPACE, QUEUE, find, render
from tpuforge import api
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.constants import COORDINATOR_PORT, LABEL_JOBSET_NAME, TPU_RUNTIME_PORT
from tpuforge.manifests import preflight, serving, serving_inputs, vllm_server
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import train_job, train_jobset

Obj = dict[str, Any]
VALUES = "workloads-on"
WORKLOADS = "ml-team"
MONITORING = "monitoring"


def policies() -> list[Obj]:
    return [o for o in render(VALUES) if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == WORKLOADS]


def policy(name: str) -> Obj:
    return find(tuple(policies()), "NetworkPolicy", name)


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


class Pod:
    """A pod as it runs: its namespace (with the label Kubernetes gives every namespace), labels and spec."""

    def __init__(self, namespace: str, labels: dict[str, str], spec: Obj):
        self.namespace = namespace
        self.labels = labels
        self.spec = spec
        self.namespace_labels = {"kubernetes.io/metadata.name": namespace}

    def port(self, name_or_number: str | int) -> int | None:
        for c in self.spec["containers"]:
            for p in c.get("ports", []):
                if name_or_number in (p["name"], p["containerPort"]):
                    return int(p["containerPort"])
        return None


def peer_admits(peer: Obj, policy_ns: str, pod: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    ns_ok = (
        selects(peer["namespaceSelector"], pod.namespace_labels)
        if "namespaceSelector" in peer
        else (pod.namespace == policy_ns)
    )
    return ns_ok and ("podSelector" not in peer or selects(peer["podSelector"], pod.labels))


def admits_ingress(target: Pod, source: Pod, port: int) -> bool:
    """Whether the policies that select `target` let `source` connect to `port` of it."""
    chosen = [p for p in policies() if selects(p["spec"]["podSelector"], target.labels)]
    assert chosen, f"no policy selects {target.labels}"
    for p in chosen:
        for rule in p["spec"].get("ingress") or []:
            ports = [target.port(r["port"]) for r in rule.get("ports") or []]
            if rule.get("ports") and port not in ports:
                continue
            if "from" not in rule or any(peer_admits(peer, WORKLOADS, source) for peer in rule["from"]):
                return True
    return False


def admits_egress(source: Pod, port: int, to: Pod | str) -> bool:
    """Whether the policies that select `source` let it connect to `port` of a pod or an IP address."""
    chosen = [p for p in policies() if selects(p["spec"]["podSelector"], source.labels)]
    assert chosen, f"no policy selects {source.labels}"
    for p in chosen:
        for rule in p["spec"].get("egress") or []:
            if rule.get("ports") and port not in [r["port"] for r in rule["ports"]]:
                continue
            if "to" not in rule:
                return True
            for peer in rule["to"]:
                if isinstance(to, str):
                    block = peer.get("ipBlock")
                    if block and ipaddress.ip_address(to) in ipaddress.ip_network(block["cidr"]):
                        return True
                elif peer_admits(peer, WORKLOADS, to):
                    return True
    return False


def job_spec(**tpu: Any) -> api.FineTuneJobSpec:
    return api.validate_finetune(
        {
            "model": {"name": "gemma4-31b", "uri": "gs://b/m"},
            "dataset": {"uri": "gs://b/d.jsonl", "evalUri": "gs://b/e.jsonl"},
            "training": {"maxSeqLen": 4096},
            "tpu": {"slice": "v5p-8", **tpu},
            "checkpoint": {"uri": "gs://b/ck"},
            "output": {"uri": "gs://b/out"},
            "serviceAccountName": "tpuforge-gcs",
            "merge": {"writeAdapter": True},
            "evaluation": {"slice": "v6e-8"},
            "queueName": QUEUE,
        }
    )


OWNER = owner(WORKLOADS, "sft", "uid-1")


def template_pod(template: Obj, extra_labels: dict[str, str] | None = None) -> Pod:
    return Pod(WORKLOADS, {**template["metadata"]["labels"], **(extra_labels or {})}, template["spec"])


def trainer_hosts() -> list[Pod]:
    """The pods of a v5p-16 JobSet, with the labels JobSet's controller adds to them."""
    js = train_jobset(OWNER, job_spec(slice="v5p-16"), 0)
    (rj,) = js["spec"]["replicatedJobs"]
    template = rj["template"]["spec"]["template"]
    return [template_pod(template, {LABEL_JOBSET_NAME: js["metadata"]["name"]}) for _ in range(2)]


def single_host_trainer() -> Pod:
    return template_pod(train_job(OWNER, job_spec(), 0)["spec"]["template"])


def vllm_pod() -> Pod:
    spec = api.validate_serving(
        {"model": {"uri": "gs://b/out"}, "adapters": [{"name": "a", "uri": "gs://b/a"}], "serviceAccountName": "sa"}
    )
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner(WORKLOADS, "chat", "uid-2"),
        spec=spec,
        model_uri="gs://b/out",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice("v6e-8"),
    )
    return template_pod(serving.pod_template(inp))


def operator_pod() -> Pod:
    template = find(render(VALUES), "Deployment")["spec"]["template"]
    return Pod(NAMESPACE, template["metadata"]["labels"], template["spec"])


def prometheus(namespace: str = MONITORING) -> Pod:
    return Pod(namespace, {"app.kubernetes.io/name": "prometheus"}, {"containers": []})


def test_off_by_default_and_rendered_in_the_workloads_namespaces() -> None:
    assert [o["metadata"]["name"] for o in render("default") if o["kind"] == "NetworkPolicy"] == ["tpf-tpuforge"]
    assert sorted(p["metadata"]["name"] for p in policies()) == [
        "tpuforge-jobs",
        "tpuforge-serving",
        "tpuforge-trainers",
    ]


def test_every_pod_the_operator_creates_is_selected_by_its_policy() -> None:
    spec = job_spec()
    pods = {
        "tpuforge-trainers": [single_host_trainer(), *trainer_hosts()],
        "tpuforge-jobs": [
            template_pod(merge_objects(OWNER, spec)[1]["spec"]["template"]),
            template_pod(eval_job(OWNER, spec)["spec"]["template"]),
            template_pod(preflight.preflight_objects(OWNER, spec)[-1]["spec"]["template"]),
        ],
        "tpuforge-serving": [vllm_pod()],
    }
    for name, members in pods.items():
        for pod in members:
            chosen = [p["metadata"]["name"] for p in policies() if selects(p["spec"]["podSelector"], pod.labels)]
            assert chosen == [name], pod.labels


def test_the_hosts_of_a_jobset_reach_each_other_on_the_coordinator_and_tpu_runtime_ports() -> None:
    # GKE multi-host TPU slices / JAX multi-controller: every host dials process 0's coordinator (8476) and
    # the TPU runtime's host-to-host port (8471).
    host0, host1 = trainer_hosts()
    for port in (COORDINATOR_PORT, TPU_RUNTIME_PORT):
        assert host0.port(port) == port  # declared on the pod, so the named ports resolve
        assert admits_ingress(host0, host1, port), port
        assert admits_egress(host1, port, host0), port
    # A single-host trainer (no JobSet) or a serving pod is not let in on those ports.
    assert not admits_ingress(host0, single_host_trainer(), COORDINATOR_PORT)
    assert not admits_ingress(host0, vllm_pod(), TPU_RUNTIME_PORT)


def test_the_operator_reaches_vllm_and_the_adapters_sidecar() -> None:
    pod, op = vllm_pod(), operator_pod()
    for port in (vllm_server.VLLM_PORT, serving.ADAPTERS_PORT):
        assert pod.port(port) == port
        assert admits_ingress(pod, op, port), port
    # The sidecar takes requests from the operator only.
    assert not admits_ingress(pod, prometheus(), serving.ADAPTERS_PORT)
    assert not admits_ingress(pod, Pod(WORKLOADS, {"app": "client"}, {"containers": []}), serving.ADAPTERS_PORT)


def test_prometheus_reaches_the_trainers_metrics_and_nothing_else_does() -> None:
    pod = single_host_trainer()
    metrics = pod.port("metrics")
    assert metrics is not None
    assert admits_ingress(pod, prometheus(), metrics)
    assert not admits_ingress(pod, prometheus("default"), metrics)  # metricsFrom names the monitoring namespace


@pytest.mark.parametrize("which", ["trainer", "jobs", "vllm"])
def test_pods_reach_dns_the_metadata_server_and_https(which: str) -> None:
    spec = job_spec()
    pod = {
        "trainer": single_host_trainer(),
        "jobs": template_pod(merge_objects(OWNER, spec)[1]["spec"]["template"]),
        "vllm": vllm_pod(),
    }[which]
    assert admits_egress(pod, 443, "142.250.1.207")  # storage.googleapis.com, or the API server
    assert admits_egress(pod, 53, "10.0.0.10")  # kube-dns
    assert admits_egress(pod, 80, "169.254.169.254")  # the GKE metadata server (Workload Identity's tokens)
    assert admits_egress(pod, 988, "169.254.169.252")  # its address on GKE Dataplane V2
    assert not admits_egress(pod, 80, "142.250.1.207")
    assert not admits_egress(pod, 8476, "10.8.0.12")


def test_nothing_connects_to_merge_and_evaluation_pods() -> None:
    merge = template_pod(merge_objects(OWNER, job_spec())[1]["spec"]["template"])
    for source in (operator_pod(), prometheus(), single_host_trainer()):
        assert not admits_ingress(merge, source, 8080)
