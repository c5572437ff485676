"""FineTuneJob -> its evaluation: a ConfigMap (the EvalConfig) and a Job of one pod that scores base + adapter
on the held-out records, on the serving slice kind or a CPU node. Its init containers compute the held-out loss
and, with passAtK, draw samples and check them in the checker's image; the `score` container writes the result.

Pure: the same inputs give the same objects.
"""

from __future__ import annotations

import math

from tpuforge.api import resources
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.code_eval import PASS_AT_K, CheckerSpec
from tpuforge.api.configs import eval_config
from tpuforge.api.constants import CONFIG_FILE, CPU_SLICE, EVAL_WORK_DIR_ENV, EXIT_BAD_CONFIG, TERMINATION_LOG
from tpuforge.api.finetune import PREFERENCE_ACCURACY, FineTuneJobSpec
from tpuforge.api.images import PUBLIC_IMAGES
from tpuforge.manifests.common import (
    Obj,
    Owner,
    config_map,
    locked_down,
    pod_annotations,
    switches_uid,
    tpu_resources,
    tpu_scheduling,
    with_scheduling,
)
from tpuforge.manifests.finetune_common import (
    COMPONENT_EVALUATOR,
    config_mount,
    config_volume,
    eval_job_name,
    labels,
    one_pod_job,
    reporting_command,
    root_containers,
    service_account_name,
)
from tpuforge.manifests.finetune_merge import MERGE_BACKOFF_LIMIT

# The evaluation pod: an init container computes the held-out loss with the trainer's own code (JAX), then
# the main container serves base + adapter with vLLM, scores greedy answers and writes the result (the
# operator reads it from this container's termination message).
EVAL_LOSS_CONTAINER = "loss"
EVAL_SCORE_CONTAINER = "score"
# With passAtK, two more init containers: `sample` (evaluator image) draws the samples, `check` (the checker's
# image, with its CPU and memory as limits) runs each one against its test; `score` turns verdicts into pass@k.
EVAL_SAMPLE_CONTAINER = "sample"
EVAL_CHECK_CONTAINER = "check"

# The evaluation only reads its inputs and commits its report with a marker written last, so a transient
# failure (a GCS hiccup, a node lost) is retried by the Job controller as the merge's is.
EVAL_BACKOFF_LIMIT = MERGE_BACKOFF_LIMIT
WORK_VOLUME = "work"
WORK_DIR = "/work"  # shared by the two containers: the loss's result reaches the scorer through it
LOSS_FILE = f"{WORK_DIR}/loss.json"
SAMPLES_FILE = f"{WORK_DIR}/samples.jsonl"
# The checker's own volume: the samples' scratch directories and the verdicts. /work is read-only to it, so
# that no sample reaches the samples file, the loss or the answers that `score` reads after it.
CHECK_VOLUME = "check"
CHECK_DIR = "/check"
CHECK_VOLUME_SIZE = "2Gi"
VERDICTS_FILE = f"{CHECK_DIR}/out/verdicts.jsonl"
ANSWERS_FILE = f"{WORK_DIR}/answers.json"  # exactMatch's greedy answers, when `sample` draws them too
# The copies of the base model and the adapter that loss, sample and score fetch (each into the directory
# EVAL_WORK_DIR_ENV names, where evaluate.config puts its scratch; not TMPDIR, which vLLM also uses for its IPC
# sockets, whose paths must stay short): a volume of its own, sized for the model, never the node's boot disk. On a
# TPU slice, a generic ephemeral volume (a disk made with the pod, deleted with it); on cpu, a sized emptyDir.
MODEL_VOLUME = "models"
MODEL_DIR = "/models"
MODEL_DIR_ENV = {"name": EVAL_WORK_DIR_ENV, "value": MODEL_DIR}
# Room beside the base model's bytes for the adapter and the fetch's partial files.
MODEL_HEADROOM = 1.25


def _run(spec: FineTuneJobSpec) -> int:
    return spec.evaluation.rerun if spec.evaluation is not None else 0


def eval_config_map(o: Owner, spec: FineTuneJobSpec) -> Obj:
    cfg = eval_config(o.namespace, o.name, spec)
    name = eval_job_name(o.name, _run(spec))
    return config_map(o, name, labels(o, COMPONENT_EVALUATOR), {CONFIG_FILE: cfg.model_dump_json(by_alias=True)})


def eval_job(o: Owner, spec: FineTuneJobSpec) -> Obj:
    """The evaluation Job: base + adapter scored on the held-out records, on the serving slice kind (or a CPU
    node). Its pod needs no Kubernetes API token: the result travels in the `score` container's termination
    message, which the operator reads from the pod's status."""
    ev = spec.evaluation
    if ev is None:
        raise ValueError("spec.evaluation is unset: there is nothing to evaluate")
    name = eval_job_name(o.name, ev.rerun)
    on_cpu = ev.slice == CPU_SLICE
    # On a CPU node the pod shares the node (requests only: they place it, they do not cap it); on a TPU slice
    # it requests every chip of the host and what vLLM and the JAX loss hold of the model.
    pod_resources: Obj = (
        {"requests": resources.eval_cpu_requests(ev.resources)}
        if on_cpu
        else tpu_resources(
            tpu_slice(ev.slice), resources.tpu_server_requests(ev.resources, model_shape(spec.model.name))
        )
    )
    mounts = [
        config_mount(),
        {"name": WORK_VOLUME, "mountPath": WORK_DIR},
        {"name": MODEL_VOLUME, "mountPath": MODEL_DIR},
    ]
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}, MODEL_DIR_ENV]
    # The loss and preferenceAccuracy both run the trainer's own forward pass (JAX), in the loss container.
    forward = "loss" in ev.metrics or PREFERENCE_ACCURACY in ev.metrics
    score_args = ["--loss", LOSS_FILE] if forward else []
    score: Obj = {
        "name": EVAL_SCORE_CONTAINER,
        "image": spec.images.evaluator or PUBLIC_IMAGES.evaluator,
        "command": reporting_command("tpuforge_workloads.evaluate.score", *score_args),
        "env": env,
        "resources": pod_resources,
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(o.name, spec),
        "containers": [score],
        "volumes": [
            config_volume(name),
            {"name": WORK_VOLUME, "emptyDir": {}},
            model_volume(o, spec),
        ],
    }
    if forward:
        pod_spec["initContainers"] = [
            {
                "name": EVAL_LOSS_CONTAINER,
                "image": spec.images.trainer or PUBLIC_IMAGES.trainer,
                "command": reporting_command("tpuforge_workloads.evaluate.loss", "--out", LOSS_FILE),
                "env": env,
                "resources": pod_resources,
                "volumeMounts": mounts,
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ]
    if PASS_AT_K in ev.metrics and ev.code is not None and ev.code.checker is not None:
        # With exactMatch too, `sample`'s vLLM engine also gives the greedy answers: one model load, not two.
        greedy = ["--answers", ANSWERS_FILE] if "exactMatch" in ev.metrics else []
        code = _code_containers(spec, ev.code.checker, pod_resources, mounts, greedy)
        pod_spec.setdefault("initContainers", []).extend(code)
        score["command"] += ["--samples", SAMPLES_FILE, "--verdicts", VERDICTS_FILE, *greedy]
        score["volumeMounts"] = [*mounts, {"name": CHECK_VOLUME, "mountPath": CHECK_DIR, "readOnly": True}]
        pod_spec["volumes"].append({"name": CHECK_VOLUME, "emptyDir": {"sizeLimit": CHECK_VOLUME_SIZE}})
    if not on_cpu:
        pod_spec.update(tpu_scheduling(tpu_slice(ev.slice)))
    if ev.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **ev.node_selector}
    pod_spec = with_scheduling(pod_spec, ev.scheduling)
    failure_policy: Obj = {
        "rules": [
            # A rejected config fails the same way every time: no retries.
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [EXIT_BAD_CONFIG]}},
            # A pod taken away (preemption, node drain) is not the evaluation's failure.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    root = (
        frozenset()
        if on_cpu
        else root_containers(spec, EVAL_LOSS_CONTAINER, EVAL_SAMPLE_CONTAINER, EVAL_SCORE_CONTAINER)
    )
    pod_spec = locked_down(pod_spec, api_access=False, root_containers=root)
    if "initContainers" in pod_spec:
        pod_spec["initContainers"] = [
            switches_uid(c) if c["name"] == EVAL_CHECK_CONTAINER else c for c in pod_spec["initContainers"]
        ]
    job = one_pod_job(o, name, COMPONENT_EVALUATOR, spec, pod_spec, EVAL_BACKOFF_LIMIT, podFailurePolicy=failure_policy)
    # Every try together (the Job controller counts from the Job's start): a pod evicted and recreated again and
    # again, or a download that never ends, stops here and the FineTuneJob fails.
    job["spec"]["activeDeadlineSeconds"] = ev.active_deadline_seconds
    annotations = pod_annotations({}, ev.scheduling)
    if annotations:
        job["spec"]["template"]["metadata"]["annotations"] = annotations
    return job


def _code_containers(
    spec: FineTuneJobSpec, checker: CheckerSpec, resources: Obj, mounts: list[Obj], sample_args: list[str]
) -> list[Obj]:
    """passAtK's two steps: draw the samples (vLLM, on the evaluation's accelerator), then check them in the
    checker's image, capped by its CPU and memory, each sample confined by the runner (evaluate.check)."""
    limits = {"cpu": checker.cpu, "memory": checker.memory}
    parallel = checker.parallelism()
    check_args = ["--samples", SAMPLES_FILE, "--out", VERDICTS_FILE, "--timeout", f"{checker.timeout_seconds:g}"]
    check_args += ["--memory", str(checker.sample_memory()), "--parallel", str(parallel)]
    check_args += ["--scratch", f"{CHECK_DIR}/scratch", "--"]
    common: Obj = {"terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "FallbackToLogsOnError"}
    # The checker reads the work volume (the samples) and writes its own (scratch and verdicts) only; it does
    # not see the evaluation's config.
    work = [{**v, "readOnly": True} for v in mounts if v["name"] == WORK_VOLUME]
    work.append({"name": CHECK_VOLUME, "mountPath": CHECK_DIR})
    return [
        {
            "name": EVAL_SAMPLE_CONTAINER,
            "image": spec.images.evaluator or PUBLIC_IMAGES.evaluator,
            "command": reporting_command("tpuforge_workloads.evaluate.sample", "--out", SAMPLES_FILE, *sample_args),
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, MODEL_DIR_ENV],
            "resources": resources,
            "volumeMounts": mounts,
            **common,
        },
        {
            "name": EVAL_CHECK_CONTAINER,
            "image": checker.image,
            "command": ["python3", "-m", "tpuforge_workloads.evaluate.check", *check_args, *checker.command],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
            "resources": {"requests": dict(limits), "limits": limits},
            "volumeMounts": work,
            **common,
        },
    ]


def model_storage_size(spec: FineTuneJobSpec) -> str:
    """spec.evaluation.modelStorage.size, else the base model's checkpoint bytes plus headroom, in whole GiB."""
    given = spec.evaluation.model_storage.size if spec.evaluation else None
    weights = model_shape(spec.model.name).weight_bytes
    return given or f"{max(1, math.ceil(weights * MODEL_HEADROOM / resources.GIB))}Gi"


def model_volume(o: Owner, spec: FineTuneJobSpec) -> Obj:
    """The model copies' volume: on a TPU slice a generic ephemeral volume (its claim, <pod>-models, is made
    with the pod and deleted with it), on the spec's or the operator's StorageClass; on cpu an emptyDir capped
    at the size (past it the kubelet evicts the pod: a failure, counted)."""
    ev = spec.evaluation
    assert ev is not None
    size = model_storage_size(spec)
    if ev.slice == CPU_SLICE:
        return {"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": size}}
    claim: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if ev.model_storage.storage_class_name:
        claim["storageClassName"] = ev.model_storage.storage_class_name
    template: Obj = {"metadata": {"labels": labels(o, COMPONENT_EVALUATOR)}, "spec": claim}
    return {"name": MODEL_VOLUME, "ephemeral": {"volumeClaimTemplate": template}}


def eval_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    return [eval_config_map(o, spec), eval_job(o, spec)]


__all__ = [
    "EVAL_BACKOFF_LIMIT",
    "EVAL_CHECK_CONTAINER",
    "EVAL_LOSS_CONTAINER",
    "EVAL_SAMPLE_CONTAINER",
    "EVAL_SCORE_CONTAINER",
    "eval_job",
    "eval_objects",
]
