"""FineTuneJob -> a training attempt: a ConfigMap (the TrainConfig, and the spec the run started with) and a
Job on the TPU node pool (on a multi-host slice, a JobSet of one pod per host), created after the pods'
ServiceAccount and progress Role (finetune_rbac).

Pure: the same inputs give the same objects.
"""

from __future__ import annotations

import json

from tpuforge.api import resources
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.code_eval import quantity_bytes
from tpuforge.api.configs import train_config, trainer_config
from tpuforge.api.constants import (
    CHECKER_SPOOL_ENV,
    CONFIG_FILE,
    COORDINATOR_PORT,
    ENV_COORDINATOR_ADDRESS,
    ENV_JOIN_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    GKE_NODEPOOL,
    JOB_COMPLETION_INDEX,
    JOBSET_API_VERSION,
    JOBSET_EXCLUSIVE_TOPOLOGY,
    JOBSET_KIND,
    SPOT_NOTICE_ENV,
    TERMINATION_LOG,
    TPU_RUNTIME_PORT,
)
from tpuforge.api.finetune import FineTuneJobSpec, GrpoSpec, RlCheckerSpec
from tpuforge.api.images import CHECKER_VERILOG, PUBLIC_IMAGES
from tpuforge.api.preflight import PreflightStatus
from tpuforge.manifests import finetune_rbac
from tpuforge.manifests.common import (
    Obj,
    Owner,
    config_map,
    grace_seconds,
    image_pull_secrets,
    locked_down,
    metadata,
    pod_annotations,
    switches_uid,
    tpu_resources,
    tpu_scheduling,
    with_scheduling,
)
from tpuforge.manifests.finetune_common import (
    COMPONENT_TRAINER,
    TRAINER_REPLICATED_JOB,
    config_mount,
    config_volume,
    labels,
    reporting_command,
    root_containers,
    service_account_name,
    train_job_name,
    workload_labels,
)

TRAINER_CONTAINER = "trainer"
# spec.method grpo: the checker of the rollouts, a native sidecar (an init container that keeps running: the pod
# ends with the trainer) with the evaluation `check` container's confinement. The trainer hands it answers and
# reads its verdicts through the spool, an emptyDir both mount (evaluate.check --serve; train/grpo.SpoolChecker);
# the samples' scratch directories are on a volume of the checker's alone.
CHECKER_CONTAINER = "checker"
SPOOL_VOLUME = "rl-spool"
SPOOL_DIR = "/rl-spool"
SPOOL_VOLUME_SIZE = "1Gi"
RL_CHECK_VOLUME = "rl-check"
RL_CHECK_DIR = "/rl-check"
RL_CHECK_VOLUME_SIZE = "2Gi"

# The training ConfigMap also keeps the spec the run started with: later attempts take the fields that
# change the training maths from it, so an edit after the start never changes a run half-way.
SPEC_KEY = "finetunejob-spec.json"

# On SIGTERM the trainer writes an Orbax checkpoint (LoRA weights + optimizer state: about 1.5 GB for the 31B
# model at rank 64) straight to GCS before it exits. A drain, a node upgrade, Kueue's preemption or a suspend
# honour the pod's grace: five minutes covers a slow link, on Spot too. A Spot reclaim gives ~15 s whatever the
# pod asks (the node shuts down), so there the trainer starts on GKE's shutdown notice (SPOT_NOTICE_ENV), before
# the SIGTERM; trainer_grace_seconds is that reclaim budget, which the checkpoint durations the trainer reports
# are held against (CheckpointWithinGrace). It also checkpoints every checkpoint.everySteps.
TRAINER_TERMINATION_GRACE_SECONDS = 300


def trainer_grace_seconds(spec: FineTuneJobSpec) -> int:
    """The time a training pod's checkpoint has when it is stopped the hardest way its capacity allows: a Spot
    reclaim (the node's shutdown, whatever the pod's own grace), else its terminationGracePeriodSeconds."""
    return grace_seconds(spec.tpu.spot, spec.tpu.spot_grace_seconds, TRAINER_TERMINATION_GRACE_SECONDS)


# The trainer's TMPDIR (the compile cache's local layer) is /dev/shm, memory-backed, rather than the small boot
# disk of a TPU VM; its sizeLimit is counted in the pod's memory request.
SHM_DIR = "/dev/shm"


def frozen_spec_json(spec: FineTuneJobSpec) -> str:
    return json.dumps(spec.to_wire(), sort_keys=True, separators=(",", ":"))


def train_config_map(o: Owner, spec: FineTuneJobSpec, attempt: int, preflight: PreflightStatus | None = None) -> Obj:
    """The attempt's TrainConfig (remat as `preflight`, status.preflight, chose it where the spec leaves it
    unset) and the spec the run started with."""
    cfg = trainer_config(o.namespace, o.name, spec, attempt, preflight)
    return config_map(
        o,
        train_job_name(o.name, attempt, tpu_slice(spec.tpu.slice).hosts),
        labels(o, COMPONENT_TRAINER, attempt),
        {CONFIG_FILE: cfg.model_dump_json(by_alias=True), SPEC_KEY: frozen_spec_json(spec)},
    )


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


def rl_checker(spec: FineTuneJobSpec) -> RlCheckerSpec | None:
    """The rollouts' checker when the job has one: spec.method grpo with the checker's verdict in the reward."""
    if spec.method != "grpo":
        return None
    grpo = spec.grpo or GrpoSpec()
    return grpo.checker if grpo.reward.checker > 0 else None


def checker_sidecar(checker: RlCheckerSpec) -> Obj:
    """The checker beside the trainer, before locked_down and switches_uid give it its securityContext: its CPU
    and memory as request and limit (each answer's memory times those checked at once, plus the runner's)."""
    memory = f"{checker.container_memory() >> 20}Mi"
    limits = {"cpu": checker.cpu, "memory": memory}
    args = ["--serve", SPOOL_DIR, "--timeout", f"{checker.timeout_seconds:g}"]
    args += ["--memory", str(quantity_bytes(checker.memory)), "--parallel", str(checker.parallelism())]
    args += ["--scratch", f"{RL_CHECK_DIR}/scratch", "--"]
    return {
        "name": CHECKER_CONTAINER,
        "image": checker.image or PUBLIC_IMAGES.image(CHECKER_VERILOG),
        "command": ["python3", "-m", "tpuforge_workloads.evaluate.check", *args, *checker.command],
        "restartPolicy": "Always",  # a native sidecar (Kubernetes 1.29+): stopped when the trainer ends
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": dict(limits), "limits": limits},
        "volumeMounts": [
            {"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR},
            {"name": RL_CHECK_VOLUME, "mountPath": RL_CHECK_DIR},
        ],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


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
    if spec.tpu.spot:
        env.append({"name": SPOT_NOTICE_ENV, "value": "1"})
    container: Obj = {
        "name": TRAINER_CONTAINER,
        "image": spec.images.trainer or PUBLIC_IMAGES.trainer,
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
        **tpu_scheduling(slc, spec.tpu.spot, spec.tpu.spot_grace_seconds),
        # After tpu_scheduling's Spot grace: the trainer keeps its long grace for every stop that honours it.
        "terminationGracePeriodSeconds": TRAINER_TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": [config_volume(name), {"name": "dshm", "emptyDir": shm}],
        **image_pull_secrets(spec.images.pull_secrets),
    }
    checker = rl_checker(spec)
    if checker is not None:
        env.append({"name": CHECKER_SPOOL_ENV, "value": SPOOL_DIR})
        container["volumeMounts"].append({"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR})
        pod_spec["initContainers"] = [checker_sidecar(checker)]
        pod_spec["volumes"] += [
            {"name": SPOOL_VOLUME, "emptyDir": {"sizeLimit": SPOOL_VOLUME_SIZE}},
            {"name": RL_CHECK_VOLUME, "emptyDir": {"sizeLimit": RL_CHECK_VOLUME_SIZE}},
        ]
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    pod_spec = with_scheduling(pod_spec, spec.tpu.scheduling)
    # The trainer patches its FineTuneJob's status with its ServiceAccount token.
    pod_spec = locked_down(pod_spec, api_access=True, root_containers=root_containers(spec, TRAINER_CONTAINER))
    if checker is not None:
        pod_spec["initContainers"] = [switches_uid(c) for c in pod_spec["initContainers"]]
    meta: Obj = {"labels": labels(o, COMPONENT_TRAINER, attempt)}
    annotations = pod_annotations({}, spec.tpu.scheduling)
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": pod_spec}


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


def train_job(o: Owner, spec: FineTuneJobSpec, attempt: int) -> Obj:
    """A single-host slice's attempt: a Job of one pod."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(o, train_job_name(o.name, attempt), workload_labels(o, COMPONENT_TRAINER, spec, attempt)),
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
    own_labels = workload_labels(o, COMPONENT_TRAINER, spec, attempt)
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": JOBSET_KIND,
        "metadata": metadata(o, name, own_labels, {JOBSET_EXCLUSIVE_TOPOLOGY: GKE_NODEPOOL}),
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


def attempt_objects(
    o: Owner, spec: FineTuneJobSpec, attempt: int, preflight: PreflightStatus | None = None
) -> list[Obj]:
    """Everything a training attempt needs, in creation order: the Job (or JobSet) comes last, so its pods
    never wait for a ServiceAccount or ConfigMap that does not exist yet. `preflight`: status.preflight."""
    # finetune_rbac is imported whole: tests/fixtures/rbac_scan.py finds the kinds created here through the module.
    return [
        *finetune_rbac.rbac_objects(o, spec),
        train_config_map(o, spec, attempt, preflight),
        train_workload(o, spec, attempt),
    ]


__all__ = [
    "CHECKER_CONTAINER",
    "SPEC_KEY",
    "TRAINER_CONTAINER",
    "TRAINER_TERMINATION_GRACE_SECONDS",
    "attempt_objects",
    "train_job",
    "train_jobset",
    "train_pod_template",
    "train_ports",
    "train_workload",
    "trainer_grace_seconds",
]
