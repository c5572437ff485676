"""The pods the operator builds meet what GKE asks of them: requests on every container (no BestEffort pod),
requests that fit the TPU machine types, Spot's 15 s of grace, the non-root switch for TPU containers, no
compiler flags TPUs ignore, and the multi-host ports declared. Each test names the requirement; the sources are
in docs/platform-team.md ("What GKE asks of the pods")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuforge import api
from tpuforge.api import resources
from tpuforge.api.catalog import MODELS, TPU_SLICES, model_shape, tpu_slice
from tpuforge.api.constants import (
    COORDINATOR_PORT,
    GKE_SPOT_GRACE_SECONDS,
    SPOT_NOTICE_ENV,
    TPU_RESOURCE,
    TPU_RUNTIME_PORT,
)
from tpuforge.manifests import serving, serving_inputs
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import (
    TRAINER_TERMINATION_GRACE_SECONDS,
    train_job,
    train_jobset,
    trainer_grace_seconds,
)

ROOT = Path(__file__).resolve().parents[3]
Obj = dict[str, Any]


def example(name: str) -> Obj:
    doc: Obj = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


def job_spec(**overrides: Any) -> api.FineTuneJobSpec:
    raw = example("finetune.yaml")["spec"]
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value}
    return api.validate_finetune(raw)


def chat_inputs(**overrides: Any) -> serving_inputs.ServingInputs:
    raw = example("serving-adapters.yaml")["spec"]
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value}
    spec = api.validate_serving(raw, "gemma4-31b")
    return serving_inputs.ServingInputs(
        owner=serving_inputs.owner("ml", "chat", "uid-2"),
        spec=spec,
        model_uri="gs://b/merged",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice(spec.tpu.slice),
        adapter_job_rank=64,
    )


OWNER = owner("ml", "gemma-sft", "uid-1")


def pod_specs(
    spec: api.FineTuneJobSpec | None = None, sdep: serving_inputs.ServingInputs | None = None
) -> dict[str, Obj]:
    """Every pod the operator creates for a job and a ServingDeployment, by what it is."""
    spec = spec or job_spec()
    adapter = api.validate_finetune(example("finetune-adapter.yaml")["spec"])
    adapter = adapter.model_copy(update={"tpu": adapter.tpu.model_copy(update={"run_as_root": spec.tpu.run_as_root})})
    assert adapter.evaluation is not None and adapter.evaluation.slice != "cpu"
    cpu_eval = adapter.model_copy(update={"evaluation": adapter.evaluation.model_copy(update={"slice": "cpu"})})
    multi = spec.model_copy(update={"tpu": spec.tpu.model_copy(update={"slice": "v5p-16"})})
    jobset = train_jobset(OWNER, multi, 0)
    return {
        "trainer": train_job(OWNER, spec, 0)["spec"]["template"]["spec"],
        "trainer (multi-host)": jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"],
        "merge": merge_objects(OWNER, spec)[1]["spec"]["template"]["spec"],
        "evaluation (TPU)": eval_job(OWNER, adapter)["spec"]["template"]["spec"],
        "evaluation (CPU)": eval_job(OWNER, cpu_eval)["spec"]["template"]["spec"],
        "vLLM": serving.pod_template(sdep or chat_inputs())["spec"],
    }


def containers(pod: Obj) -> list[Obj]:
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize("what", list(pod_specs()))
def test_no_pod_is_best_effort(what: str) -> None:
    # Kubernetes node-pressure eviction: BestEffort pods (no requests) go first, and a memory-backed /dev/shm
    # is memory the node can run short of.
    for c in containers(pod_specs()[what]):
        requests = c["resources"]["requests"]
        assert resources.quantity(requests["cpu"]) > 0 and resources.quantity(requests["memory"]) > 0, c["name"]


@pytest.mark.parametrize("slice_id", sorted(TPU_SLICES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_default_tpu_requests_fit_the_machine_type_gke_schedules_on_or_are_refused(slice_id: str, model: str) -> None:
    # GKE node allocatable: what a node leaves for pods once the system's share is reserved; a request above it
    # never schedules. A default the host cannot hold (v5litepod-1's 48 GB host beside the trainer's compile
    # cache and runtime) is refused at validation, naming the field to set, never left Pending.
    slc, shape = tpu_slice(slice_id), model_shape(model)
    room = resources.allocatable_memory_bytes(slc.host_memory_bytes)
    for requests in (
        resources.trainer_requests(api.PodResources(), shape, slc.hosts),
        resources.tpu_server_requests(api.PodResources(), shape),
    ):
        assert resources.quantity(requests["cpu"]) <= resources.allocatable_cpus(slc.host_cpus)
        errors = resources.resource_errors("spec.tpu.resources", api.PodResources(), slc, requests)
        if resources.quantity(requests["memory"]) <= room:
            assert errors == []
        else:
            assert [f for f, _ in errors] == ["spec.tpu.resources.memory"]
            assert slc.machine_type in errors[0][1] and "set it to at most" in errors[0][1]
            fixed = api.PodResources(memory=f"{room // resources.GIB}Gi")
            assert resources.resource_errors("spec.tpu.resources", fixed, slc, requests) == []


def test_every_catalog_model_fits_the_host_of_its_own_training_slice() -> None:
    # The slice the catalog picks for a model needs no override.
    for shape in MODELS.values():
        if not shape.train_slice:
            continue
        slc = tpu_slice(shape.train_slice)
        requests = resources.trainer_requests(api.PodResources(), shape, slc.hosts)
        assert resources.quantity(requests["memory"]) <= resources.allocatable_memory_bytes(slc.host_memory_bytes)


def test_allocatable_follows_gkes_reservation_table() -> None:
    # 448 GB (ct5p-hightpu-4t): 1 + 0.8 + 0.8 + 6.72 GiB for the first 128 GiB, 2% of the rest, 100 MiB eviction.
    total = 448 * 10**9
    reserved = 9.32 * resources.GIB + 0.02 * (total - 128 * resources.GIB) + 100 * (1 << 20)
    assert resources.allocatable_memory_bytes(total) == pytest.approx(total - reserved, abs=1)
    assert resources.allocatable_cpus(208) == pytest.approx(208 - 0.06 - 0.01 - 0.01 - 0.0025 * 204)


def test_the_trainers_request_covers_its_shm_and_its_share_of_the_model() -> None:
    # A memory-backed emptyDir counts against the pod's memory (Kubernetes emptyDir, medium: Memory); the
    # base model passes through host memory on its way to the chips, each host's share of it only.
    pod = pod_specs()["trainer"]
    shm = resources.quantity(next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"])
    weights = model_shape("gemma4-31b").weight_bytes
    one_host = resources.quantity(pod["containers"][0]["resources"]["requests"]["memory"])
    assert one_host > shm + weights  # v5p-8: one host reads the whole model
    two_hosts = resources.quantity(
        resources.trainer_requests(api.PodResources(), model_shape("gemma4-31b"), 2)["memory"]
    )
    assert shm + weights // 2 < two_hosts < one_host - weights // 2 + resources.GIB


def test_requests_are_configurable_and_bad_ones_name_the_field() -> None:
    spec = job_spec(tpu={"resources": {"cpu": "32", "memory": "300Gi"}})
    requests = pod_specs(spec)["trainer"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "32", "memory": "300Gi", TPU_RESOURCE: "4"}
    with pytest.raises(api.SpecError) as e:
        job_spec(tpu={"resources": {"memory": "500Gi"}})
    assert e.value.fields == ["spec.tpu.resources.memory"]
    assert "ct5p-hightpu-4t" in str(e.value) and "402Gi" in str(e.value)
    with pytest.raises(api.SpecError) as e:
        job_spec(merge={"resources": {"cpu": "lots"}})
    assert e.value.fields == ["spec.merge.resources.cpu"]
    sdep = chat_inputs(tpu={"resources": {"cpu": "16", "memory": "200Gi"}})
    vllm = serving.pod_template(sdep)["spec"]["containers"][0]
    # A streamed model's XLA cache (ReadWriteOnce by default) is the node's disk, and requested as such.
    assert vllm["resources"]["requests"] == {
        "cpu": "16",
        "memory": "200Gi",
        TPU_RESOURCE: "8",
        "ephemeral-storage": "20Gi",
    }


def test_on_spot_the_trainer_checkpoints_on_gkes_notice_and_keeps_its_long_grace_for_other_stops() -> None:
    # GKE Spot VMs: graceful node shutdown gives non-system pods 15 s; a longer grace has no effect on a reclaim.
    assert GKE_SPOT_GRACE_SECONDS == 15
    spot = pod_specs(job_spec(tpu={"spot": True}), chat_inputs(tpu={"spot": True}))
    assert spot["vLLM"]["terminationGracePeriodSeconds"] == 15
    # The trainer starts its checkpoint on GKE's shutdown notice, before the node's SIGTERM; a drain, Kueue's
    # preemption or a suspend honour the pod's own grace, which stays long enough for a slow link.
    trainer = spot["trainer"]
    assert trainer["terminationGracePeriodSeconds"] == TRAINER_TERMINATION_GRACE_SECONDS == 300
    assert {"name": SPOT_NOTICE_ENV, "value": "1"} in trainer["containers"][0]["env"]
    on_demand = pod_specs(job_spec(tpu={"spot": False}))["trainer"]
    assert on_demand["terminationGracePeriodSeconds"] == 300
    assert SPOT_NOTICE_ENV not in {e["name"] for e in on_demand["containers"][0]["env"]}
    # What a checkpoint is held against (CheckpointWithinGrace) is what a reclaim gives: 15 s, or what node
    # pools that lengthen their Spot shutdown (GKE 1.35, up to 120 s) give, as the spec or the operator says.
    assert trainer_grace_seconds(job_spec(tpu={"spot": True})) == 15
    assert trainer_grace_seconds(job_spec(tpu={"spot": True, "spotGraceSeconds": 120})) == 120
    longer = chat_inputs(tpu={"spot": True, "spotGraceSeconds": 120})
    assert pod_specs(job_spec(), longer)["vLLM"]["terminationGracePeriodSeconds"] == 120
    from tpuforge.controllers.runtime.defaults import OperatorDefaults

    cluster = OperatorDefaults(spot_grace_seconds=90)
    assert trainer_grace_seconds(cluster.apply(job_spec(tpu={"spot": True}))) == 90
    with pytest.raises(api.SpecError) as e:
        job_spec(tpu={"spotGraceSeconds": 300})
    assert e.value.fields == ["spec.tpu.spotGraceSeconds"]


def test_tpu_containers_run_as_root_only_when_asked_and_never_privileged() -> None:
    # GKE TPUs from 1.28 need no privileged mode; device files a node keeps for root need uid 0, nothing more.
    default = pod_specs()
    for what, pod in default.items():
        assert all(c["securityContext"]["runAsNonRoot"] for c in containers(pod)), what
    root = pod_specs(job_spec(tpu={"runAsRoot": True}), chat_inputs(tpu={"runAsRoot": True}))
    ran_as_root = {
        (what, c["name"])
        for what, pod in root.items()
        for c in containers(pod)
        if c["securityContext"].get("runAsUser") == 0
    }
    assert ran_as_root == {
        ("trainer", "trainer"),
        ("trainer (multi-host)", "trainer"),
        ("evaluation (TPU)", "loss"),
        ("evaluation (TPU)", "score"),
        ("vLLM", "vllm"),
    }
    for what, pod in root.items():
        assert pod["securityContext"]["runAsNonRoot"] is True  # the pod's default: the model fetch, the sidecar
        for c in containers(pod):
            sc = c["securityContext"]
            assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is ((what, c["name"]) not in ran_as_root)


def test_no_pod_carries_xla_flags_a_tpu_ignores() -> None:
    # --xla_llvm_disable_expensive_passes tunes XLA's LLVM (CPU/GPU) backends; the TPU compiler does not read it.
    for what, pod in pod_specs().items():
        for c in containers(pod):
            flags = {e["name"]: e.get("value", "") for e in c.get("env", [])}.get("XLA_FLAGS", "")
            assert "llvm" not in flags, (what, c["name"])


def test_multi_host_trainers_declare_the_ports_their_hosts_talk_on() -> None:
    # GKE multi-host TPU slices: the hosts reach each other on the TPU runtime's port; JAX on its coordinator's.
    ports = {p["name"]: p["containerPort"] for p in pod_specs()["trainer (multi-host)"]["containers"][0]["ports"]}
    assert ports["coordinator"] == COORDINATOR_PORT == 8476
    assert ports["tpu-runtime"] == TPU_RUNTIME_PORT == 8471
    single = {p["name"] for p in pod_specs()["trainer"]["containers"][0]["ports"]}
    assert single == {"metrics"}


def test_the_operators_default_runs_tpu_containers_as_root_where_a_spec_leaves_it_unset() -> None:
    # The Helm value tpu.runAsRoot (operator flag --tpu-run-as-root) for clusters whose TPU device files only
    # root may open; a spec that says false keeps its pods non-root.
    from tpuforge.controllers.runtime.defaults import OperatorDefaults

    root = OperatorDefaults(tpu_run_as_root=True)
    trainer = pod_specs(root.apply(job_spec()))["trainer"]["containers"][0]
    assert trainer["securityContext"]["runAsUser"] == 0
    assert root.apply(job_spec(tpu={"runAsRoot": False})).tpu.run_as_root is False
    assert OperatorDefaults().apply(job_spec()).tpu.run_as_root is True  # what works on GKE's TPU nodes
    assert OperatorDefaults(tpu_run_as_root=False).apply(job_spec()).tpu.run_as_root is False
    assert root.apply(chat_inputs().spec).tpu.run_as_root is True
