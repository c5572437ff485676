"""The ServingDeployment controller on the sandbox's real kube-apiserver and controller-manager.

The serving pods ask for a v6e-4 slice, which the sandbox has no node for: they stay unscheduled, and the test
plays the kubelet by writing their readiness, so that the real ReplicaSet controller counts them. (The e2e
test runs a real vLLM on the emulated v6e-8 node.) The FineTuneJobs here stand for finished or running jobs:
the test writes their status, so the operator runs the ServingDeployment controller only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import pytest
from kopf._core.intents import registries
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY, generate_latest

from tpuforge.api.constants import API_VERSION, GROUP, SERVING_PLURAL, VERSION
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests import serving as manifests
from tpuforge.manifests import serving_inputs
from tpuforge_sandbox import Sandbox, wait_for

pytestmark = pytest.mark.cluster

WAIT = 60.0
MODEL_V1, MODEL_V2 = "gs://models/merged-v1", "gs://models/merged-v2"


def serving_only_registry() -> kopf.OperatorRegistry:
    """The operator's own settings, login and controllers, but not the FineTuneJob controller, which would
    start training for the FineTuneJobs these tests only stand in for."""
    import tpuforge.controllers.main  # noqa: F401 - registers every handler in kopf's default registry

    default, out = registries.get_default_registry(), kopf.OperatorRegistry()
    for part in ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks"):
        for handler in getattr(default, part).get_all_handlers():
            fn = handler.fn
            if getattr(fn, "__module__", "") == "tpuforge.controllers.main" and (
                getattr(fn, "__name__", "") != "start_finetunejob_controller"
            ):
                getattr(out, part).append(handler)
    return out


@pytest.fixture(scope="module")
def operator(sandbox: Sandbox) -> Iterator[KopfRunner]:
    kube_client.configure(sandbox.kubeconfig)
    args = ["run", "--standalone", "--all-namespaces"]
    with KopfRunner(args, registry=serving_only_registry(), timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.exception


def sdep(api: client.ApiClient, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": API_VERSION, "kind": "ServingDeployment", "metadata": {"name": name}, "spec": spec}
    out: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, ns, SERVING_PLURAL, body
    )
    return out


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": MODEL_V1, "name": "gemma4-tiny"},
        "serviceAccountName": "default",
        "tpu": {"slice": "v6e-4"},
        "vllm": {"tensorParallelSize": 1, "maxModelLen": 256},
    }
    return spec | overrides


def get_sdep(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, SERVING_PLURAL, name
    )
    return out


def status_when(api: client.ApiClient, ns: str, name: str, ok: Callable[[dict[str, Any]], bool], what: str) -> Any:
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal last
        last = get_sdep(api, ns, name).get("status") or {}
        return last if ok(last) else None

    try:
        return wait_for(check, WAIT, what)
    except TimeoutError as e:
        raise AssertionError(f"{e}; status: {last}") from None


def phase_is(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s.get("phase") == phase


def pods(api: client.ApiClient, ns: str) -> list[client.V1Pod]:
    return [
        p
        for p in client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=serving")
        .items
        if p.metadata.deletion_timestamp is None
    ]


def make_ready(api: client.ApiClient, ns: str, pod: client.V1Pod) -> None:
    """What a kubelet reports once the pod's readiness probe passes."""
    conds = [{"type": t, "status": "True"} for t in ("Initialized", "ContainersReady", "Ready")]
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod.metadata.name, ns, {"status": {"phase": "Running", "conditions": conds}}
    )


def ready_new_pods(api: client.ApiClient, ns: str, model: str) -> None:
    """Make the pods for `model` ready once the Deployment has made them."""

    def new_pods() -> list[client.V1Pod]:
        return [p for p in pods(api, ns) if p.metadata.annotations.get(manifests.ANNOTATION_MODEL_URI) == model]

    for p in wait_for(new_pods, WAIT, f"a pod serving {model}"):
        make_ready(api, ns, p)


def events(api: client.ApiClient, ns: str, name: str) -> list[str]:
    items = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e.reason for e in items]


def metric_lines(name: str) -> list[str]:
    return [line for line in generate_latest(REGISTRY).decode().splitlines() if f'name="{name}"' in line]


def test_serves_a_uri_and_goes_ready_with_its_pods(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    created = sdep(api, ns, "chat", **tiny_spec())
    s = status_when(api, ns, "chat", phase_is("Pending"), "phase Pending")
    assert s["endpoint"] == f"http://chat.{ns}.svc:8000/v1"
    assert s["modelUri"] == MODEL_V1

    dep = client.AppsV1Api(api).read_namespaced_deployment("chat-vllm", ns)
    svc = client.CoreV1Api(api).read_namespaced_service("chat", ns)
    for obj in (dep, svc):
        (ref,) = obj.metadata.owner_references
        assert (ref.kind, ref.uid, ref.controller) == ("ServingDeployment", created["metadata"]["uid"], True)
    # The default streams the model from GCS: no claim (the XLA cache is the node's), a rolling update.
    assert client.CoreV1Api(api).list_namespaced_persistent_volume_claim(ns).items == []
    assert dep.spec.strategy.type == "RollingUpdate"
    vllm = dep.spec.template.spec.containers[0]
    assert vllm.command == ["vllm", "serve"] and vllm.args[:3] == [MODEL_V1, "--load-format", "runai_streamer"]
    assert svc.spec.ports[0].port == 8000

    # The unschedulable pod's reason reaches the status.
    s = status_when(api, ns, "chat", lambda s: "v6e" in str(s.get("conditions")) or "node" in str(s), "a reason")
    ready_new_pods(api, ns, MODEL_V1)
    s = status_when(api, ns, "chat", phase_is("Ready"), "phase Ready")
    assert s["readyReplicas"] == 1 and s["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in s["conditions"]} == {
        "Ready": "True",
        "ModelAvailable": "True",
        "RolledOut": "True",
    }
    wait_for(lambda: {"Pending", "Ready"} <= set(events(api, ns, "chat")), WAIT, "Pending and Ready events")
    assert any('phase="Ready"' in line and line.endswith(" 1.0") for line in metric_lines("chat"))


def test_replicas_and_spec_changes_roll_out(operator: KopfRunner, api_client: client.ApiClient, namespace: str) -> None:
    api, ns = api_client, namespace
    sdep(api, ns, "chat", **tiny_spec())
    ready_new_pods(api, ns, MODEL_V1)
    status_when(api, ns, "chat", phase_is("Ready"), "phase Ready")

    # Two replicas on two TPU VMs need volumes that many nodes mount.
    shared = {
        "xlaCache": {"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"},
        "modelStorage": {"medium": "NodeLocal"},
    }
    patch = {"spec": {"replicas": 2, "vllm": {"maxNumSeqs": 16}, **shared}}
    client.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, "chat", patch)

    def rolled() -> bool:
        d = client.AppsV1Api(api).read_namespaced_deployment("chat-vllm", ns)
        return d.spec.replicas == 2 and "--max-num-seqs" in d.spec.template.spec.containers[0].args

    wait_for(rolled, WAIT, "the Deployment to take the new spec")
    s = status_when(api, ns, "chat", lambda s: s.get("observedGeneration") == 2, "generation 2 observed")
    assert s["phase"] in ("Pending", "Loading", "Ready")
    for p in wait_for(
        lambda: [p for p in pods(api, ns) if "--max-num-seqs" in p.spec.containers[0].args] or None,
        WAIT,
        "the new pods",
    ):
        make_ready(api, ns, p)

    def all_ready() -> bool:
        for p in pods(api, ns):
            if "--max-num-seqs" in p.spec.containers[0].args and not any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or []
            ):
                make_ready(api, ns, p)
        s = get_sdep(api, ns, "chat").get("status") or {}
        return s.get("phase") == "Ready" and s.get("readyReplicas") == 2

    wait_for(all_ready, WAIT, "two ready replicas")


def test_an_invalid_spec_fails_and_creates_nothing(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    # A model the catalog lacks: a check the CRD's rules leave to the operator.
    sdep(api, ns, "bad", **tiny_spec(model={"uri": MODEL_V1, "name": "gemma4-e4b"}))
    s = status_when(api, ns, "bad", phase_is("Failed"), "phase Failed")
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.model.name" in ready["message"]
    with pytest.raises(ApiException) as info:
        client.AppsV1Api(api).read_namespaced_deployment("bad-vllm", ns)
    assert info.value.status == 404
    wait_for(lambda: "Failed" in events(api, ns, "bad"), WAIT, "a Failed event")


def finetunejob(api: client.ApiClient, ns: str, name: str, **spec: Any) -> None:
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "gemma4-tiny", "uri": "gs://models/base"},
            "dataset": {"uri": "gs://data/train.jsonl"},
            "training": {"maxSeqLen": 128},
            "tpu": {"slice": "v6e-4"},
            "checkpoint": {"uri": f"gs://runs/{name}/checkpoints"},
            "output": {"uri": f"gs://runs/{name}/merged"},
            "preflight": {"enabled": False},
            "serviceAccountName": "default",
        },
    }
    body["spec"].update(spec)
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, "finetunejobs", body)


def job_status(api: client.ApiClient, ns: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "finetunejobs", name, {"status": status}
    )


def test_a_finetunejob_reference_waits_then_serves_then_rolls_to_a_new_model(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    # A model disk: its rollout recreates the pod (a streamed model surges instead: test_serving_rollout.py).
    spec = tiny_spec(model={"fineTuneJobRef": {"name": "ft"}}, modelStorage={"medium": "Disk"})
    sdep(api, ns, "chat", **spec)
    s = status_when(api, ns, "chat", phase_is("WaitingForModel"), "WaitingForModel (no job yet)")
    assert "does not exist" in str(s["conditions"])

    finetunejob(api, ns, "ft")
    job_status(api, ns, "ft", {"phase": "Training"})
    status_when(api, ns, "chat", lambda s: "Training" in str(s.get("conditions")), "waiting on a training job")
    with pytest.raises(ApiException):
        client.AppsV1Api(api).read_namespaced_deployment("chat-vllm", ns)

    job_status(
        api,
        ns,
        "ft",
        {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z", "outputs": {"mergedModelUri": MODEL_V1}},
    )
    status_when(api, ns, "chat", lambda s: s.get("modelUri") == MODEL_V1, "the merged model to be taken")
    ready_new_pods(api, ns, MODEL_V1)
    status_when(api, ns, "chat", phase_is("Ready"), "phase Ready on the first model")

    # The job runs again and produces a new merged model. The pod holds ReadWriteOnce disks, so the Deployment
    # recreates it: the old pod goes first, and until the new one is ready nothing serves, which the status says.
    job_status(api, ns, "ft", {"phase": "Training"})
    job_status(
        api,
        ns,
        "ft",
        {"phase": "Succeeded", "completionTime": "2026-02-01T00:00:00Z", "outputs": {"mergedModelUri": MODEL_V2}},
    )
    s = status_when(
        api,
        ns,
        "chat",
        lambda s: (
            "RollingOut" in str(s.get("conditions"))
            and s.get("phase") != "Ready"
            and "nothing serves" in str(s.get("conditions"))
        ),
        "a rollout that replaces the pod, saying so",
    )
    assert s["modelUri"] == MODEL_V2 and s["readyReplicas"] == 0
    ready_new_pods(api, ns, MODEL_V2)
    s = status_when(
        api, ns, "chat", lambda s: s.get("modelUri") == MODEL_V2 and s.get("phase") == "Ready", "serving the new model"
    )
    wait_for(lambda: "RollingModel" in events(api, ns, "chat"), WAIT, "a RollingModel event")


def test_a_failed_job_with_nothing_served_fails(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    finetunejob(api, ns, "ft")
    job_status(api, ns, "ft", {"phase": "Failed"})
    sdep(api, ns, "chat", **tiny_spec(model={"fineTuneJobRef": {"name": "ft"}}))
    s = status_when(api, ns, "chat", phase_is("Failed"), "phase Failed")
    assert "FineTuneJobFailed" in str(s["conditions"])


def adapters_of(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in s.get("adapters") or []}


def condition(s: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in s.get("conditions") or [] if c["type"] == type_), {})


def test_adapters_take_a_jobs_output_only_after_its_evaluation_passed(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    a1, a2, plain = "gs://runs/ft/v1/adapter", "gs://runs/ft/v2/adapter", "gs://runs/plain/adapter"
    evaluation = {"datasetUri": "gs://data/eval.jsonl", "thresholds": {"maxLoss": 2.0}}
    ft_spec = {"evaluation": evaluation, "merge": {"writeAdapter": True}, "lora": {"rank": 16}}
    finetunejob(api, ns, "ft", **ft_spec)
    finetunejob(api, ns, "other", model={"name": "gemma4-e4b", "uri": "gs://models/e4b"})
    job_status(api, ns, "ft", {"phase": "Training"})
    adapters = [
        {"name": "ft-a", "fineTuneJobRef": {"name": "ft"}},
        {"name": "other", "fineTuneJobRef": {"name": "other"}},
        {"name": "plain", "uri": plain},
    ]
    sdep(api, ns, "multi", **tiny_spec(adapters=adapters, vllm={"tensorParallelSize": 1, "lora": {"maxLoraRank": 16}}))

    s = status_when(api, ns, "multi", lambda s: len(s.get("adapters") or []) == 3, "a status per adapter")
    got = adapters_of(s)
    assert got["ft-a"]["phase"] == "Loading" and "waiting for FineTuneJob 'ft'" in got["ft-a"]["message"]
    assert got["other"]["phase"] == "Failed" and "fine-tunes 'gemma4-e4b'" in got["other"]["message"]
    assert (got["plain"]["uri"], got["plain"]["phase"]) == (plain, "Loading")
    assert s["adaptersReady"] == "0/3" and condition(s, "AdaptersPromoted")["reason"] == "WaitingForJob"
    assert condition(s, "AdaptersReady")["reason"] == "AdapterFailed"
    assert s["phase"] == "Pending"  # one adapter's refusal leaves the deployment alone
    dep = client.AppsV1Api(api).read_namespaced_deployment("multi-vllm", ns)
    template, args = dep.spec.template, dep.spec.template.spec.containers[0].args
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "16"
    assert [c.name for c in template.spec.containers] == ["vllm", "adapters"]

    # The job succeeds but fails its evaluation: nothing was served under the name, so it is Failed.
    done = {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z", "outputs": {"adapterUri": a1}}
    job_status(api, ns, "ft", {**done, "evaluation": {"passed": False, "message": "loss 3.1 > maxLoss 2.0"}})
    s = status_when(api, ns, "multi", lambda s: adapters_of(s)["ft-a"]["phase"] == "Failed", "ft-a refused")
    assert "failed its evaluation: loss 3.1 > maxLoss 2.0" in adapters_of(s)["ft-a"]["message"]
    assert condition(s, "AdaptersPromoted")["reason"] == "EvaluationFailed"

    # It passes: promoted, with the job's revision.
    job_status(api, ns, "ft", {"evaluation": {"passed": True, "message": "loss 1.2"}})
    s = status_when(api, ns, "multi", lambda s: adapters_of(s)["ft-a"].get("uri") == a1, "ft-a promoted")
    ft = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, "finetunejobs", "ft")
    got = adapters_of(s)["ft-a"]
    assert (got["source"], got["revision"]) == ("ft", f"{ft['metadata']['uid']}/2026-01-01T00:00:00Z")
    assert got["phase"] == "Loading"  # no replica is ready to load it on
    assert condition(s, "AdaptersPromoted")["status"] == "True"

    # The job runs again; its new adapter fails the evaluation: the promoted one stays, and the condition says why.
    job_status(api, ns, "ft", {"phase": "Training"})
    rerun = {"phase": "Succeeded", "completionTime": "2026-02-01T00:00:00Z", "outputs": {"adapterUri": a2}}
    job_status(api, ns, "ft", {**rerun, "evaluation": {"passed": False, "message": "exactMatch 0.1 < 0.5"}})
    s = status_when(
        api, ns, "multi", lambda s: condition(s, "AdaptersPromoted").get("reason") == "EvaluationFailed", "held back"
    )
    assert adapters_of(s)["ft-a"]["uri"] == a1 and f"still serving {a1}" in condition(s, "AdaptersPromoted")["message"]

    # Adapters came and went; the pods' template never changed.
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, SERVING_PLURAL, "multi", {"spec": {"adapters": adapters[2:]}}
    )
    s = status_when(api, ns, "multi", lambda s: list(adapters_of(s)) == ["plain"], "two adapters removed")
    assert s["adaptersReady"] == "0/1" and condition(s, "AdaptersPromoted")["status"] == "True"
    after = client.AppsV1Api(api).read_namespaced_deployment("multi-vllm", ns)
    assert after.spec.template == template and after.metadata.generation == dep.metadata.generation


def gone(read: Callable[[], Any]) -> bool:
    """Deleted: absent, or on its way out."""
    try:
        obj = read()
    except ApiException as e:
        return e.status == 404
    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
    return (meta.get("deletionTimestamp") if isinstance(meta, dict) else meta.deletion_timestamp) is not None


def test_deletion_collects_the_children_and_keeps_the_cache_unless_asked(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    # The cache is a claim where the model is copied to a disk (a streamed model's is the node's).
    disk = {"modelStorage": {"medium": "Disk"}}
    sdep(api, ns, "keep", **tiny_spec(**disk))
    sdep(api, ns, "drop", **tiny_spec(xlaCache={"retainOnDelete": False}, **disk))
    for name in ("keep", "drop"):
        wait_for(lambda n=name: not gone(lambda: apps.read_namespaced_deployment(f"{n}-vllm", ns)), WAIT, "children")
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, name)
    for name in ("keep", "drop"):
        wait_for(lambda n=name: gone(lambda: apps.read_namespaced_deployment(f"{n}-vllm", ns)), WAIT, "Deployment GC")
        wait_for(lambda n=name: gone(lambda: core.read_namespaced_service(n, ns)), WAIT, "Service GC")
    wait_for(lambda: gone(lambda: core.read_namespaced_persistent_volume_claim("drop-xla-cache", ns)), WAIT, "PVC GC")
    time.sleep(2)  # the garbage collector has had its chance
    assert core.read_namespaced_persistent_volume_claim("keep-xla-cache", ns).metadata.owner_references is None
    assert metric_lines("keep") == [] and metric_lines("drop") == []


def test_a_recreated_serving_deployment_says_it_waits_for_its_predecessors_claim_then_serves(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    """Delete a ServingDeployment and create it again under the same name while its model claim is still on
    its way out (held here by a finalizer, as a pod still using it holds it): the new one says what it waits
    for, then makes its claim once the old one is gone, and serves."""
    api, ns = api_client, namespace
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    claim = serving_inputs.names("again").model
    disk = {"modelStorage": {"medium": "Disk"}}
    sdep(api, ns, "again", **tiny_spec(**disk))
    wait_for(lambda: not gone(lambda: core.read_namespaced_persistent_volume_claim(claim, ns)), WAIT, "the claim")
    core.patch_namespaced_persistent_volume_claim(claim, ns, {"metadata": {"finalizers": ["example.com/in-use"]}})
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, "again")
    wait_for(
        lambda: gone(lambda: core.read_namespaced_persistent_volume_claim(claim, ns)), WAIT, "the claim's deletion"
    )
    wait_for(lambda: gone(lambda: get_sdep(api, ns, "again")), WAIT, "the first ServingDeployment to go")

    sdep(api, ns, "again", **tiny_spec(**disk))
    s = status_when(api, ns, "again", lambda s: "WaitingForDeletion" in str(s.get("conditions")), "the wait said")
    assert s["phase"] == "Pending"
    ready = condition(s, "Ready")
    assert ready["reason"] == "WaitingForDeletion"
    assert f"PersistentVolumeClaim {claim}, still being deleted" in ready["message"]
    assert "Pending" in events(api, ns, "again")

    core.patch_namespaced_persistent_volume_claim(claim, ns, {"metadata": {"finalizers": None}})
    # The claim protection controller lets the old claim go (no pod uses it); the new one is made.
    wait_for(lambda: not gone(lambda: core.read_namespaced_persistent_volume_claim(claim, ns)), WAIT, "a new claim")
    ready_new_pods(api, ns, MODEL_V1)
    s = status_when(api, ns, "again", phase_is("Ready"), "phase Ready")
    assert condition(s, "Ready")["status"] == "True"


def served(api: client.ApiClient, path: str) -> bool:
    try:
        return bool(kube_client.request(api, "GET", path).get("resources"))
    except ApiException:
        return False


SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def test_a_service_monitor_is_made_when_the_cluster_has_the_crd(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    api, ns = api_client, namespace
    ext, custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
    sdep(api, ns, "before", **tiny_spec())
    status_when(api, ns, "before", lambda s: bool(s.get("endpoint")), "children of 'before'")
    with pytest.raises(ApiException):  # no CRD, no ServiceMonitor
        custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", ns, "servicemonitors", "before-vllm")
    ext.create_custom_resource_definition(SERVICE_MONITOR_CRD)
    try:
        wait_for(lambda: served(api, "/apis/monitoring.coreos.com/v1"), WAIT, "the CRD to be served")
        name = f"after-{uuid.uuid4().hex[:4]}"
        sdep(api, ns, name, **tiny_spec())
        mon = wait_for(
            lambda: (
                not gone(
                    lambda: custom.get_namespaced_custom_object(
                        "monitoring.coreos.com", "v1", ns, "servicemonitors", f"{name}-vllm"
                    )
                )
            ),
            WAIT,
            "the ServiceMonitor",
        )
        assert mon
        obj = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", ns, "servicemonitors", f"{name}-vllm")
        assert obj["spec"]["endpoints"][0]["path"] == "/metrics"
        assert obj["metadata"]["ownerReferences"][0]["name"] == name
    finally:
        ext.delete_custom_resource_definition(SERVICE_MONITOR_CRD["metadata"]["name"])


def test_an_hpa_scales_the_servingdeployment_and_a_budget_guards_its_pods(
    operator: KopfRunner, api_client: client.ApiClient, namespace: str
) -> None:
    """The scale subresource: kube-controller-manager's HPA controller raises the ServingDeployment to its
    minReplicas (no metrics needed for that), and the operator carries the count to the Deployment."""
    api, ns = api_client, namespace
    shared = {
        "xlaCache": {"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"},
        "modelStorage": {"medium": "NodeLocal"},
    }
    sdep(api, ns, "chat", **tiny_spec(**shared))
    s = status_when(api, ns, "chat", lambda s: bool(s.get("selector")), "the status selector")
    budget = wait_for(
        lambda: kube_objects.get(api, "policy/v1", "PodDisruptionBudget", ns, "chat-vllm"), WAIT, "the budget"
    )
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == serving_inputs.selector_labels("chat")
    assert s["selector"] == manifests.selector("chat")
    scale: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object_scale(
        GROUP, VERSION, ns, SERVING_PLURAL, "chat"
    )
    assert (scale["spec"]["replicas"], scale["status"]["selector"]) == (1, manifests.selector("chat"))

    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": "ServingDeployment", "name": "chat"},
            "minReplicas": 2,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm_num_requests_waiting"},
                        "target": {"type": "AverageValue", "averageValue": "4"},
                    },
                }
            ],
        },
    }
    kube_client.request(api, "POST", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers", body=hpa)

    def scaled() -> bool:
        d = client.AppsV1Api(api).read_namespaced_deployment("chat-vllm", ns)
        return d.spec.replicas == 2

    wait_for(scaled, WAIT, "the HPA's count carried to the Deployment")
    assert get_sdep(api, ns, "chat")["spec"]["replicas"] == 2
