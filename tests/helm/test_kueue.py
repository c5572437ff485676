"""The chart's Kueue objects (kueue.enabled): valid against Kueue v0.17.0's published v1beta2 CRDs (vendored in
tests/upstream/kueue/), and admitting what the operator builds: every Job or JobSet of a FineTuneJob carries a
queue label that names a LocalQueue of the ClusterQueue, and the flavor Kueue assigns it (the first, in the
ClusterQueue's order, whose node labels and taints suit its pods and whose quota covers every resource they
request: Kueue admits a workload only when all of them are covered and fit) is the node pool kind it runs on.
The requirement and its sources: docs/platform-team.md, "Queues and priorities"."""

from __future__ import annotations

import json
import subprocess
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import yaml

from tests.fixtures import upstream
from tests.fixtures.helm import CHART, QUEUE, RELEASE, find, helm, render
from tpuforge import api
from tpuforge.api import resources
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import JOBSET_KIND, LABEL_KUEUE_QUEUE
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import train_job, train_workload
from tpuforge.manifests.preflight import preflight_objects

Obj = dict[str, Any]
VALUES = "workloads-on"
NAMESPACE = "ml-team"
TPU_FLAVORS = ["tpu-v5p-8", "tpu-v5p-16", "tpu-v6e-8", "tpu-v6e-16"]


def kueue_objects() -> list[Obj]:
    return [o for o in render(VALUES) if o["apiVersion"].startswith("kueue.x-k8s.io/")]


def test_kueue_is_off_by_default() -> None:
    assert not [o for o in render("default") if o["apiVersion"].startswith("kueue.x-k8s.io/")]


def test_objects_validate_against_kueues_published_v1beta2_schemas() -> None:
    objs = kueue_objects()
    assert sorted(o["kind"] for o in objs) == ["ClusterQueue", "LocalQueue", *["ResourceFlavor"] * 5]
    for obj in objs:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        schema = upstream.kueue_schema(obj["kind"])
        cls = jsonschema.validators.validator_for(schema)
        cast(jsonschema.protocols.Validator, cls(schema)).validate(obj)
    # The closed schema refuses what Kueue would prune without a word.
    misspelt = {**find(render(VALUES), "LocalQueue"), "spec": {"clusterQeue": "x"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, upstream.kueue_schema("LocalQueue"))


def test_the_cluster_queue_keeps_kueues_rules_for_resource_groups() -> None:
    """A resource belongs to one resource group only, and each flavor lists the group's resources in its
    order (CEL rules and the admission webhook check them on the server): the CPU flavor sits with the TPU
    ones, its google.com/tpu quota 0."""
    cq = find(render(VALUES), "ClusterQueue")
    (group,) = cq["spec"]["resourceGroups"]
    assert [f["name"] for f in group["flavors"]] == [*TPU_FLAVORS, "cpu"]
    for flavor in group["flavors"]:
        assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    cpu = next(f for f in group["flavors"] if f["name"] == "cpu")["resources"]
    assert cpu[0] == {"name": "google.com/tpu", "nominalQuota": 0}
    assert cq["spec"]["namespaceSelector"] == {}  # every namespace with a LocalQueue may use it


def flavor_matches(flavor: Obj, pod: Obj) -> bool:
    """Kueue's flavor check for a pod: no node label of the flavor conflicts with the pod's node selector (a
    key the selector does not name does not conflict), and the pod tolerates every taint of the flavor."""
    selector = pod.get("nodeSelector", {})
    labels = flavor["spec"].get("nodeLabels", {})
    if any(key in selector and selector[key] != value for key, value in labels.items()):
        return False
    tolerations = pod.get("tolerations", [])

    def tolerated(taint: Obj) -> bool:
        return any(
            t.get("key") == taint["key"]
            and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
            and t.get("effect", taint["effect"]) == taint["effect"]
            for t in tolerations
        )

    return all(tolerated(t) for t in flavor["spec"].get("nodeTaints", []))


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """What one pod asks for, as Kueue counts it (the scheduler's effective requests): its containers' sum,
    or its largest init container where that is more."""

    def summed(containers: list[Obj]) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for c in containers:
            for name, value in c["resources"].get("requests", {}).items():
                out[name] = out.get(name, Decimal(0)) + resources.quantity(value)
        return out

    total = summed(pod["containers"])
    for init in pod.get("initContainers", []):
        for name, value in summed([init]).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def pod_sets(workload: Obj) -> tuple[int, Obj]:
    """(pods, pod spec) of a Job or of a JobSet's one replicated Job."""
    if workload["kind"] == "Job":
        return workload["spec"]["parallelism"], workload["spec"]["template"]["spec"]
    (rj,) = workload["spec"]["replicatedJobs"]
    return rj["replicas"] * rj["template"]["spec"]["parallelism"], rj["template"]["spec"]["template"]["spec"]


def assigned_flavor(objs: tuple[Obj, ...], workload: Obj) -> str | None:
    """The flavor Kueue gives `workload` in the chart's ClusterQueue (all of it free): the first one in the
    resource group whose node labels and taints suit the pods and whose quota covers every resource they
    request; None when no flavor does."""
    (group,) = find(objs, "ClusterQueue")["spec"]["resourceGroups"]
    pods, pod = pod_sets(workload)
    wanted = {name: value * pods for name, value in pod_requests(pod).items()}
    assert set(wanted) <= set(group["coveredResources"]), "Kueue refuses a workload asking for an uncovered resource"
    for entry in group["flavors"]:
        quota = {r["name"]: resources.quantity(str(r["nominalQuota"])) for r in entry["resources"]}
        fits = all(wanted.get(name, 0) <= limit for name, limit in quota.items())
        if fits and flavor_matches(find(objs, "ResourceFlavor", entry["name"]), pod):
            return str(entry["name"])
    return None


def admitted_through_the_local_queue(objs: tuple[Obj, ...], workload: Obj) -> None:
    """The queue label, on the object Kueue suspends and admits, names a LocalQueue of the ClusterQueue in the
    object's namespace."""
    assert workload["metadata"]["labels"][LABEL_KUEUE_QUEUE] == QUEUE
    local = find(objs, "LocalQueue", QUEUE)
    assert local["metadata"]["namespace"] == workload["metadata"]["namespace"] == NAMESPACE
    assert local["spec"]["clusterQueue"] == find(objs, "ClusterQueue")["metadata"]["name"]


def finetune_spec(slice_id: str, **extra: Any) -> api.FineTuneJobSpec:
    return api.validate_finetune(
        {
            "model": {"name": "gemma4-31b", "uri": "gs://b/m"},
            "dataset": {"uri": "gs://b/d.jsonl", "evalUri": "gs://b/e.jsonl"},
            "training": {"maxSeqLen": 4096},
            "tpu": {"slice": slice_id},
            "checkpoint": {"uri": "gs://b/ck"},
            "output": {"uri": "gs://b/out"},
            "serviceAccountName": "tpuforge-gcs",
            "queueName": QUEUE,
            **extra,
        }
    )


def flavor_slice(flavor: Obj) -> str:
    labels = flavor["spec"]["nodeLabels"]
    (slice_id,) = [
        s.id
        for s in TPU_SLICES.values()
        if s.accelerator == labels["cloud.google.com/gke-tpu-accelerator"]
        and s.topology == labels["cloud.google.com/gke-tpu-topology"]
    ]
    return slice_id


@pytest.mark.parametrize("flavor_name", TPU_FLAVORS)
def test_a_finetunejobs_training_job_or_jobset_gets_its_tpu_flavor(flavor_name: str) -> None:
    objs = render(VALUES)
    slice_id = flavor_slice(find(objs, "ResourceFlavor", flavor_name))
    workload = train_workload(owner(NAMESPACE, "sft", "uid-1"), finetune_spec(slice_id), 0)
    assert workload["kind"] == ("Job" if TPU_SLICES[slice_id].hosts == 1 else JOBSET_KIND)
    admitted_through_the_local_queue(objs, workload)
    assert assigned_flavor(objs, workload) == flavor_name


@pytest.mark.parametrize("evaluation_slice", ["v6e-8", "cpu"])
def test_the_preflight_merge_and_evaluation_jobs_get_theirs(evaluation_slice: str) -> None:
    """They run on the CPU nodes (the CPU flavor), the evaluation on the serving slice kind (v6e-8) or, with
    `slice: cpu`, there too. The 31B merge that verifies its output asks for the most memory."""
    objs = render(VALUES)
    spec = finetune_spec(
        "v5p-8",
        merge={"enabled": True, "writeAdapter": True, "verify": True},
        evaluation={"slice": evaluation_slice},
    )
    o = owner(NAMESPACE, "sft", "uid-1")
    jobs = {
        "preflight": preflight_objects(o, spec)[-1],
        "merge": merge_objects(o, spec)[-1],
        "evaluation": eval_job(o, spec),
    }
    for job in jobs.values():
        admitted_through_the_local_queue(objs, job)
    assigned = {what: assigned_flavor(objs, job) for what, job in jobs.items()}
    evaluation_flavor = "cpu" if evaluation_slice == "cpu" else "tpu-v6e-8"
    assert assigned == {"preflight": "cpu", "merge": "cpu", "evaluation": evaluation_flavor}


def test_spot_flavors_carry_the_spot_label_and_taint() -> None:
    spot = {"name": "tpu-v5p-8-spot", "accelerator": "tpu-v5p-slice", "topology": "2x2x1", "spot": True}
    with tempfile.TemporaryDirectory() as tmp:
        values = Path(tmp) / "v.yaml"
        values.write_text(
            yaml.safe_dump({"kueue": {"enabled": True, "flavors": [{**spot, "tpu": 4, "cpu": 200, "memory": "400Gi"}]}})
        )
        out = subprocess.run(
            [helm(), "template", RELEASE, str(CHART), "--values", str(values)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    flavor = next(o for o in yaml.safe_load_all(out) if o and o["kind"] == "ResourceFlavor")
    assert flavor["spec"]["nodeLabels"]["cloud.google.com/gke-spot"] == "true"
    spec = api.validate_finetune(
        {
            "model": {"name": "gemma4-31b", "uri": "gs://b/m"},
            "dataset": {"uri": "gs://b/d.jsonl"},
            "training": {"maxSeqLen": 4096},
            "tpu": {"slice": "v5p-8", "spot": True},
            "checkpoint": {"uri": "gs://b/ck"},
            "output": {"uri": "gs://b/out"},
            "serviceAccountName": "tpuforge-gcs",
        }
    )
    pod = train_job(owner(NAMESPACE, "sft", "uid-1"), spec, 0)["spec"]["template"]["spec"]
    assert flavor_matches(flavor, pod)
    # An on-demand pod does not tolerate the Spot taint: Kueue never places it on the Spot flavor.
    on_demand = spec.model_copy(update={"tpu": spec.tpu.model_copy(update={"spot": False})})
    assert not flavor_matches(flavor, train_job(owner(NAMESPACE, "sft", "u"), on_demand, 0)["spec"]["template"]["spec"])


def render_values(values: Obj) -> list[Obj]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        proc = subprocess.run(
            [helm(), "template", RELEASE, str(CHART), "--values", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


DWS_VALUES: Obj = {
    "kueue": {
        "enabled": True,
        "localQueues": [{"namespace": NAMESPACE, "name": QUEUE}],
        "flavors": [
            {
                "name": "tpu-v5p-8-flex",
                "accelerator": "tpu-v5p-slice",
                "topology": "2x2x1",
                "tpu": 4,
                "cpu": 200,
                "memory": "400Gi",
                "provisioning": True,
                "nodeLabels": {"cloud.google.com/gke-flex-start": "true"},
                "nodeTaints": [{"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}],
                "tolerations": [{"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"}],
            },
            {
                "name": "tpu-v6e-8-ml",
                "accelerator": "tpu-v6e-slice",
                "topology": "2x4",
                "tpu": 8,
                "cpu": 175,
                "memory": "1300Gi",
                "nodeLabels": {"cloud.google.com/gke-nodepool": "ml-v6e"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            },
        ],
        "provisioning": {"enabled": True, "parameters": {"maxRunDurationSeconds": 86400}},
    }
}


def test_dws_flex_start_objects_validate_against_kueues_schemas_and_apply_to_their_flavor_only() -> None:
    objs = [o for o in render_values(DWS_VALUES) if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    for obj in objs:
        # Go's regexp takes (?i) after ^ (AdmissionCheck's parameters.kind); Python's wants it first.
        text = json.dumps(upstream.kueue_schema(obj["kind"])).replace('"^(?i)', '"(?i)^')
        schema = json.loads(text)
        cls = jsonschema.validators.validator_for(schema)
        cast(jsonschema.protocols.Validator, cls(schema)).validate(obj)
    config = find(tuple(objs), "ProvisioningRequestConfig")
    assert config["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert config["spec"]["managedResources"] == ["google.com/tpu"]
    assert config["spec"]["parameters"] == {"maxRunDurationSeconds": "86400"}  # strings, as Kueue's schema has it
    check = find(tuple(objs), "AdmissionCheck")
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"]["name"] == config["metadata"]["name"]
    cq = find(tuple(objs), "ClusterQueue")
    assert cq["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": check["metadata"]["name"], "onFlavors": ["tpu-v5p-8-flex"]}
    ]
    flex = find(tuple(objs), "ResourceFlavor", "tpu-v5p-8-flex")["spec"]
    assert flex["nodeLabels"]["cloud.google.com/gke-flex-start"] == "true"
    assert {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"} in flex["nodeTaints"]
    dedicated = find(tuple(objs), "ResourceFlavor", "tpu-v6e-8-ml")["spec"]
    assert dedicated["nodeLabels"]["cloud.google.com/gke-nodepool"] == "ml-v6e"
    assert dedicated["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]


def test_no_admission_check_without_provisioning() -> None:
    cq = find(render(VALUES), "ClusterQueue")
    assert "admissionChecksStrategy" not in cq["spec"]
    assert not [o for o in render(VALUES) if o["kind"] in ("ProvisioningRequestConfig", "AdmissionCheck")]
