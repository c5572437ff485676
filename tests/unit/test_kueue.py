"""The chart's Kueue objects (kueue.enabled): valid against Kueue's published v1beta1 CRDs (vendored in
tests/upstream/kueue/), and admitting what the operator builds: a FineTuneJob's queue label names a LocalQueue
of the ClusterQueue, one ResourceFlavor matches its pods' node selector and taints, and that flavor's quota
covers every resource the pods request (Kueue admits a workload only when all of them are covered and fit).
The requirement and its sources: docs/platform-team.md, "Queues and priorities"."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import yaml

from tests.fixtures import upstream
from tests.unit.test_helm_chart import CHART, RELEASE, find, helm, render
from tpuforge import api
from tpuforge.api import resources
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import LABEL_KUEUE_QUEUE
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_training import train_job, train_workload

Obj = dict[str, Any]
VALUES = "workloads-on"
NAMESPACE = "ml-team"
QUEUE = "tpu"


def kueue_objects() -> list[Obj]:
    return [o for o in render(VALUES) if o["apiVersion"].startswith("kueue.x-k8s.io/")]


def test_kueue_is_off_by_default() -> None:
    assert not [o for o in render("default") if o["apiVersion"].startswith("kueue.x-k8s.io/")]


def test_objects_validate_against_kueues_published_v1beta1_schemas() -> None:
    objs = kueue_objects()
    assert sorted(o["kind"] for o in objs) == ["ClusterQueue", "LocalQueue", *["ResourceFlavor"] * 3]
    for obj in objs:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        schema = upstream.kueue_schema(obj["kind"])
        cls = jsonschema.validators.validator_for(schema)
        cast(jsonschema.protocols.Validator, cls(schema)).validate(obj)
    # The closed schema refuses what Kueue would prune without a word.
    misspelt = {**find(render(VALUES), "LocalQueue"), "spec": {"clusterQeue": "x"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, upstream.kueue_schema("LocalQueue"))


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


def flavor_slice(flavor: Obj) -> str:
    labels = flavor["spec"]["nodeLabels"]
    (slice_id,) = [
        s.id
        for s in TPU_SLICES.values()
        if s.accelerator == labels["cloud.google.com/gke-tpu-accelerator"]
        and s.topology == labels["cloud.google.com/gke-tpu-topology"]
    ]
    return slice_id


@pytest.mark.parametrize("flavor_name", ["tpu-v5p-8", "tpu-v5p-16", "tpu-v6e-16"])
def test_a_finetunejobs_queue_label_admits_its_job_or_jobset(flavor_name: str) -> None:
    objs = render(VALUES)
    flavors = [o for o in objs if o["kind"] == "ResourceFlavor"]
    flavor = next(f for f in flavors if f["metadata"]["name"] == flavor_name)
    slice_id = flavor_slice(flavor)
    spec = api.validate_finetune(
        {
            "model": {"name": "gemma4-31b", "uri": "gs://b/m"},
            "dataset": {"uri": "gs://b/d.jsonl"},
            "training": {"maxSeqLen": 4096},
            "tpu": {"slice": slice_id},
            "checkpoint": {"uri": "gs://b/ck"},
            "output": {"uri": "gs://b/out"},
            "queueName": QUEUE,
        }
    )
    workload = train_workload(owner(NAMESPACE, "sft", "uid-1"), spec, 0)
    # The label Kueue's Job and JobSet integrations read, on the object Kueue suspends and admits.
    assert workload["metadata"]["labels"][LABEL_KUEUE_QUEUE] == QUEUE
    assert workload["kind"] == ("Job" if TPU_SLICES[slice_id].hosts == 1 else "JobSet")
    local = find(objs, "LocalQueue", QUEUE)
    assert local["metadata"]["namespace"] == workload["metadata"]["namespace"] == NAMESPACE
    cq = find(objs, "ClusterQueue")
    assert local["spec"]["clusterQueue"] == cq["metadata"]["name"]
    assert cq["spec"]["namespaceSelector"] == {}  # every namespace with a LocalQueue may use it

    if workload["kind"] == "Job":
        pods, pod = 1, workload["spec"]["template"]["spec"]
    else:
        (rj,) = workload["spec"]["replicatedJobs"]
        pods, pod = rj["replicas"] * rj["template"]["spec"]["parallelism"], rj["template"]["spec"]["template"]["spec"]
    # Exactly one flavor fits the pods, and it is this pool kind's.
    assert [f["metadata"]["name"] for f in flavors if flavor_matches(f, pod)] == [flavor_name]

    (group,) = cq["spec"]["resourceGroups"]
    quota = next(f for f in group["flavors"] if f["name"] == flavor_name)["resources"]
    assert [r["name"] for r in quota] == group["coveredResources"]
    wanted: dict[str, Any] = {}
    for c in pod["containers"]:
        for name, value in c["resources"]["requests"].items():
            wanted[name] = wanted.get(name, 0) + resources.quantity(value) * pods
    assert set(wanted) <= set(group["coveredResources"]), "Kueue refuses a workload asking for an uncovered resource"
    for r in quota:
        assert wanted[r["name"]] <= resources.quantity(str(r["nominalQuota"])), r["name"]


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
        }
    )
    pod = train_job(owner(NAMESPACE, "sft", "uid-1"), spec, 0)["spec"]["template"]["spec"]
    assert flavor_matches(flavor, pod)
    # An on-demand pod does not tolerate the Spot taint: Kueue never places it on the Spot flavor.
    on_demand = spec.model_copy(update={"tpu": spec.tpu.model_copy(update={"spot": False})})
    assert not flavor_matches(flavor, train_job(owner(NAMESPACE, "sft", "u"), on_demand, 0)["spec"]["template"]["spec"])
