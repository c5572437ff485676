"""spec.tpu.scheduling and spec.evaluation.scheduling (tpuforge.api.scheduling): what the operator refuses, naming
the field and the fix, and what the pods it builds carry; and the serving volumes' storage rules (a shared cache
needs a class that shares, Hyperdisk ML for the model)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.finetune.specs import OWNER, pod, spec
from tests.fixtures.serving import inputs
from tpuforge import api
from tpuforge.api.constants import GKE_SPOT, GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, INSTANCE_TYPE, TPU_RESOURCE
from tpuforge.api.scheduling import (
    GKE_FLEX_START,
    GKE_QUEUED,
    GKE_RESERVATION_AFFINITY,
    GKE_RESERVATION_NAME,
    GKE_RESERVATION_PROJECT,
)
from tpuforge.manifests import serving
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_training import train_job, train_jobset

DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
EVALUATION: dict[str, Any] = {"datasetUri": "gs://b/data/eval.jsonl"}


def refused(make: Any, **raw: Any) -> list[str]:
    with pytest.raises(api.SpecError) as e:
        make(**raw)
    return [str(err) for err in e.value.errors]


def test_training_pods_take_a_dedicated_pools_labels_tolerations_annotations_and_priority() -> None:
    s = spec(
        tpu={
            "scheduling": {
                "nodeSelector": {"cloud.google.com/gke-nodepool": "v5p-ml"},
                "tolerations": [DEDICATED],
                "annotations": {"gke-gcsfuse/volumes": "true"},
                "priorityClassName": "ml-high",
            }
        }
    )
    template = train_job(OWNER, s, 1)["spec"]["template"]
    p = template["spec"]
    assert p["nodeSelector"]["cloud.google.com/gke-nodepool"] == "v5p-ml"
    assert p["nodeSelector"][GKE_TPU_TOPOLOGY] == "2x2x1"  # the slice's labels stay
    assert p["tolerations"][0]["key"] == TPU_RESOURCE and DEDICATED in p["tolerations"]
    assert p["priorityClassName"] == "ml-high"
    assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}


def test_a_multi_host_slices_pods_take_them_too() -> None:
    s = spec(tpu={"slice": "v5p-16", "scheduling": {"reservation": "v5p-reserved"}})
    p = train_jobset(OWNER, s, 1)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert p["nodeSelector"][GKE_RESERVATION_NAME] == "v5p-reserved"
    assert p["nodeSelector"][GKE_RESERVATION_AFFINITY] == "specific"


def test_a_shared_reservation_selects_its_name_and_its_owners_project_in_labels_of_their_own() -> None:
    shared = "projects/capacity-owner/reservations/v5p-shared"
    selector = pod(train_job(OWNER, spec(tpu={"scheduling": {"reservation": shared}}), 1))["nodeSelector"]
    assert selector[GKE_RESERVATION_NAME] == "v5p-shared"
    assert selector[GKE_RESERVATION_PROJECT] == "capacity-owner"
    assert selector[GKE_RESERVATION_AFFINITY] == "specific"
    serving_selector = serving.deployment(inputs(tpu={"scheduling": {"reservation": shared}}))["spec"]["template"]
    assert serving_selector["spec"]["nodeSelector"][GKE_RESERVATION_PROJECT] == "capacity-owner"
    # The cluster's own reservation names no project.
    own = pod(train_job(OWNER, spec(tpu={"scheduling": {"reservation": "v5p-reserved"}}), 1))["nodeSelector"]
    assert GKE_RESERVATION_PROJECT not in own


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        ({"tpu": {"scheduling": {"nodeSelector": {"pool": "a/b"}}}}, "spec.tpu.scheduling.nodeSelector[pool]", "'/'"),
        (
            {"tpu": {"scheduling": {"nodeSelector": {"bad key!": "x"}}}},
            "spec.tpu.scheduling.nodeSelector[bad key!]",
            "label key",
        ),
        ({"merge": {"nodeSelector": {"pool": "x" * 64}}}, "spec.merge.nodeSelector[pool]", "at most 63"),
        ({"preflight": {"nodeSelector": {"pool": "-cpu"}}}, "spec.preflight.nodeSelector[pool]", "not a label value"),
        ({"queueName": "team/a"}, "spec.queueName", "kueue.x-k8s.io/queue-name"),
        (
            {"tpu": {"scheduling": {"reservation": "projects/p/reservations/" + "r" * 64}}},
            "spec.tpu.scheduling.reservation",
            "at most 63",
        ),
        ({"tpu": {"scheduling": {"reservation": "projects/p/v5p"}}}, "spec.tpu.scheduling.reservation", "pattern"),
    ],
)
def test_every_label_the_children_would_carry_is_checked_naming_its_field(
    raw: dict[str, Any], field: str, says: str
) -> None:
    errors = refused(spec, **raw)
    assert any(e.startswith(field) and says in e for e in errors), errors


def test_serving_refuses_a_node_label_value_kubernetes_would() -> None:
    errors = refused(inputs, tpu={"scheduling": {"nodeSelector": {"pool": "a b"}}})
    assert errors == [
        "spec.tpu.scheduling.nodeSelector[pool]: 'a b' is not a label value: use letters, digits, '-', '_' and '.', "
        "starting and ending with a letter or digit (no '/', ':' or spaces)"
    ]


def test_flex_start_selects_its_nodes_and_tolerates_the_queued_taint() -> None:
    p = pod(train_job(OWNER, spec(tpu={"scheduling": {"flexStart": True}}), 1))
    assert p["nodeSelector"][GKE_FLEX_START] == "true"
    assert {"key": GKE_QUEUED, "operator": "Exists", "effect": "NoSchedule"} in p["tolerations"]


def test_without_scheduling_the_pods_are_as_before() -> None:
    template = train_job(OWNER, spec(), 1)["spec"]["template"]
    assert "annotations" not in template["metadata"] and "priorityClassName" not in template["spec"]
    assert set(template["spec"]["nodeSelector"]) == {GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, INSTANCE_TYPE}


def test_the_evaluation_pod_takes_its_own_scheduling_on_its_own_slice() -> None:
    s = spec(
        merge={"writeAdapter": True},
        evaluation={
            **EVALUATION,
            "nodeSelector": {"pool": "eval"},
            "scheduling": {"reservation": "v6e-reserved", "tolerations": [DEDICATED]},
        },
        tpu={"scheduling": {"reservation": "v5p-reserved"}},
    )
    template = eval_job(OWNER, s)["spec"]["template"]
    selector = template["spec"]["nodeSelector"]
    assert selector[GKE_RESERVATION_NAME] == "v6e-reserved" and selector["pool"] == "eval"
    assert selector[GKE_TPU_ACCELERATOR] == "tpu-v6e-slice"
    assert DEDICATED in template["spec"]["tolerations"]


def test_serving_pods_take_scheduling_and_keep_the_operators_annotations() -> None:
    inp = inputs(
        tpu={
            "scheduling": {
                "nodeSelector": {GKE_TPU_TOPOLOGY: "2x4", "cloud.google.com/gke-nodepool": "serving"},
                "tolerations": [DEDICATED],
                "annotations": {"gke-gcsfuse/volumes": "true", "prometheus.io/port": "9999"},
                "priorityClassName": "serving",
            }
        }
    )
    template = serving.pod_template(inp)
    assert template["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] == "serving"
    assert DEDICATED in template["spec"]["tolerations"] and template["spec"]["priorityClassName"] == "serving"
    annotations = template["metadata"]["annotations"]
    assert annotations["gke-gcsfuse/volumes"] == "true"
    assert annotations["prometheus.io/port"] == "8000"  # the operator's own win
    assert annotations[serving.ANNOTATION_MODEL_URI]


@pytest.mark.parametrize(
    ("scheduling", "field", "says"),
    [
        (
            {"nodeSelector": {GKE_TPU_TOPOLOGY: "2x2x2"}},
            f"spec.tpu.scheduling.nodeSelector[{GKE_TPU_TOPOLOGY}]",
            "v5p-8",
        ),
        (
            {"nodeSelector": {INSTANCE_TYPE: "ct6e-standard-8t"}},
            f"spec.tpu.scheduling.nodeSelector[{INSTANCE_TYPE}]",
            "remove the key",
        ),
        ({"nodeSelector": {GKE_SPOT: "true"}}, f"spec.tpu.scheduling.nodeSelector[{GKE_SPOT}]", "spec.tpu.spot: true"),
        (
            {"nodeSelector": {GKE_RESERVATION_NAME: "r"}},
            f"spec.tpu.scheduling.nodeSelector[{GKE_RESERVATION_NAME}]",
            "reservation",
        ),
        (
            {"nodeSelector": {GKE_FLEX_START: "true"}},
            f"spec.tpu.scheduling.nodeSelector[{GKE_FLEX_START}]",
            "flexStart",
        ),
        (
            {"annotations": {"tpuforge.dev/model-uri": "x"}},
            "spec.tpu.scheduling.annotations[tpuforge.dev/model-uri]",
            "operator's",
        ),
        ({"reservation": "r", "flexStart": True}, "spec.tpu.scheduling", "set one of them"),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "spec.tpu.scheduling.tolerations[0]",
            "no value",
        ),
        ({"tolerations": [{"operator": "Equal", "value": "v"}]}, "spec.tpu.scheduling.tolerations[0]", "needs a key"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "spec.tpu.scheduling.tolerations[0]", "NoExecute"),
        ({"tolerations": [{"key": "not a key!"}]}, "spec.tpu.scheduling.tolerations[0].key", ""),
    ],
)
def test_scheduling_that_contradicts_the_operator_is_refused_naming_the_field(
    scheduling: dict[str, Any], field: str, says: str
) -> None:
    errors = refused(spec, tpu={"scheduling": scheduling})
    assert any(e.startswith(field) and says in e for e in errors), errors


def test_spot_takes_no_reservation_or_flex_start_and_the_two_priority_classes_must_agree() -> None:
    for scheduling, field in (({"reservation": "r"}, "reservation"), ({"flexStart": True}, "flexStart")):
        errors = refused(spec, tpu={"spot": True, "scheduling": scheduling})
        assert any(e.startswith(f"spec.tpu.scheduling.{field}:") and "spec.tpu.spot: false" in e for e in errors)
    errors = refused(spec, priorityClassName="low", tpu={"scheduling": {"priorityClassName": "high"}})
    assert errors[0].startswith("spec.tpu.scheduling.priorityClassName: 'high' differs from spec.priorityClassName")
    # Repeating the slice's own labels, or Spot's on Spot, is fine.
    spec(tpu={"spot": True, "scheduling": {"nodeSelector": {GKE_SPOT: "true", GKE_TPU_TOPOLOGY: "2x2x1"}}})


def test_the_evaluations_node_selectors_may_not_contradict_its_slice_or_each_other() -> None:
    base = {"merge": {"writeAdapter": True}}
    errors = refused(spec, **base, evaluation={**EVALUATION, "nodeSelector": {GKE_TPU_TOPOLOGY: "2x2"}})
    assert any(e.startswith(f"spec.evaluation.nodeSelector[{GKE_TPU_TOPOLOGY}]") for e in errors), errors
    errors = refused(
        spec,
        **base,
        evaluation={**EVALUATION, "nodeSelector": {"pool": "a"}, "scheduling": {"nodeSelector": {"pool": "b"}}},
    )
    assert errors == [
        "spec.evaluation.scheduling.nodeSelector[pool]: 'b' differs from spec.evaluation.nodeSelector[pool] 'a'; "
        "keep one"
    ]
    # On a CPU node the TPU labels are nobody's: any pool may be chosen.
    spec(**base, evaluation={**EVALUATION, "slice": "cpu", "nodeSelector": {GKE_TPU_TOPOLOGY: "x"}})


def test_serving_scheduling_is_checked_against_its_slice() -> None:
    errors = refused(inputs, tpu={"scheduling": {"nodeSelector": {GKE_TPU_ACCELERATOR: "tpu-v5p-slice"}}})
    assert any(
        e.startswith(f"spec.tpu.scheduling.nodeSelector[{GKE_TPU_ACCELERATOR}]") and "v6e-8" in e for e in errors
    )


# --- Storage ----------------------------------------------------------------------------------------------


def test_a_shared_cache_needs_a_class_that_shares() -> None:
    errors = refused(inputs, xlaCache={"accessMode": "ReadWriteMany"})
    assert errors[0].startswith("spec.xlaCache.storageClassName: required with accessMode ReadWriteMany")
    inp = inputs(xlaCache={"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"})
    assert serving.xla_cache_pvc(inp)["spec"]["storageClassName"] == "standard-rwx"


def test_hyperdisk_ml_model_volume_is_read_only_many_filled_by_the_volume_populator() -> None:
    storage = {"medium": "HyperdiskML", "storageClassName": "tpuforge-hyperdisk-ml", "dataSource": "gemma4-31b"}
    inp = inputs(replicas=2, modelStorage=storage, xlaCache={"accessMode": "ReadWriteMany", "storageClassName": "rwx"})
    claim = serving.model_pvc(inp)
    assert claim is not None
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert claim["spec"]["storageClassName"] == "tpuforge-hyperdisk-ml"
    assert claim["spec"]["dataSourceRef"] == {
        "apiGroup": "datalayer.gke.io",
        "kind": "GCPDataSource",
        "name": "gemma4-31b",
    }
    p = serving.pod_template(inp)["spec"]
    assert "initContainers" not in p  # nothing to fetch: the volume arrives filled
    model = next(v for v in p["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"]["readOnly"] is True
    assert serving.strategy(inp.spec)["type"] == "RollingUpdate"  # every volume attaches to many nodes


def test_hyperdisk_ml_needs_its_class_and_a_data_source_and_nothing_else_takes_one() -> None:
    errors = refused(inputs, modelStorage={"medium": "HyperdiskML"})
    assert [e.split(":")[0] for e in errors] == ["spec.modelStorage.storageClassName", "spec.modelStorage.dataSource"]
    errors = refused(inputs, modelStorage={"dataSource": "x"})
    assert errors == ["spec.modelStorage.dataSource: used with medium HyperdiskML only; remove it"]
    shared_cache = {"accessMode": "ReadWriteMany", "storageClassName": "rwx"}
    errors = refused(inputs, replicas=2, xlaCache=shared_cache, modelStorage={"medium": "Disk"})
    assert "HyperdiskML" in errors[0]
