"""FineTuneJob -> the Kubernetes objects that run it: per training attempt a ConfigMap (TrainConfig) and a Job
on the TPU node pool (on a multi-host slice, a JobSet of one pod per host); the pods' ServiceAccount and a
Role/RoleBinding for progress reporting; after training, a ConfigMap (MergeConfig) and a merge Job on a CPU
node pool.

Pure: the same inputs give the same objects. Names are deterministic, so creating them again is a no-op.
"""

from __future__ import annotations

import json

from tpuforge.api import resources
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.code_eval import PASS_AT_K, CheckerSpec, quantity_bytes
from tpuforge.api.configs import eval_config, merge_config, train_config
from tpuforge.api.constants import (
    API_VERSION,
    CONFIG_FILE,
    CONFIG_MOUNT_DIR,
    COORDINATOR_PORT,
    CPU_SLICE,
    ENV_COORDINATOR_ADDRESS,
    ENV_JOIN_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    EXIT_BAD_CONFIG,
    FINETUNEJOB_KIND,
    FINETUNEJOB_PLURAL,
    GKE_NODEPOOL,
    JOB_COMPLETION_INDEX,
    JOBSET_API_VERSION,
    JOBSET_EXCLUSIVE_TOPOLOGY,
    JOBSET_KIND,
    LABEL_ATTEMPT,
    LABEL_FINETUNEJOB,
    LABEL_KUEUE_QUEUE,
    TERMINATION_LOG,
    TPU_RUNTIME_PORT,
)
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.manifests.common import (
    MAX_NAME,
    Obj,
    Owner,
    child_name,
    config_map,
    locked_down,
    metadata,
    own_status_role,
    role_binding,
    service_account,
    standard_labels,
    tpu_resources,
    tpu_scheduling,
)

COMPONENT_TRAINER = "trainer"
COMPONENT_MERGER = "merger"
COMPONENT_EVALUATOR = "evaluator"
COMPONENT_PREFLIGHT = "preflight"
COMPONENT_RBAC = "rbac"
APP_TRAINER = "tpuforge-trainer"
APP_MERGER = "tpuforge-merger"
APP_EVALUATOR = "tpuforge-evaluator"
APP_PREFLIGHT = "tpuforge-preflight"
TRAINER_CONTAINER = "trainer"
MERGER_CONTAINER = "merger"
# The evaluation pod: an init container computes the held-out loss with the trainer's own code (JAX), then
# the main container serves base + adapter with vLLM, scores greedy answers and writes the result (the
# operator reads it from this container's termination message).
EVAL_LOSS_CONTAINER = "loss"
EVAL_SCORE_CONTAINER = "score"
# With passAtK, two more init containers: `sample` (evaluator image) draws the samples, `check` (the checker's
# image, with its CPU and memory as limits) runs each one against its test; `score` turns verdicts into pass@k.
EVAL_SAMPLE_CONTAINER = "sample"
EVAL_CHECK_CONTAINER = "check"
# The JobSet's one replicated Job: its pods are <jobset>-trainer-0-<host> (their hostnames).
TRAINER_REPLICATED_JOB = "trainer"

# The training ConfigMap also keeps the spec the run started with: later attempts take the fields that
# change the training maths from it, so an edit after the start never changes a run half-way.
SPEC_KEY = "finetunejob-spec.json"

# On SIGTERM the trainer writes an Orbax checkpoint (LoRA weights + optimizer state: about 1.5 GB for the 31B
# model at rank 64) straight to GCS before it exits. Off Spot (a drain, a node upgrade, a suspend) five
# minutes covers a slow link. On Spot a reclaim gives 15 s whatever the pod asks, so the pod asks for that
# (common.tpu_scheduling): the checkpoint durations the trainer reports say whether one fits, and the trainer
# also checkpoints every checkpoint.everySteps.
TRAINER_TERMINATION_GRACE_SECONDS = 300
# The merge is idempotent (it commits its output with a marker written last), so a transient failure such as
# a GCS hiccup is retried by the Job controller; the operator reads the outcome from the Job.
MERGE_BACKOFF_LIMIT = 2

# The trainer's TMPDIR (the compile cache's local layer) is /dev/shm, memory-backed, rather than the small boot
# disk of a TPU VM; its sizeLimit is counted in the pod's memory request.
SHM_DIR = "/dev/shm"
PROGRESS_VERBS = ("get", "patch")


def owner(namespace: str, name: str, uid: str) -> Owner:
    return Owner(API_VERSION, FINETUNEJOB_KIND, namespace, name, uid)


def train_job_name(name: str, attempt: int, hosts: int = 1) -> str:
    """The attempt's Job (one host) or JobSet (several): `<job>-train-<n>`. A JobSet's name is shorter when
    needed, because its pods' hostnames `<jobset>-trainer-0-<host>` must stay DNS labels."""
    suffix = f"train-{attempt}"
    if hosts == 1:
        return child_name(name, suffix)
    return child_name(name, suffix, MAX_NAME - len(f"-{TRAINER_REPLICATED_JOB}-0-{hosts - 1}"))


def merge_job_name(name: str) -> str:
    return child_name(name, "merge")


def eval_job_name(name: str) -> str:
    return child_name(name, "eval")


def progress_role_name(name: str) -> str:
    return child_name(name, "progress")


def service_account_name(name: str, spec: FineTuneJobSpec) -> str:
    """The pods' ServiceAccount: the platform team's (Workload Identity) or the one the operator creates."""
    return spec.service_account_name or child_name(name, "trainer")


_APPS = {COMPONENT_MERGER: APP_MERGER, COMPONENT_EVALUATOR: APP_EVALUATOR, COMPONENT_PREFLIGHT: APP_PREFLIGHT}


def labels(o: Owner, component: str, attempt: int | None = None) -> dict[str, str]:
    app = _APPS.get(component, APP_TRAINER)
    out = standard_labels(o, LABEL_FINETUNEJOB, app, component)
    if attempt is not None:
        out[LABEL_ATTEMPT] = str(attempt)
    return out


def rbac_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    """The pods' ServiceAccount (unless the spec names one) and the Role + RoleBinding that let it get and
    patch this FineTuneJob's status, and nothing else."""
    lab = labels(o, COMPONENT_RBAC)
    sa = service_account_name(o.name, spec)
    role = progress_role_name(o.name)
    objs = [] if spec.service_account_name else [service_account(o, sa, lab)]
    objs.append(own_status_role(o, role, lab, FINETUNEJOB_PLURAL, PROGRESS_VERBS))
    objs.append(role_binding(o, role, lab, role, sa))
    return objs


def frozen_spec_json(spec: FineTuneJobSpec) -> str:
    return json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))


def train_config_map(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    cfg = train_config(o.namespace, o.name, spec, attempt=attempt)
    return config_map(
        o,
        train_job_name(o.name, attempt, tpu_slice(spec.tpu.slice).hosts),
        labels(o, COMPONENT_TRAINER, attempt),
        {CONFIG_FILE: cfg.model_dump_json(by_alias=True), SPEC_KEY: frozen_spec_json(spec)},
    )


def config_volume(config_map_name: str) -> Obj:
    return {
        "name": "config",
        "configMap": {"name": config_map_name, "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}]},
    }


def config_mount() -> Obj:
    return {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True}


def _command(module: str, *extra: str) -> list[str]:
    return ["python", "-m", module, "--config", f"{CONFIG_MOUNT_DIR}/{CONFIG_FILE}", *extra]


def reporting_command(module: str, *extra: str) -> list[str]:
    """A workload that writes why it ended (or its result) to the termination log."""
    return _command(module, *extra, "--termination-log", TERMINATION_LOG)


def _multi_host_env(jobset: str, hosts: int, join_timeout_seconds: int) -> list[Obj]:
    """What each host's trainer needs for jax.distributed.initialize: the process count, its own index (the
    Indexed Job's completion index) and process 0's address (its hostname in the JobSet's subdomain)."""
    coordinator = f"{jobset}-{TRAINER_REPLICATED_JOB}-0-0.{jobset}:{COORDINATOR_PORT}"
    return [
        {"name": ENV_NUM_PROCESSES, "value": str(hosts)},
        {
            "name": ENV_PROCESS_ID,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_COMPLETION_INDEX}']"}},
        },
        {"name": ENV_COORDINATOR_ADDRESS, "value": coordinator},
        {"name": ENV_JOIN_TIMEOUT, "value": str(join_timeout_seconds)},
    ]


def train_pod_template(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    """The training pod of one host, for a Job (one host) and a JobSet (each host) alike."""
    slc = tpu_slice(spec.tpu.slice)
    name = train_job_name(o.name, attempt, slc.hosts)
    metrics_port = train_config(o.namespace, o.name, spec, attempt).metrics_port
    model = model_shape(spec.model.name)
    env: list[Obj] = [
        {"name": "TMPDIR", "value": SHM_DIR},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if slc.hosts > 1:
        env += _multi_host_env(name, slc.hosts, spec.tpu.join_timeout_seconds)
    container: Obj = {
        "name": TRAINER_CONTAINER,
        "image": spec.images.trainer,
        "command": reporting_command("tpuforge_workloads.train"),
        "env": env,
        "resources": tpu_resources(slc, resources.trainer_requests(spec.tpu.resources, model, slc.hosts)),
        "volumeMounts": [config_mount(), {"name": "dshm", "mountPath": SHM_DIR}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    ports = train_ports(metrics_port, slc.hosts)
    if ports:
        container["ports"] = ports
    shm = {"medium": "Memory", "sizeLimit": resources.gib(resources.TRAINER_TMPDIR_BYTES)}
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(o.name, spec),
        "terminationGracePeriodSeconds": TRAINER_TERMINATION_GRACE_SECONDS,
        **tpu_scheduling(slc, spec.tpu.spot, spec.tpu.spot_grace_seconds),  # on Spot: the grace a reclaim gives
        "containers": [container],
        "volumes": [config_volume(name), {"name": "dshm", "emptyDir": shm}],
    }
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    # The trainer patches its FineTuneJob's status with its ServiceAccount token.
    pod_spec = locked_down(pod_spec, api_access=True, root_containers=_root(spec, TRAINER_CONTAINER))
    return {"metadata": {"labels": labels(o, COMPONENT_TRAINER, attempt)}, "spec": pod_spec}


def train_ports(metrics_port: int | None, hosts: int) -> list[Obj]:
    """The ports a training pod serves: its metrics, and on a multi-host slice the JAX coordinator (process 0
    listens, every host connects) and the TPU runtime's host-to-host port. Declared so that NetworkPolicies
    and readers of the pod can name them."""
    ports: list[Obj] = []
    if metrics_port:
        ports.append({"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"})
    if hosts > 1:
        ports.append({"name": "coordinator", "containerPort": COORDINATOR_PORT, "protocol": "TCP"})
        ports.append({"name": "tpu-runtime", "containerPort": TPU_RUNTIME_PORT, "protocol": "TCP"})
    return ports


def _root(spec: FineTuneJobSpec, *containers: str) -> frozenset[str]:
    """The TPU containers that run as root: all of them when spec.tpu.runAsRoot, else none."""
    return frozenset(containers) if spec.tpu.run_as_root else frozenset()


def _train_labels(o: Owner, spec: FineTuneJobSpec, attempt: int) -> dict[str, str]:
    out = labels(o, COMPONENT_TRAINER, attempt)
    if spec.queue_name:
        out[LABEL_KUEUE_QUEUE] = spec.queue_name
    return out


def train_job(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    """A single-host slice's attempt: a Job of one pod."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(o, train_job_name(o.name, attempt), _train_labels(o, spec, attempt)),
        "spec": {
            # The operator owns retries: it tells a preemption from a failure and resumes from a checkpoint.
            "backoffLimit": 0,
            "completions": 1,
            "parallelism": 1,
            "template": train_pod_template(o, spec, attempt),
        },
    }


def train_jobset(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    """A multi-host slice's attempt: a JobSet of one Indexed Job with one pod per host, all on one node pool.

    The operator owns attempts as it does for a Job: no Job retries (backoffLimit 0), no JobSet restarts
    (maxRestarts 0), so the first host that ends badly ends the attempt and the operator decides (a
    preemption resumes from the checkpoint as a new JobSet, a failure counts towards maxRestarts)."""
    hosts = tpu_slice(spec.tpu.slice).hosts
    name = train_job_name(o.name, attempt, hosts)
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": JOBSET_KIND,
        "metadata": metadata(o, name, _train_labels(o, spec, attempt), {JOBSET_EXCLUSIVE_TOPOLOGY: GKE_NODEPOOL}),
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            # Each pod gets the hostname <jobset>-trainer-0-<host> in the subdomain <jobset> (a headless
            # Service JobSet creates): process 0's name is the coordinator address.
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": TRAINER_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "completions": hosts,
                            "parallelism": hosts,
                            "completionMode": "Indexed",
                            "template": train_pod_template(o, spec, attempt),
                        }
                    },
                }
            ],
        },
    }


def train_workload(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    """The attempt's Job on a single-host slice, its JobSet on a multi-host one. Single-host slices keep a
    plain Job so that they need nothing installed beyond Kubernetes itself."""
    if tpu_slice(spec.tpu.slice).hosts > 1:
        return train_jobset(o, spec, attempt)
    return train_job(o, spec, attempt)


def attempt_objects(o: Owner, spec: FineTuneJobSpec, attempt: int) -> list[Obj]:
    """Everything a training attempt needs, in creation order: the Job (or JobSet) comes last, so its pods
    never wait for a ServiceAccount or ConfigMap that does not exist yet."""
    return [*rbac_objects(o, spec), train_config_map(o, spec, attempt), train_workload(o, spec, attempt)]


def merge_config_map(o: Owner, spec: FineTuneJobSpec) -> Obj:
    cfg = merge_config(o.namespace, o.name, spec)
    return config_map(
        o, merge_job_name(o.name), labels(o, COMPONENT_MERGER), {CONFIG_FILE: cfg.model_dump_json(by_alias=True)}
    )


def merge_job(o: Owner, spec: FineTuneJobSpec) -> Obj:
    name = merge_job_name(o.name)
    lab = labels(o, COMPONENT_MERGER)
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(o.name, spec),
        "containers": [
            {
                "name": MERGER_CONTAINER,
                "image": spec.images.merger,
                "command": reporting_command("tpuforge_workloads.merge"),
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "resources": resources.merge_resources(
                    spec.merge.resources, model_shape(spec.model.name), spec.merge.verify
                ),
                "volumeMounts": [config_mount()],
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [config_volume(name)],
    }
    if spec.merge.node_selector:
        pod_spec["nodeSelector"] = dict(spec.merge.node_selector)
    return one_pod_job(o, name, lab, locked_down(pod_spec, api_access=False), MERGE_BACKOFF_LIMIT)


def one_pod_job(o: Owner, name: str, lab: dict[str, str], pod_spec: Obj, backoff: int, **spec: Obj) -> Obj:
    """A Job of one pod that runs to completion (the merge, the evaluation), retried up to `backoff` times."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(o, name, lab),
        "spec": {
            "backoffLimit": backoff,
            "completions": 1,
            "parallelism": 1,
            **spec,
            "template": {"metadata": {"labels": lab}, "spec": pod_spec},
        },
    }


def merge_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    return [merge_config_map(o, spec), merge_job(o, spec)]


# The evaluation only reads its inputs and commits its report with a marker written last, so a transient
# failure (a GCS hiccup, a node lost) is retried by the Job controller as the merge's is.
EVAL_BACKOFF_LIMIT = MERGE_BACKOFF_LIMIT
WORK_VOLUME = "work"
WORK_DIR = "/work"  # shared by the two containers: the loss's result reaches the scorer through it
LOSS_FILE = f"{WORK_DIR}/loss.json"
SAMPLES_FILE = f"{WORK_DIR}/samples.jsonl"
VERDICTS_FILE = f"{WORK_DIR}/verdicts.jsonl"
ANSWERS_FILE = f"{WORK_DIR}/answers.json"  # exactMatch's greedy answers, when `sample` draws them too


def eval_config_map(o: Owner, spec: FineTuneJobSpec) -> Obj:
    cfg = eval_config(o.namespace, o.name, spec)
    return config_map(
        o, eval_job_name(o.name), labels(o, COMPONENT_EVALUATOR), {CONFIG_FILE: cfg.model_dump_json(by_alias=True)}
    )


def eval_job(o: Owner, spec: FineTuneJobSpec) -> Obj:
    """The evaluation Job: base + adapter scored on the held-out records, on the serving slice kind (or a CPU
    node). Its pod needs no Kubernetes API token: the result travels in the `score` container's termination
    message, which the operator reads from the pod's status."""
    ev = spec.evaluation
    if ev is None:
        raise ValueError("spec.evaluation is unset: there is nothing to evaluate")
    name = eval_job_name(o.name)
    lab = labels(o, COMPONENT_EVALUATOR)
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
    mounts = [config_mount(), {"name": WORK_VOLUME, "mountPath": WORK_DIR}]
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    score_args = ["--loss", LOSS_FILE] if "loss" in ev.metrics else []
    score: Obj = {
        "name": EVAL_SCORE_CONTAINER,
        "image": spec.images.evaluator,
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
        ],
    }
    if "loss" in ev.metrics:
        pod_spec["initContainers"] = [
            {
                "name": EVAL_LOSS_CONTAINER,
                "image": spec.images.trainer,
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
    if not on_cpu:
        pod_spec.update(tpu_scheduling(tpu_slice(ev.slice)))
    if ev.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **ev.node_selector}
    failure_policy: Obj = {
        "rules": [
            # A rejected config fails the same way every time: no retries.
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [EXIT_BAD_CONFIG]}},
            # A pod taken away (preemption, node drain) is not the evaluation's failure.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    root = frozenset() if on_cpu else _root(spec, EVAL_LOSS_CONTAINER, EVAL_SAMPLE_CONTAINER, EVAL_SCORE_CONTAINER)
    pod_spec = locked_down(pod_spec, api_access=False, root_containers=root)
    return one_pod_job(o, name, lab, pod_spec, EVAL_BACKOFF_LIMIT, podFailurePolicy=failure_policy)


def _code_containers(
    spec: FineTuneJobSpec, checker: CheckerSpec, resources: Obj, mounts: list[Obj], sample_args: list[str]
) -> list[Obj]:
    """passAtK's two steps: draw the samples (vLLM, on the evaluation's accelerator), then check them in the
    checker's image, capped by its CPU and memory, each sample confined by the runner (evaluate.check)."""
    limits = {"cpu": checker.cpu, "memory": checker.memory}
    check_args = ["--samples", SAMPLES_FILE, "--out", VERDICTS_FILE, "--timeout", f"{checker.timeout_seconds:g}"]
    check_args += ["--memory", str(quantity_bytes(checker.memory)), "--scratch", f"{WORK_DIR}/check", "--"]
    common: Obj = {"terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "FallbackToLogsOnError"}
    # The checker sees the work volume only (the samples in, the verdicts out), not the evaluation's config.
    work = [v for v in mounts if v["name"] == WORK_VOLUME]
    return [
        {
            "name": EVAL_SAMPLE_CONTAINER,
            "image": spec.images.evaluator,
            "command": reporting_command("tpuforge_workloads.evaluate.sample", "--out", SAMPLES_FILE, *sample_args),
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
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


def eval_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    return [eval_config_map(o, spec), eval_job(o, spec)]


__all__ = [
    "APP_EVALUATOR",
    "APP_MERGER",
    "APP_PREFLIGHT",
    "APP_TRAINER",
    "COMPONENT_EVALUATOR",
    "COMPONENT_MERGER",
    "COMPONENT_PREFLIGHT",
    "COMPONENT_RBAC",
    "COMPONENT_TRAINER",
    "EVAL_BACKOFF_LIMIT",
    "EVAL_CHECK_CONTAINER",
    "EVAL_LOSS_CONTAINER",
    "EVAL_SAMPLE_CONTAINER",
    "EVAL_SCORE_CONTAINER",
    "MERGER_CONTAINER",
    "SPEC_KEY",
    "TRAINER_CONTAINER",
    "TRAINER_REPLICATED_JOB",
    "TRAINER_TERMINATION_GRACE_SECONDS",
    "attempt_objects",
    "eval_job",
    "eval_job_name",
    "eval_objects",
    "merge_job_name",
    "merge_objects",
    "owner",
    "rbac_objects",
    "service_account_name",
    "train_job",
    "train_job_name",
    "train_jobset",
    "train_pod_template",
    "train_ports",
    "train_workload",
]
