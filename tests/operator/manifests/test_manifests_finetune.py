"""FineTuneJob manifests: the training Job on the TPU pool, its config, RBAC for progress, the merge Job."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.fixtures import upstream
from tests.fixtures.finetune.specs import OWNER, pod, spec
from tpuforge import api
from tpuforge.api.constants import (
    CONFIG_FILE,
    CONFIG_MOUNT_DIR,
    GKE_SPOT,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    INSTANCE_TYPE,
    JOBSET_API_VERSION,
    JOBSET_EXCLUSIVE_TOPOLOGY,
    JOBSET_KIND,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_FINETUNEJOB,
    LABEL_KUEUE_QUEUE,
    TERMINATION_LOG,
    TPU_RESOURCE,
)
from tpuforge.api.validation import SpecError
from tpuforge.manifests.common import LABEL_OWNER_UID
from tpuforge.manifests.finetune_common import eval_job_name, owner, service_account_name, train_job_name
from tpuforge.manifests.finetune_evaluation import EVAL_BACKOFF_LIMIT, eval_job, eval_objects
from tpuforge.manifests.finetune_merge import MERGE_BACKOFF_LIMIT, merge_objects
from tpuforge.manifests.finetune_rbac import rbac_objects
from tpuforge.manifests.finetune_training import (
    SPEC_KEY,
    attempt_objects,
    train_config_map,
    train_job,
    train_pod_template,
    train_workload,
)
from tpuforge.manifests.preflight import preflight_objects


def test_training_job_targets_the_slices_tpu_pool_with_all_its_chips() -> None:
    """GKE (TPUs in GKE): a single-host slice is selected by accelerator, topology and machine type
    (node.kubernetes.io/instance-type), since one topology can come as several machine types."""
    job = train_job(OWNER, spec(), 0)
    p = pod(job)
    assert p["nodeSelector"] == {
        GKE_TPU_ACCELERATOR: "tpu-v5p-slice",
        GKE_TPU_TOPOLOGY: "2x2x1",
        INSTANCE_TYPE: "ct5p-hightpu-4t",
    }
    assert {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in p["tolerations"]
    res = p["containers"][0]["resources"]
    assert res["limits"] == {TPU_RESOURCE: "4"} and res["requests"][TPU_RESOURCE] == "4"
    v6e = pod(train_job(OWNER, spec(tpu={"slice": "v6e-4"}), 0))
    assert v6e["nodeSelector"] == {
        GKE_TPU_ACCELERATOR: "tpu-v6e-slice",
        GKE_TPU_TOPOLOGY: "2x2",
        INSTANCE_TYPE: "ct6e-standard-4t",
    }


def test_spot_adds_the_spot_selector_and_toleration() -> None:
    p = pod(train_job(OWNER, spec(tpu={"spot": True}), 0))
    assert p["nodeSelector"][GKE_SPOT] == "true"
    assert {"key": GKE_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"} in p["tolerations"]
    assert GKE_SPOT not in pod(train_job(OWNER, spec(), 0))["nodeSelector"]


def test_training_pod_runs_the_trainer_with_its_config_mounted_read_only() -> None:
    job = train_job(OWNER, spec(), 2)
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
    assert "XLA_FLAGS" not in env
    assert env["TMPDIR"] == "/dev/shm"
    shm = next(v for v in p["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert c["image"] == api.constants.DEFAULT_TRAINER_IMAGE


def test_training_job_leaves_retries_to_the_operator_and_gives_time_to_checkpoint() -> None:
    job = train_job(OWNER, spec(), 0)
    assert job["spec"]["backoffLimit"] == 0
    p = pod(job)
    assert p["restartPolicy"] == "Never"
    assert p["terminationGracePeriodSeconds"] >= 120


def test_labels_owner_and_optional_queue_and_priority() -> None:
    plain = train_job(OWNER, spec(), 3)
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
    queued = train_job(OWNER, spec(queueName="tpu-queue", priorityClassName="training-high"), 0)
    assert queued["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue"
    assert pod(queued)["priorityClassName"] == "training-high"


def every_job_and_jobset(s: api.FineTuneJobSpec) -> list[dict[str, Any]]:
    """Each Job or JobSet a FineTuneJob with spec `s` can create: preflight, training attempt, merge and
    evaluation."""
    objs = [*preflight_objects(OWNER, s), *attempt_objects(OWNER, s, 0), *merge_objects(OWNER, s)]
    if s.evaluation is not None:
        objs += eval_objects(OWNER, s)
    return [o for o in objs if o["kind"] in ("Job", JOBSET_KIND)]


def pod_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]]
    return [rj["template"]["spec"]["template"] for rj in workload["spec"]["replicatedJobs"]]


@pytest.mark.parametrize(("slice_id", "evaluation_slice"), [("v5p-8", "v6e-8"), ("v5p-16", "cpu"), ("v6e-16", "v6e-8")])
def test_every_job_and_jobset_carries_the_queue_label_on_itself(slice_id: str, evaluation_slice: str) -> None:
    """Kueue's Job and JobSet integrations read kueue.x-k8s.io/queue-name on the Job or JobSet, so every one a
    FineTuneJob runs (the merge, evaluation and preflight too: they take CPU or TPU quota) carries it there.
    None sets spec.suspend: Kueue's webhook sets it, and admission clears it."""
    evaluation = {"slice": evaluation_slice, "datasetUri": "gs://b/data/eval.jsonl"}
    exported = {"writeAdapter": True}
    queued = spec(tpu={"slice": slice_id}, queueName="tpu-queue", evaluation=evaluation, merge=exported)
    found = every_job_and_jobset(queued)
    components = sorted(o["metadata"]["labels"][LABEL_COMPONENT] for o in found)
    assert components == ["evaluator", "merger", "preflight", "trainer"]
    assert [o["kind"] for o in found if o["metadata"]["labels"][LABEL_COMPONENT] == "trainer"] == [
        "Job" if slice_id == "v5p-8" else JOBSET_KIND
    ]
    for obj in found:
        assert obj["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue", obj["metadata"]["name"]
        assert "suspend" not in obj["spec"]
        assert all(LABEL_KUEUE_QUEUE not in t["metadata"]["labels"] for t in pod_templates(obj))
    plain = every_job_and_jobset(spec(tpu={"slice": slice_id}, evaluation=evaluation, merge=exported))
    assert len(plain) == 4 and all(LABEL_KUEUE_QUEUE not in o["metadata"]["labels"] for o in plain)


def test_config_map_holds_the_train_config_for_the_attempt_and_the_starting_spec() -> None:
    s = spec(lora={"rank": 16})
    cm = train_config_map(OWNER, s, 4)
    cfg = api.TrainConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg.attempt == 4
    assert cfg.job == api.JobRef(namespace="team-a", name="gemma-verilog")
    assert cfg.lora.rank == 16
    assert cfg.mesh == api.MeshSpec(fsdp=1, tp=4)
    assert api.FineTuneJobSpec.model_validate(json.loads(cm["data"][SPEC_KEY])) == s


def test_the_trainer_s_remat_is_the_preflight_s_choice_unless_the_spec_sets_it() -> None:
    def trainer_remat(s: api.FineTuneJobSpec, preflight: api.PreflightStatus | None) -> object:
        return json.loads(train_config_map(OWNER, s, 0, preflight)["data"][CONFIG_FILE])["training"]["remat"]

    chose_off = api.PreflightStatus(fits=True, remat=False)
    assert trainer_remat(spec(), chose_off) is False
    assert trainer_remat(spec(), None) is True  # no preflight ran: on
    assert trainer_remat(spec(training={"maxSeqLen": 3072, "remat": True}), chose_off) is True
    # The spec the run started with keeps remat unset, so later attempts take the preflight's choice again.
    cm = train_config_map(OWNER, spec(), 0, chose_off)
    assert "remat" not in json.loads(cm["data"][SPEC_KEY])["training"]
    assert attempt_objects(OWNER, spec(), 0, chose_off)[2] == cm


def test_the_pods_run_as_the_named_service_account_which_the_operator_binds_but_never_creates() -> None:
    own = rbac_objects(OWNER, spec())
    assert [o["kind"] for o in own] == ["Role", "RoleBinding"]
    assert own[1]["subjects"][0]["name"] == "tpuforge-gcs"
    assert own[0]["rules"][0]["resourceNames"] == ["gemma-verilog"]
    assert own[0]["rules"][0]["resources"] == ["finetunejobs/status"]
    assert pod(train_job(OWNER, spec(serviceAccountName="gcs-reader"), 0))["serviceAccountName"] == "gcs-reader"


def test_a_job_started_before_the_service_account_was_required_keeps_the_one_made_for_it() -> None:
    legacy = spec().model_copy(update={"service_account_name": None})
    own = rbac_objects(OWNER, legacy)
    assert [o["kind"] for o in own] == ["ServiceAccount", "Role", "RoleBinding"]
    assert own[2]["subjects"][0]["name"] == own[0]["metadata"]["name"] == "gemma-verilog-trainer"


def test_attempt_objects_end_with_the_job_so_its_pod_never_waits() -> None:
    kinds = [o["kind"] for o in attempt_objects(OWNER, spec(), 0)]
    assert kinds == ["Role", "RoleBinding", "ConfigMap", "Job"]


def test_merge_job_runs_on_the_cpu_pool_sized_for_a_streamed_merge() -> None:
    s = spec(merge={"nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-highmem"}})
    cm, job = merge_objects(OWNER, s)
    cfg = api.MergeConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg.output_uri == "gs://b/jobs/gemma-verilog/merged"
    p = pod(job)
    assert p["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-highmem"}
    assert "tolerations" not in p
    c = p["containers"][0]
    assert c["command"][:3] == ["python", "-m", "tpuforge_workloads.merge"]
    assert TPU_RESOURCE not in c["resources"]["requests"]
    # The streamed merge's measured peak (1.32 GB through the GCS client) does not grow with the model.
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    assert job["metadata"]["name"] == "gemma-verilog-merge"


def test_merge_resources_follow_the_spec_when_set() -> None:
    c = pod(merge_objects(OWNER, spec(merge={"resources": {"memory": "96Gi", "cpu": "4"}}))[1])["containers"][0]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "96Gi"}, "limits": {"memory": "192Gi"}}
    # --verify loads the whole model twice in float32.
    verify = pod(merge_objects(OWNER, spec(merge={"verify": True}))[1])["containers"][0]
    assert verify["resources"]["requests"]["memory"] == "235Gi"


def test_builders_are_pure() -> None:
    s = spec(tpu={"spot": True}, queueName="q")
    assert attempt_objects(OWNER, s, 1) == attempt_objects(OWNER, s, 1)
    assert merge_objects(OWNER, s) == merge_objects(OWNER, s)


@pytest.mark.parametrize("slice_", ["v5p-8", "v6e-4"])
def test_objects_validate_against_the_gke_kubernetes_schema(slice_: str) -> None:
    s = spec(tpu={"slice": slice_, "spot": True}, queueName="q", priorityClassName="p")
    for obj in [*attempt_objects(OWNER, s, 0), *merge_objects(OWNER, s)]:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


# --- multi-host slices: a JobSet per attempt ----------------------------------------------------------------


def trainer_job(jobset: dict[str, Any]) -> dict[str, Any]:
    (rj,) = jobset["spec"]["replicatedJobs"]
    return dict(rj["template"]["spec"])


def test_single_host_slices_keep_a_plain_job() -> None:
    for slice_id in ("v5p-8", "v6e-4", "v6e-8"):
        assert train_workload(OWNER, spec(tpu={"slice": slice_id}), 0) == train_job(
            OWNER, spec(tpu={"slice": slice_id}), 0
        )


@pytest.mark.parametrize("slice_id", ["v5p-16", "v5p-32", "v5p-64", "v5p-128", "v6e-16", "v6e-32"])
def test_multi_host_attempt_is_a_jobset_of_one_pod_per_host(slice_id: str) -> None:
    s = spec(tpu={"slice": slice_id, "spot": True}, queueName="tpu-queue", priorityClassName="training-high")
    hosts = api.tpu_slice(slice_id).hosts
    js = train_workload(OWNER, s, 3)
    assert (js["apiVersion"], js["kind"]) == (JOBSET_API_VERSION, JOBSET_KIND)
    assert js["metadata"]["name"] == "gemma-verilog-train-3"
    assert js["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert js["metadata"]["annotations"] == {JOBSET_EXCLUSIVE_TOPOLOGY: "cloud.google.com/gke-nodepool"}
    assert js["metadata"]["labels"][LABEL_KUEUE_QUEUE] == "tpu-queue"
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert js["spec"]["network"] == {"enableDNSHostnames": True}
    (rj,) = js["spec"]["replicatedJobs"]
    assert (rj["name"], rj["replicas"]) == ("trainer", 1)
    job = trainer_job(js)
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (
        hosts,
        hosts,
        "Indexed",
        0,
    )
    # The child Jobs carry none of the operator's labels: only the pods (and the JobSet) are watched.
    assert "metadata" not in rj["template"]
    # Each pod is one host's: the same template as a single-host Job's pod, with the slice's selector.
    p = job["template"]["spec"]
    assert p["nodeSelector"] == {
        GKE_TPU_ACCELERATOR: api.tpu_slice(slice_id).accelerator,
        GKE_TPU_TOPOLOGY: api.tpu_slice(slice_id).topology,
        GKE_SPOT: "true",
    }
    assert p["containers"][0]["resources"]["limits"] == {TPU_RESOURCE: "4"}
    assert p["priorityClassName"] == "training-high"
    assert job["template"]["metadata"]["labels"][LABEL_OWNER_UID] == "uid-1"
    assert job["template"]["metadata"]["labels"][LABEL_ATTEMPT] == "3"
    assert job["template"] == train_pod_template(OWNER, s, 3)


def test_each_host_learns_its_process_id_count_and_coordinator() -> None:
    js = train_workload(OWNER, spec(tpu={"slice": "v5p-32"}), 1)
    env = {e["name"]: e for e in trainer_job(js)["template"]["spec"]["containers"][0]["env"]}
    assert env["TPUFORGE_NUM_PROCESSES"]["value"] == "4"
    assert env["TPUFORGE_PROCESS_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    # Process 0's pod, by the hostname.subdomain JobSet gives it, on JAX's coordinator port.
    assert env["TPUFORGE_COORDINATOR_ADDRESS"]["value"] == (
        "gemma-verilog-train-1-trainer-0-0.gemma-verilog-train-1:8476"
    )
    assert env["TPUFORGE_JOIN_TIMEOUT_SECONDS"]["value"] == "1800"  # the default, for uneven image pulls
    slow = train_workload(OWNER, spec(tpu={"slice": "v5p-32", "joinTimeoutSeconds": 3600}), 1)
    slow_env = {e["name"]: e for e in trainer_job(slow)["template"]["spec"]["containers"][0]["env"]}
    assert slow_env["TPUFORGE_JOIN_TIMEOUT_SECONDS"]["value"] == "3600"
    single = pod(train_job(OWNER, spec(), 1))["containers"][0]["env"]
    multi_only = {
        "TPUFORGE_NUM_PROCESSES",
        "TPUFORGE_PROCESS_ID",
        "TPUFORGE_COORDINATOR_ADDRESS",
        "TPUFORGE_JOIN_TIMEOUT_SECONDS",
    }
    assert not {e["name"] for e in single} & multi_only


def test_a_long_name_leaves_room_for_every_hosts_hostname() -> None:
    long_owner = owner("team-a", "x" * 60, "uid-1")
    js = train_workload(long_owner, spec(tpu={"slice": "v5p-128"}), 12)
    name = js["metadata"]["name"]
    assert name.endswith("-train-12") and len(f"{name}-trainer-0-15") <= 63
    assert name == train_job_name(long_owner.name, 12, hosts=16)
    # Its config map has the same name, and the pods mount it.
    cm = train_config_map(long_owner, spec(tpu={"slice": "v5p-128"}), 12)
    assert cm["metadata"]["name"] == name
    volume = next(v for v in trainer_job(js)["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == name
    # A single-host Job keeps the name it always had.
    assert len(train_job_name(long_owner.name, 12)) == 63


@pytest.mark.parametrize("slice_id", ["v5p-16", "v6e-32"])
def test_jobsets_validate_against_the_published_jobset_schema(slice_id: str) -> None:
    s = spec(tpu={"slice": slice_id, "spot": True}, queueName="q", priorityClassName="p")
    js = train_workload(OWNER, s, 0)
    upstream.jobset_validator().validate(js)
    # The upstream schema leaves the Job template open: Kubernetes' own Job schema checks it (Indexed mode).
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": trainer_job(js)}
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    kinds = [o["kind"] for o in attempt_objects(OWNER, s, 0)]
    assert kinds == ["Role", "RoleBinding", "ConfigMap", "JobSet"]
    for obj in attempt_objects(OWNER, s, 0)[:-1]:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_the_schema_check_catches_what_the_apiserver_would_drop_or_refuse() -> None:
    js = train_workload(OWNER, spec(tpu={"slice": "v5p-16"}), 0)
    misspelt = json.loads(json.dumps(js))
    misspelt["spec"]["network"]["enableDnsHostnames"] = True
    with pytest.raises(jsonschema.ValidationError, match="enableDnsHostnames"):
        upstream.jobset_validator().validate(misspelt)
    wrong_type = json.loads(json.dumps(js))
    wrong_type["spec"]["failurePolicy"]["maxRestarts"] = "0"
    with pytest.raises(jsonschema.ValidationError):
        upstream.jobset_validator().validate(wrong_type)


# --- the evaluation: base + adapter scored on held-out records ----------------------------------------------


def eval_spec(**evaluation: Any) -> api.FineTuneJobSpec:
    return spec(
        dataset={"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
        merge={"enabled": False, "writeAdapter": True},
        evaluation=evaluation,
        images={"evaluator": "registry/evaluator:1", "trainer": "registry/trainer:1"},
    )


def test_eval_objects_are_a_config_map_and_a_job_named_for_the_job() -> None:
    cm, job = eval_objects(OWNER, eval_spec())
    assert (cm["kind"], job["kind"]) == ("ConfigMap", "Job")
    assert cm["metadata"]["name"] == job["metadata"]["name"] == eval_job_name("gemma-verilog") == "gemma-verilog-eval"
    cfg = api.EvalConfig.model_validate_json(cm["data"][CONFIG_FILE])
    assert cfg == api.eval_config("team-a", "gemma-verilog", eval_spec())
    for obj in (cm, job):
        # Owned by the FineTuneJob: deleting it deletes them (and the Job's pods) by garbage collection.
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "FineTuneJob",
            "gemma-verilog",
            "uid-1",
            True,
        )
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "evaluator" and labels[LABEL_OWNER_UID] == "uid-1"
        assert labels["app.kubernetes.io/name"] == "tpuforge-evaluator"


def test_the_loss_runs_first_with_the_trainers_image_then_the_scorer_reads_it() -> None:
    p = pod(eval_job(OWNER, eval_spec()))
    (loss,) = p["initContainers"]
    (score,) = p["containers"]
    config = f"{CONFIG_MOUNT_DIR}/{CONFIG_FILE}"
    assert (loss["name"], loss["image"]) == ("loss", "registry/trainer:1")
    assert loss["command"] == [
        "python", "-m", "tpuforge_workloads.evaluate.loss", "--config", config,
        "--out", "/work/loss.json", "--termination-log", TERMINATION_LOG,
    ]  # fmt: skip
    assert (score["name"], score["image"]) == ("score", "registry/evaluator:1")
    assert score["command"] == [
        "python", "-m", "tpuforge_workloads.evaluate.score", "--config", config,
        "--loss", "/work/loss.json", "--termination-log", TERMINATION_LOG,
    ]  # fmt: skip
    for c in (loss, score):
        mounts = {v["name"]: v for v in c["volumeMounts"]}
        assert mounts["work"]["mountPath"] == "/work"
        assert mounts["config"] == {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True}
        assert c["terminationMessagePath"] == TERMINATION_LOG
    volumes = {v["name"]: v for v in p["volumes"]}
    assert volumes["work"] == {"name": "work", "emptyDir": {}}
    assert volumes["config"]["configMap"]["name"] == "gemma-verilog-eval"


def test_without_the_loss_metric_there_is_no_loss_container() -> None:
    p = pod(eval_job(OWNER, eval_spec(metrics=["exactMatch"])))
    assert "initContainers" not in p
    assert "--loss" not in p["containers"][0]["command"]


def test_pass_at_k_samples_then_checks_in_the_checkers_image_with_its_limits_then_scores() -> None:
    checker = {"image": "registry/checker-verilog:1", "command": ["sh", "-c", "iverilog sample.txt tb.v"],
               "timeoutSeconds": 7.5, "cpu": "2", "memory": "1Gi"}  # fmt: skip
    p = pod(eval_job(OWNER, eval_spec(metrics=["loss", "passAtK"], code={"checker": checker})))
    loss, sample, check = p["initContainers"]
    (score,) = p["containers"]
    assert [c["name"] for c in (loss, sample, check, score)] == ["loss", "sample", "check", "score"]
    assert (sample["image"], check["image"]) == ("registry/evaluator:1", "registry/checker-verilog:1")
    assert sample["command"][2] == "tpuforge_workloads.evaluate.sample"
    assert sample["command"][-4:-2] == ["--out", "/work/samples.jsonl"]
    assert check["command"] == [
        "python3", "-m", "tpuforge_workloads.evaluate.check", "--samples", "/work/samples.jsonl",
        "--out", "/check/out/verdicts.jsonl", "--timeout", "7.5", "--memory", str((2**30 - (96 << 20)) // 2),
        "--parallel", "2", "--scratch", "/check/scratch", "--", "sh", "-c", "iverilog sample.txt tb.v",
    ]  # fmt: skip
    assert check["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    # Root with CAP_SETUID and CAP_SETGID only: each sample runs under a uid of its own.
    assert check["securityContext"] == {
        "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, "privileged": False,
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID"]},
    }  # fmt: skip
    assert p["automountServiceAccountToken"] is False
    # The evaluation's files are read-only to the checker; its scratch and verdicts are a volume of their own.
    mounts = {m["name"]: m for m in check["volumeMounts"]}
    assert mounts["work"] == {"name": "work", "mountPath": "/work", "readOnly": True} and "config" not in mounts
    assert mounts["check"] == {"name": "check", "mountPath": "/check"}
    assert {"name": "check", "emptyDir": {"sizeLimit": "2Gi"}} in p["volumes"]
    assert {"name": "check", "mountPath": "/check", "readOnly": True} in score["volumeMounts"]
    assert score["command"][-4:] == ["--samples", "/work/samples.jsonl", "--verdicts", "/check/out/verdicts.jsonl"]
    # Every other container stays non-root.
    assert all(c["securityContext"]["runAsNonRoot"] for c in (loss, sample, score))


def test_a_checker_whose_memory_leaves_too_little_per_sample_is_refused() -> None:
    checker = {"image": "c", "command": ["true"], "cpu": "4", "memory": "256Mi"}
    with pytest.raises(SpecError, match=r"256Mi leaves 40Mi per sample with cpu 4 .*raise memory or lower cpu"):
        eval_spec(metrics=["passAtK"], code={"checker": checker})


def test_exact_match_beside_pass_at_k_takes_its_greedy_answers_from_the_samplers_engine() -> None:
    checker = {"image": "c", "command": ["true"]}
    p = pod(eval_job(OWNER, eval_spec(metrics=["exactMatch", "passAtK"], code={"checker": checker})))
    sample, _ = p["initContainers"]
    (score,) = p["containers"]
    assert sample["command"][-4:-2] == ["--answers", "/work/answers.json"]
    assert score["command"][-2:] == ["--answers", "/work/answers.json"]  # no second vLLM load


def test_on_a_tpu_slice_the_pod_owns_one_host_of_it() -> None:
    p = pod(eval_job(OWNER, eval_spec(slice="v6e-8", nodeSelector={"pool": "eval"})))
    assert p["nodeSelector"] == {
        GKE_TPU_ACCELERATOR: "tpu-v6e-slice",
        GKE_TPU_TOPOLOGY: "2x4",
        INSTANCE_TYPE: "ct6e-standard-8t",
        "pool": "eval",
    }
    assert {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in p["tolerations"]
    for c in [*p["initContainers"], *p["containers"]]:
        # The 31B's weights pass through host memory (62.5 GB) beside the 32 GiB runtime.
        assert c["resources"] == {
            "requests": {"cpu": "8", "memory": "91Gi", TPU_RESOURCE: "8"},
            "limits": {TPU_RESOURCE: "8"},
        }


def test_on_cpu_the_pod_asks_for_no_tpu() -> None:
    p = pod(eval_job(OWNER, eval_spec(slice="cpu", nodeSelector={"pool": "cpu"})))
    assert p["nodeSelector"] == {"pool": "cpu"} and "tolerations" not in p
    for c in [*p["initContainers"], *p["containers"]]:
        assert c["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}}
    assert "nodeSelector" not in pod(eval_job(OWNER, eval_spec(slice="cpu")))


def test_the_eval_pod_runs_locked_down_without_an_api_token_as_the_jobs_service_account() -> None:
    s = eval_spec()
    p = pod(eval_job(OWNER, s))
    assert p["automountServiceAccountToken"] is False  # the result travels in the termination message
    assert p["serviceAccountName"] == service_account_name("gemma-verilog", s) == "tpuforge-gcs"
    assert p["securityContext"]["runAsNonRoot"] is True and p["restartPolicy"] == "Never"
    named = pod(eval_job(OWNER, spec(**{**eval_spec().to_wire(), "serviceAccountName": "wi-sa"})))
    assert named["serviceAccountName"] == "wi-sa"


def test_the_eval_job_retries_crashes_like_the_merge_but_not_a_rejected_config() -> None:
    job = eval_job(OWNER, eval_spec())
    assert job["spec"]["backoffLimit"] == MERGE_BACKOFF_LIMIT == EVAL_BACKOFF_LIMIT
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}} in rules
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules


def test_eval_builders_are_pure_and_need_an_evaluation() -> None:
    assert eval_objects(OWNER, eval_spec()) == eval_objects(OWNER, eval_spec())
    with pytest.raises(ValueError, match=r"spec\.evaluation is unset"):
        eval_job(OWNER, spec())


@pytest.mark.parametrize("evaluation", [{"slice": "v6e-8"}, {"slice": "cpu", "metrics": ["exactMatch"]}])
def test_eval_objects_validate_against_the_kubernetes_schema(evaluation: dict[str, Any]) -> None:
    for obj in eval_objects(OWNER, eval_spec(**evaluation)):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_the_eval_copies_the_model_to_a_sized_disk_of_its_own_not_the_boot_disk() -> None:
    job = eval_job(OWNER, eval_spec())
    p = pod(job)
    models = next(v for v in p["volumes"] if v["name"] == "models")
    claim = models["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "73Gi"  # gemma4-31b's 58.2 GiB plus 25%
    assert claim["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in claim
    fetchers = [c for c in [*p.get("initContainers", []), *p["containers"]] if c["name"] != "check"]
    for c in fetchers:  # each fetches into the sized volume
        assert {"name": "models", "mountPath": "/models"} in c["volumeMounts"]
        assert {"name": "TPUFORGE_EVAL_WORK_DIR", "value": "/models"} in c["env"]
    sized = eval_job(OWNER, eval_spec(modelStorage={"size": "100Gi", "storageClassName": "hyperdisk-balanced"}))
    claim = next(v for v in pod(sized)["volumes"] if v["name"] == "models")["ephemeral"]["volumeClaimTemplate"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert claim["spec"]["storageClassName"] == "hyperdisk-balanced"
    on_cpu = next(v for v in pod(eval_job(OWNER, eval_spec(slice="cpu")))["volumes"] if v["name"] == "models")
    assert on_cpu == {"name": "models", "emptyDir": {"sizeLimit": "73Gi"}}


def test_the_eval_job_has_a_deadline_for_all_its_tries() -> None:
    assert eval_job(OWNER, eval_spec())["spec"]["activeDeadlineSeconds"] == 4 * 3600
    assert eval_job(OWNER, eval_spec(activeDeadlineSeconds=7200))["spec"]["activeDeadlineSeconds"] == 7200


def test_the_passk_checker_does_not_see_the_model_copies() -> None:
    checker = {"image": "checker:1", "command": ["run"]}
    inits = {
        c["name"]: c
        for c in pod(eval_job(OWNER, eval_spec(metrics=["passAtK"], code={"checker": checker})))["initContainers"]
    }
    assert all(m["name"] != "models" for m in inits["check"]["volumeMounts"])
    assert {"name": "models", "mountPath": "/models"} in inits["sample"]["volumeMounts"]
