"""What a FineTuneJob's children share: their names, labels and owner, the pods' ServiceAccount name, the
config volume and the command that reads it, and the Job of one pod that the merge, the evaluation and the
preflight run in. Every Job and JobSet carries Kueue's queue label when spec.queueName is set.

Pure: the same inputs give the same objects. Names are deterministic, so creating them again is a no-op.
"""

from __future__ import annotations

from tpuforge.api.constants import (
    API_VERSION,
    CONFIG_FILE,
    CONFIG_MOUNT_DIR,
    FINETUNEJOB_KIND,
    LABEL_ATTEMPT,
    LABEL_FINETUNEJOB,
    LABEL_KUEUE_QUEUE,
    TERMINATION_LOG,
)
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.manifests.common import (
    MAX_NAME,
    Obj,
    Owner,
    child_name,
    image_pull_secrets,
    metadata,
    standard_labels,
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
# The JobSet's one replicated Job: its pods are <jobset>-trainer-0-<host> (their hostnames).
TRAINER_REPLICATED_JOB = "trainer"


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


def eval_job_name(name: str, run: int = 0) -> str:
    """The evaluation Job (and its ConfigMap) of run `run` (spec.evaluation.rerun): each run has its own, so a
    rerun never reads the result of the Job before it."""
    return child_name(name, f"eval-{run}" if run else "eval")


def service_account_name(name: str, spec: FineTuneJobSpec) -> str:
    """The pods' ServiceAccount: the platform team's (Workload Identity), which validation requires. A job
    started before the field was required has none: it keeps the ServiceAccount the operator made for it then."""
    return spec.service_account_name or child_name(name, "trainer")


_APPS = {COMPONENT_MERGER: APP_MERGER, COMPONENT_EVALUATOR: APP_EVALUATOR, COMPONENT_PREFLIGHT: APP_PREFLIGHT}


def labels(o: Owner, component: str, attempt: int | None = None) -> dict[str, str]:
    app = _APPS.get(component, APP_TRAINER)
    out = standard_labels(o, LABEL_FINETUNEJOB, app, component)
    if attempt is not None:
        out[LABEL_ATTEMPT] = str(attempt)
    return out


def workload_labels(o: Owner, component: str, spec: FineTuneJobSpec, attempt: int | None = None) -> dict[str, str]:
    """A Job's or JobSet's own labels: its pods' (`labels`) and, when spec.queueName names a Kueue LocalQueue,
    Kueue's queue label. Kueue's Job and JobSet integrations read it on that object, which Kueue's webhook
    then creates suspended until Kueue admits it whole; its pods do not carry it."""
    out = labels(o, component, attempt)
    if spec.queue_name:
        out[LABEL_KUEUE_QUEUE] = spec.queue_name
    return out


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


def root_containers(spec: FineTuneJobSpec, *containers: str) -> frozenset[str]:
    """The TPU containers that run as root: all of them when spec.tpu.runAsRoot, else none."""
    return frozenset(containers) if spec.tpu.run_as_root else frozenset()


def one_pod_job(
    o: Owner, name: str, component: str, spec: FineTuneJobSpec, pod_spec: Obj, backoff: int, **job_fields: Obj
) -> Obj:
    """A Job of one pod that runs to completion (the preflight, the merge, the evaluation), retried up to
    `backoff` times; `job_fields` go into its spec. The pod gets spec.images.pullSecrets."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(o, name, workload_labels(o, component, spec)),
        "spec": {
            "backoffLimit": backoff,
            "completions": 1,
            "parallelism": 1,
            **job_fields,
            "template": {
                "metadata": {"labels": labels(o, component)},
                "spec": {**pod_spec, **image_pull_secrets(spec.images.pull_secrets)},
            },
        },
    }


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
    "TRAINER_REPLICATED_JOB",
    "eval_job_name",
    "merge_job_name",
    "owner",
    "service_account_name",
    "train_job_name",
    "workload_labels",
]
