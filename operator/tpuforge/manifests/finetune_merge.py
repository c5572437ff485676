"""FineTuneJob -> after training, the merge: a ConfigMap (the MergeConfig) and a merge Job of one pod on a CPU
node pool.

Pure: the same inputs give the same objects.
"""

from __future__ import annotations

from tpuforge.api import resources
from tpuforge.api.catalog import model_shape
from tpuforge.api.configs import merge_config
from tpuforge.api.constants import CONFIG_FILE, TERMINATION_LOG
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.api.images import PUBLIC_IMAGES
from tpuforge.manifests.common import Obj, Owner, config_map, locked_down
from tpuforge.manifests.finetune_common import (
    COMPONENT_MERGER,
    config_mount,
    config_volume,
    labels,
    merge_job_name,
    one_pod_job,
    reporting_command,
    service_account_name,
)

MERGER_CONTAINER = "merger"
# The merge is idempotent (it commits its output with a marker written last), so a transient failure such as
# a GCS hiccup is retried by the Job controller; the operator reads the outcome from the Job.
MERGE_BACKOFF_LIMIT = 2


def merge_config_map(o: Owner, spec: FineTuneJobSpec, step: int | None = None) -> Obj:
    cfg = merge_config(o.namespace, o.name, spec, step)
    return config_map(
        o, merge_job_name(o.name), labels(o, COMPONENT_MERGER), {CONFIG_FILE: cfg.model_dump_json(by_alias=True)}
    )


def merge_job(o: Owner, spec: FineTuneJobSpec) -> Obj:
    name = merge_job_name(o.name)
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(o.name, spec),
        "containers": [
            {
                "name": MERGER_CONTAINER,
                "image": spec.images.merger or PUBLIC_IMAGES.merger,
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
    return one_pod_job(o, name, COMPONENT_MERGER, spec, locked_down(pod_spec, api_access=False), MERGE_BACKOFF_LIMIT)


def merge_objects(o: Owner, spec: FineTuneJobSpec, step: int | None = None) -> list[Obj]:
    """The merge's ConfigMap and Job; `step`: the checkpoint step to export (None: per spec.checkpoint.select)."""
    return [merge_config_map(o, spec, step), merge_job(o, spec)]


__all__ = ["MERGER_CONTAINER", "merge_objects"]
