"""FineTuneJob -> its preflight: a ConfigMap (the TrainConfig the first attempt will get) and a Job of one pod
on a CPU node that compiles the train step for the slice's TPU topology (`python -m
tpuforge_workloads.preflight`, trainer image: libtpu compiles for TPU without one). No TPU request, no TPU
node selector: it lands on whatever CPU node pool fits its requests (spec.preflight.nodeSelector picks one).
The report travels back in the container's termination message, as the evaluation's result does.

Pure: the same inputs give the same objects.
"""

from __future__ import annotations

from tpuforge.api import resources
from tpuforge.api.configs import train_config
from tpuforge.api.constants import CONFIG_FILE, EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT, TERMINATION_LOG
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.api.images import PUBLIC_IMAGES
from tpuforge.manifests.common import Obj, Owner, child_name, config_map, locked_down
from tpuforge.manifests.finetune_common import (
    COMPONENT_PREFLIGHT,
    config_mount,
    config_volume,
    labels,
    one_pod_job,
    reporting_command,
    service_account_name,
)
from tpuforge.manifests.finetune_rbac import rbac_objects

PREFLIGHT_CONTAINER = "preflight"
# A compile fails the same way every time, so only what is not the compile's doing (a node lost, GCS out of
# reach for config.json) is retried; a refused config or a step that does not fit ends the Job at once.
PREFLIGHT_BACKOFF_LIMIT = 2


def preflight_job_name(name: str) -> str:
    return child_name(name, "preflight")


def preflight_config_map(o: Owner, spec: FineTuneJobSpec) -> Obj:
    # The first attempt's config, without the job reference: the preflight reports through its termination
    # message, not the FineTuneJob's status, and serves no metrics.
    cfg = train_config(o.namespace, o.name, spec).model_copy(update={"job": None, "metrics_port": 0})
    return config_map(
        o,
        preflight_job_name(o.name),
        labels(o, COMPONENT_PREFLIGHT),
        {CONFIG_FILE: cfg.model_dump_json(by_alias=True)},
    )


def preflight_job(o: Owner, spec: FineTuneJobSpec) -> Obj:
    name = preflight_job_name(o.name)
    container: Obj = {
        "name": PREFLIGHT_CONTAINER,
        "image": spec.images.trainer or PUBLIC_IMAGES.trainer,
        "command": reporting_command(
            "tpuforge_workloads.preflight",
            "--slice",
            spec.tpu.slice,
            *(["--whole"] if spec.preflight.whole_step else []),
        ),
        "env": [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            # A compile-only host: JAX runs on the CPU, and libtpu asks no metadata server for a TPU.
            {"name": "JAX_PLATFORMS", "value": "cpu"},
            {"name": "TPU_SKIP_MDS_QUERY", "value": "1"},
        ],
        "resources": {"requests": resources.preflight_requests(spec.preflight.resources)},
        "volumeMounts": [config_mount()],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        # The pods' ServiceAccount: on GKE, the one Workload Identity lets read spec.model.uri's config.json.
        "serviceAccountName": service_account_name(o.name, spec),
        "containers": [container],
        "volumes": [config_volume(name)],
    }
    if spec.preflight.node_selector:
        pod_spec["nodeSelector"] = dict(spec.preflight.node_selector)
    # (podFailurePolicy needs restartPolicy Never, as above.)
    failure_policy: Obj = {
        "rules": [
            # A refused config or a step that does not fit ends the Job at once, with no second pod: the Job's
            # Failed reason is then PodFailurePolicy, and the operator reads why from the pod's exit code.
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": PREFLIGHT_CONTAINER,
                    "operator": "In",
                    "values": [EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT],
                },
            },
            # A pod taken away (preemption, eviction, node drain) is not the compile's failure: not counted
            # against backoffLimit.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    pod_spec = locked_down(pod_spec, api_access=False)
    return one_pod_job(
        o, name, COMPONENT_PREFLIGHT, spec, pod_spec, PREFLIGHT_BACKOFF_LIMIT, podFailurePolicy=failure_policy
    )


def preflight_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    """In creation order: the pods' ServiceAccount (the attempts' too) and the config before the Job."""
    return [*rbac_objects(o, spec), preflight_config_map(o, spec), preflight_job(o, spec)]


__all__ = ["COMPONENT_PREFLIGHT", "PREFLIGHT_BACKOFF_LIMIT", "preflight_job_name", "preflight_objects"]
