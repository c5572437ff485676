"""The GKE Autopilot profile: every workload the operator renders for both kinds passes the Autopilot checker
once made Autopilot-valid (training Job and JobSet, preflight, merge, evaluation on TPU and CPU with its code
checker, serving with each model storage and the adapters sidecar); the checker catches what Autopilot
refuses; the Standard rendering is left as it was; and the spec fields that cannot work on Autopilot are
refused naming the field. The rules' sources are in docs/platform-team.md ("GKE Autopilot")."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.finetune.specs import spec as job_spec
from tpuforge import api
from tpuforge.api import autopilot as ap_api
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.constants import (
    GKE_NODEPOOL,
    GKE_SPOT,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    INSTANCE_TYPE,
    TPU_RESOURCE,
)
from tpuforge.api.scheduling import GKE_FLEX_START, GKE_RESERVATION_AFFINITY, GKE_RESERVATION_NAME
from tpuforge.controllers.main import main, parser
from tpuforge.controllers.runtime.defaults import OperatorDefaults
from tpuforge.manifests import autopilot, serving, serving_inputs
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import attempt_objects
from tpuforge.manifests.preflight import preflight_objects

ROOT = Path(__file__).resolve().parents[3]
OWNER = owner("ml", "gemma-sft", "uid-1")
Obj = dict[str, Any]
AUTOPILOT = OperatorDefaults(cluster_profile="autopilot")
STANDARD = OperatorDefaults()


def example(name: str) -> Obj:
    doc: Obj = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


def finetune(name: str, **tpu: Any) -> api.FineTuneJobSpec:
    raw = example(name)["spec"]
    raw["tpu"] = {**raw.get("tpu", {}), **tpu}
    return api.validate_finetune(raw)


def serving_objects(medium: str = "Disk", example_name: str = "serving.yaml", **tpu: Any) -> list[Obj]:
    raw = example(example_name)["spec"]
    raw["tpu"] = {**raw.get("tpu", {}), **tpu}
    raw["modelStorage"] = {**raw.get("modelStorage", {}), "medium": medium}
    if medium == "HyperdiskML":
        raw["modelStorage"] |= {
            "storageClassName": "tpuforge-hyperdisk-ml",
            "dataSource": "merged-model",
        }
    spec = api.validate_serving(raw, "gemma4-31b")
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner("ml", "chat", "uid-2"),
        spec=spec,
        model_uri="gs://b/merged",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice(spec.tpu.slice),
        adapter_job_rank=64 if spec.adapters else None,
    )
    return [serving.deployment(inp)]


def cpu_eval() -> api.FineTuneJobSpec:
    spec = finetune("finetune-adapter.yaml")
    assert spec.evaluation is not None
    return spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"slice": "cpu"})})


def rendered() -> dict[str, list[Obj]]:
    """Every workload the operator creates for both kinds, by what it is (the other children too, where they
    come in the same list: ConfigMaps, Roles, Services pass through the profile unchanged)."""
    base = job_spec()
    return {
        "training Job (v5p-8)": attempt_objects(OWNER, base, 0),
        "training JobSet (v5p-16)": attempt_objects(OWNER, job_spec(tpu={"slice": "v5p-16"}), 0),
        "training on Spot": attempt_objects(OWNER, job_spec(tpu={"spot": True}), 0),
        "training on a reservation": attempt_objects(
            OWNER, job_spec(tpu={"scheduling": {"reservation": "projects/p/reservations/tpu-v5p"}}), 0
        ),
        "training on flex-start": attempt_objects(OWNER, job_spec(tpu={"scheduling": {"flexStart": True}}), 0),
        "training GRPO with its checker sidecar (v5p-8)": attempt_objects(OWNER, finetune("finetune-grpo.yaml"), 0),
        "training GRPO with its checker sidecar (v5p-16)": attempt_objects(
            OWNER, finetune("finetune-grpo.yaml", slice="v5p-16"), 0
        ),
        "preflight": preflight_objects(OWNER, base),
        "merge (verify)": merge_objects(OWNER, job_spec(merge={"verify": True})),
        "evaluation (TPU)": [eval_job(OWNER, finetune("finetune-adapter.yaml"))],
        "evaluation (passAtK, code checker)": [eval_job(OWNER, finetune("finetune-verilog-passk.yaml"))],
        "evaluation (CPU)": [eval_job(OWNER, cpu_eval())],
        "serving (Disk)": serving_objects("Disk"),
        "serving (NodeLocal)": serving_objects("NodeLocal"),
        "serving (HyperdiskML)": serving_objects("HyperdiskML"),
        "serving (adapters sidecar)": serving_objects(example_name="serving-adapters.yaml"),
        "serving on Spot": serving_objects(spot=True),
    }


def workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if autopilot.pod_specs(o)]


@pytest.mark.parametrize("what", list(rendered()))
def test_every_rendered_workload_is_autopilot_valid_under_the_autopilot_profile(what: str) -> None:
    objs = workloads(rendered()[what])
    assert objs, what
    for obj in objs:
        assert autopilot.object_problems(AUTOPILOT.workload(obj)) == []


@pytest.mark.parametrize("what", ["training Job (v5p-8)", "serving (Disk)", "merge (verify)"])
def test_the_standard_rendering_is_what_the_checker_refuses(what: str) -> None:
    # The checker is not vacuous: the Standard rendering states no ephemeral storage and (TPU) selects the
    # machine type; the profile is what fixes that.
    problems = [p for obj in workloads(rendered()[what]) for p in autopilot.object_problems(obj)]
    assert any("ephemeral-storage" in p for p in problems)


def test_the_standard_profile_leaves_every_object_as_rendered() -> None:
    for what, objs in rendered().items():
        for obj in objs:
            before = json.dumps(obj, sort_keys=True)
            assert STANDARD.workload(obj) is obj, what
            assert json.dumps(obj, sort_keys=True) == before


def test_the_autopilot_profile_leaves_the_rendered_object_itself_unchanged() -> None:
    obj = workloads(rendered()["training Job (v5p-8)"])[0]
    before = copy.deepcopy(obj)
    AUTOPILOT.workload(obj)
    assert obj == before


def tpu_pod(what: str) -> Obj:
    obj = AUTOPILOT.workload(workloads(rendered()[what])[0])
    return autopilot.pod_specs(obj)[0]


def test_tpus_are_chosen_by_accelerator_topology_and_chips_only() -> None:
    pod = tpu_pod("training Job (v5p-8)")
    assert pod["nodeSelector"] == {GKE_TPU_ACCELERATOR: "tpu-v5p-slice", GKE_TPU_TOPOLOGY: "2x2x1"}
    trainer = pod["containers"][0]["resources"]
    assert trainer["requests"][TPU_RESOURCE] == trainer["limits"][TPU_RESOURCE] == "4"
    # The TPU taint's toleration stays: harmless where GKE adds it itself.
    assert {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert INSTANCE_TYPE not in tpu_pod("serving (Disk)")["nodeSelector"]


def test_spot_reservation_and_flex_start_keep_the_selectors_autopilot_understands() -> None:
    spot = tpu_pod("training on Spot")
    assert spot["nodeSelector"][GKE_SPOT] == "true"
    assert tpu_pod("serving on Spot")["nodeSelector"][GKE_SPOT] == "true"
    reserved = tpu_pod("training on a reservation")["nodeSelector"]
    assert reserved[GKE_RESERVATION_NAME] == "tpu-v5p" and reserved[GKE_RESERVATION_AFFINITY] == "specific"
    assert tpu_pod("training on flex-start")["nodeSelector"][GKE_FLEX_START] == "true"


def test_limits_equal_requests_and_every_container_states_ephemeral_storage() -> None:
    for what, objs in rendered().items():
        for obj in workloads(objs):
            for pod in autopilot.pod_specs(AUTOPILOT.workload(obj)):
                for c in autopilot.containers(pod):
                    res = c["resources"]
                    for key in ("cpu", "memory", "ephemeral-storage"):
                        assert res["limits"][key] == res["requests"][key], (what, c["name"], key)


def test_sized_scratch_volumes_are_counted_in_ephemeral_storage_once() -> None:
    # The CPU evaluation's model copy is a sized emptyDir on the node's disk: the first container that mounts it
    # asks for it. A serving pod's NodeLocal model is already in vLLM's own request: not asked for twice.
    pod = autopilot.pod_specs(AUTOPILOT.workload(workloads(rendered()["evaluation (CPU)"])[0]))[0]
    sized = {
        v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if (v.get("emptyDir") or {}).get("sizeLimit")
    }
    total = sum(
        api.resources.quantity(c["resources"]["requests"]["ephemeral-storage"]) for c in autopilot.containers(pod)
    )
    assert total >= sum(api.resources.quantity(s) for s in sized.values())
    local = autopilot.pod_specs(AUTOPILOT.workload(rendered()["serving (NodeLocal)"][0]))[0]
    by_name = {c["name"]: c["resources"]["requests"]["ephemeral-storage"] for c in autopilot.containers(local)}
    model = next(v for v in local["volumes"] if v["name"] == "model")["emptyDir"]["sizeLimit"]
    assert by_name[serving.VLLM_CONTAINER] == model
    assert api.resources.quantity(by_name[serving.FETCH_CONTAINER]) < api.resources.quantity(model)


# --- The checker ------------------------------------------------------------------------------------------


def valid_pod() -> Obj:
    return copy.deepcopy(tpu_pod("serving (Disk)"))


def test_the_checker_accepts_a_valid_pod() -> None:
    assert autopilot.autopilot_problems(valid_pod()) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda p: p.update(hostNetwork=True), "hostNetwork"),
        (lambda p: p.update(hostPID=True), "hostPID"),
        (lambda p: p["volumes"].append({"name": "logs", "hostPath": {"path": "/var/log"}}), "hostPath"),
        (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (
            lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["NET_RAW"]),
            "NET_RAW",
        ),
        (lambda p: p["containers"][0]["ports"].append({"containerPort": 9, "hostPort": 9}), "hostPort"),
        (lambda p: p["nodeSelector"].update({GKE_NODEPOOL: "tpu-pool"}), GKE_NODEPOOL),
        (
            lambda p: p.update(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": GKE_NODEPOOL, "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            ),
            GKE_NODEPOOL,
        ),
        (lambda p: p["nodeSelector"].pop(GKE_TPU_TOPOLOGY), GKE_TPU_TOPOLOGY),
        (lambda p: p["nodeSelector"].update({INSTANCE_TYPE: "ct6e-standard-8t"}), INSTANCE_TYPE),
        (lambda p: p["containers"][0]["resources"]["requests"].pop("ephemeral-storage"), "ephemeral-storage"),
        (lambda p: p["containers"][0]["resources"]["limits"].update(memory="1Ti"), "memory limit"),
        (lambda p: p["containers"][0]["resources"]["limits"].pop(TPU_RESOURCE), TPU_RESOURCE),
    ],
)
def test_the_checker_names_what_autopilot_refuses(change: Any, says: str) -> None:
    pod = valid_pod()
    change(pod)
    problems = autopilot.autopilot_problems(pod)
    assert problems and any(says in p for p in problems), problems


def test_the_checkers_capabilities_admit_the_evaluation_checkers_uid_switch() -> None:
    pod = autopilot.pod_specs(AUTOPILOT.workload(rendered()["evaluation (passAtK, code checker)"][0]))[0]
    added = {cap for c in autopilot.containers(pod) for cap in c["securityContext"]["capabilities"].get("add", [])}
    assert added == {"SETUID", "SETGID"}
    assert autopilot.autopilot_problems(pod) == []


# --- Refused specs ----------------------------------------------------------------------------------------


def test_a_finetune_job_selecting_a_node_pool_is_refused_on_autopilot_naming_each_field() -> None:
    pool = {GKE_NODEPOOL: "tpu-pool"}
    spec = job_spec(
        tpu={"scheduling": {"nodeSelector": pool}},
        merge={"nodeSelector": pool},
        preflight={"nodeSelector": pool},
    )
    fields = [e.field for e in AUTOPILOT.profile_errors(spec)]
    assert fields == [
        f"spec.tpu.scheduling.nodeSelector[{GKE_NODEPOOL}]",
        f"spec.preflight.nodeSelector[{GKE_NODEPOOL}]",
        f"spec.merge.nodeSelector[{GKE_NODEPOOL}]",
    ]
    message = AUTOPILOT.profile_errors(spec)[0].message
    assert "Autopilot" in message and "Remove the key" in message
    assert STANDARD.profile_errors(spec) == []


def test_an_evaluation_and_a_serving_deployment_selecting_a_node_pool_are_refused_on_autopilot() -> None:
    spec = finetune("finetune-adapter.yaml")
    assert spec.evaluation is not None
    ev = spec.evaluation.model_copy(update={"node_selector": {GKE_NODEPOOL: "cpu"}})
    fields = [f for f, _ in ap_api.finetune_autopilot_errors(spec.model_copy(update={"evaluation": ev}))]
    assert fields == [f"spec.evaluation.nodeSelector[{GKE_NODEPOOL}]"]
    raw = example("serving.yaml")["spec"]
    raw["tpu"] = {**raw.get("tpu", {}), "scheduling": {"nodeSelector": {GKE_NODEPOOL: "v6e"}}}
    served = api.validate_serving(raw, "gemma4-31b")
    assert [e.field for e in AUTOPILOT.profile_errors(served)] == [f"spec.tpu.scheduling.nodeSelector[{GKE_NODEPOOL}]"]


def test_the_operator_takes_its_cluster_profile_from_a_flag() -> None:
    assert parser().parse_args([]).cluster_profile == "standard"
    assert parser().parse_args(["--cluster-profile", "autopilot"]).cluster_profile == "autopilot"
    with pytest.raises(SystemExit):
        parser().parse_args(["--cluster-profile", "gke"])


@pytest.mark.parametrize(
    ("spot", "grace", "refused"), [(True, 30, True), (True, 25, False), (True, None, False), (False, 60, False)]
)
def test_a_spot_grace_above_what_autopilot_gives_a_spot_pod_is_refused(
    spot: bool, grace: int | None, refused: bool
) -> None:
    tpu: dict[str, Any] = {"spot": spot, **({"spotGraceSeconds": grace} if grace is not None else {})}
    errors = AUTOPILOT.profile_errors(job_spec(tpu=tpu))
    assert [e.field for e in errors] == (["spec.tpu.spotGraceSeconds"] if refused else [])
    raw = example("serving.yaml")["spec"]
    raw["tpu"] = {**raw.get("tpu", {}), **tpu}
    served = AUTOPILOT.profile_errors(api.validate_serving(raw, "gemma4-31b"))
    assert [e.field for e in served] == (["spec.tpu.spotGraceSeconds"] if refused else [])
    if refused:
        assert "25" in errors[0].message and STANDARD.profile_errors(job_spec(tpu=tpu)) == []


def test_the_operator_refuses_a_default_spot_grace_autopilot_never_gives() -> None:
    with pytest.raises(SystemExit):
        main(["--cluster-profile", "autopilot", "--spot-grace-seconds", "30"])
