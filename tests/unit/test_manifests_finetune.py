"""FineTuneJob manifests: the training Job on the TPU pool, its config, RBAC for progress, the merge Job."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from tpuforge import api
from tpuforge.api.constants import (
    CONFIG_FILE,
    CONFIG_MOUNT_DIR,
    GKE_SPOT,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    LABEL_ATTEMPT,
    LABEL_FINETUNEJOB,
    LABEL_KUEUE_QUEUE,
    TERMINATION_LOG,
    TPU_RESOURCE,
)
from tpuforge.manifests import finetune as m
from tpuforge.manifests.common import LABEL_OWNER_UID

OWNER = m.owner("team-a", "gemma-verilog", "uid-1")


def spec(**overrides: Any) -> api.FineTuneJobSpec:
    raw: dict[str, Any] = {
        "model": {"name": "gemma4-31b", "uri": "gs://b/models/gemma4-31b"},
        "dataset": {"uri": "gs://b/data/train.jsonl"},
        "training": {"maxSeqLen": 3072},
        "checkpoint": {"uri": "gs://b/jobs/gemma-verilog/checkpoints"},
        "output": {"uri": "gs://b/jobs/gemma-verilog/merged"},
        **overrides,
    }
    return api.validate_finetune(raw)


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"])


def test_training_job_targets_the_slices_tpu_pool_with_all_its_chips() -> None:
    job = m.train_job(OWNER, spec(), 0)
    p = pod(job)
    assert p["nodeSelector"] == {GKE_TPU_ACCELERATOR: "tpu-v5p-slice", GKE_TPU_TOPOLOGY: "2x2x1"}
    assert {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in p["tolerations"]
    res = p["containers"][0]["resources"]
    assert res["limits"] == {TPU_RESOURCE: "4"} and res["requests"] == {TPU_RESOURCE: "4"}
    v6e = pod(m.train_job(OWNER, spec(tpu={"slice": "v6e-4"}), 0))
    assert v6e["nodeSelector"] == {GKE_TPU_ACCELERATOR: "tpu-v6e-slice", GKE_TPU_TOPOLOGY: "2x2"}


def test_spot_adds_the_spot_selector_and_toleration() -> None:
    p = pod(m.train_job(OWNER, spec(tpu={"spot": True}), 0))
    assert p["nodeSelector"][GKE_SPOT] == "true"
    assert {"key": GKE_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"} in p["tolerations"]
    assert GKE_SPOT not in pod(m.train_job(OWNER, spec(), 0))["nodeSelector"]


def test_training_pod_runs_the_trainer_with_its_config_mounted_read_only() -> None:
    job = m.train_job(OWNER, spec(), 2)
    p = pod(job)
    c = p["containers"][0]
    assert c["command"] == [
        "python",
        "-m",
        "tpuforge_workloads.train",
        "--config",
        f"{CONFIG_MOUNT_DIR}/{CONFIG_FILE}",
        "--termination-log",
        TERMINATION_LOG,
    ]
    assert {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True} in c["volumeMounts"]
    config_volume = next(v for v in p["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "gemma-verilog-train-2"
    assert c["terminationMessagePath"] == TERMINATION_LOG
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["XLA_FLAGS"] == "--xla_llvm_disable_expensive_passes=true"
    assert env["TMPDIR"] == "/dev/shm"
    shm = next(v for v in p["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory"}
    assert c["image"] == api.constants.DEFAULT_TRAINER_IMAGE


def test_training_job_leaves_retries_to_the_operator_and_gives_time_to_checkpoint() -> None:
    job = m.train_job(OWNER, spec(), 0)
    assert job["spec"]["backoffLimit"] == 0
    p = pod(job)
    assert p["restartPolicy"] == "Never"
    assert p["terminationGracePeriodSeconds"] >= 120


def test_labels_owner_and_optional_queue_and_priority() -> None:
    plain = m.train_job(OWNER, spec(), 3)
    assert plain["metadata"]["name"] == "gemma-verilog-train-3"
    assert plain["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    labels = plain["metadata"]["labels"]
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"):
        assert key in labels
    assert labels[LABEL_FINETUNEJOB] == "gemma-verilog"
    assert labels[LABEL_ATTEMPT] == "3"
    assert LABEL_KUEUE_QUEUE not in labels
    assert "priorityClassName" not in pod(plain)
    # The pods carry the labels the operator watches them by.
    tpl = plain["spec"]["template"]["metadata"]["labels"]
    assert tpl[LABEL_OWNER_UID] == "uid-1" and tpl[LABEL_ATTEMPT] == "3"
    queued = m.train_job(OWNER, spec(queueName="tpu-queue", priorityClassName="training-high"), 0)
    assert queued["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue"
    assert pod(queued)["priorityClassName"] == "training-high"


def test_config_map_holds_the_train_config_for_the_attempt_and_the_starting_spec() -> None:
    s = spec(lora={"rank": 16})
    cm = m.train_config_map(OWNER, s, 4)
    cfg = api.TrainConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg.attempt == 4
    assert cfg.job == api.JobRef(namespace="team-a", name="gemma-verilog")
    assert cfg.lora.rank == 16
    assert cfg.mesh == api.MeshSpec(fsdp=1, tp=4)
    assert api.FineTuneJobSpec.model_validate(json.loads(cm["data"][m.SPEC_KEY])) == s


def test_operator_creates_a_service_account_unless_the_spec_names_one() -> None:
    own = m.rbac_objects(OWNER, spec())
    assert [o["kind"] for o in own] == ["ServiceAccount", "Role", "RoleBinding"]
    assert own[2]["subjects"][0]["name"] == own[0]["metadata"]["name"] == "gemma-verilog-trainer"
    assert own[1]["rules"][0]["resourceNames"] == ["gemma-verilog"]
    assert own[1]["rules"][0]["resources"] == ["finetunejobs/status"]
    given = m.rbac_objects(OWNER, spec(serviceAccountName="gcs-reader"))
    assert [o["kind"] for o in given] == ["Role", "RoleBinding"]
    assert given[1]["subjects"][0]["name"] == "gcs-reader"
    assert pod(m.train_job(OWNER, spec(serviceAccountName="gcs-reader"), 0))["serviceAccountName"] == "gcs-reader"


def test_attempt_objects_end_with_the_job_so_its_pod_never_waits() -> None:
    kinds = [o["kind"] for o in m.attempt_objects(OWNER, spec(), 0)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"]


def test_merge_job_runs_on_the_cpu_pool_sized_for_a_streamed_merge() -> None:
    s = spec(merge={"nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-highmem"}})
    cm, job = m.merge_objects(OWNER, s)
    cfg = api.MergeConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg.output_uri == "gs://b/jobs/gemma-verilog/merged"
    p = pod(job)
    assert p["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-highmem"}
    assert "tolerations" not in p
    c = p["containers"][0]
    assert c["command"][:3] == ["python", "-m", "tpuforge_workloads.merge"]
    assert TPU_RESOURCE not in c["resources"]["requests"]
    # 31B: the float32 embedding table (5.25 GiB) twice, a 4 GiB shard, 1 GiB of runtime: 15.5 GiB.
    assert c["resources"]["requests"]["memory"] == "16Gi"
    assert job["metadata"]["name"] == "gemma-verilog-merge"


def test_merge_memory_follows_the_spec_when_set() -> None:
    assert m.merge_memory(spec(merge={"memory": "96Gi"})) == "96Gi"
    tiny = spec(model={"name": "gemma4-tiny", "uri": "gs://b/tiny"}, tpu={"slice": "v5p-8"})
    assert m.merge_memory(tiny) == "6Gi"


def test_builders_are_pure() -> None:
    s = spec(tpu={"spot": True}, queueName="q")
    assert m.attempt_objects(OWNER, s, 1) == m.attempt_objects(OWNER, s, 1)
    assert m.merge_objects(OWNER, s) == m.merge_objects(OWNER, s)


@pytest.mark.parametrize("slice_", ["v5p-8", "v6e-4"])
def test_objects_validate_against_the_gke_kubernetes_schema(slice_: str) -> None:
    s = spec(tpu={"slice": slice_, "spot": True}, queueName="q", priorityClassName="p")
    for obj in [*m.attempt_objects(OWNER, s, 0), *m.merge_objects(OWNER, s)]:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
