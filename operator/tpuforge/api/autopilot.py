"""The cluster profiles the operator renders for, and what a spec may not ask for on GKE Autopilot.

`standard` (the default): a GKE Standard cluster whose TPU node pools the platform team creates. `autopilot`: a GKE
Autopilot cluster, where GKE creates the nodes from each pod's own spec. There the operator renders every pod the
way Autopilot admits it (tpuforge.manifests.autopilot) and refuses, before anything is created, the spec fields
that only make sense with node pools of one's own: a node selector naming a node pool (Autopilot names its pools
itself, so such a pod would never be scheduled).

GKE's pages behind the rules: "Deploy TPU workloads in GKE Autopilot" (the TPU is chosen by the
cloud.google.com/gke-tpu-accelerator and -topology selectors and the chips a pod requests; Spot, specific
reservations and flex-start are supported), "Resource requests in Autopilot", "Autopilot security"
(privileged pods, host namespaces and added capabilities such as NET_RAW are refused) and "Consuming reserved
zonal resources" (Autopilot consumes specific reservations only)."""

from __future__ import annotations

from typing import Literal

from tpuforge.api.constants import GKE_NODEPOOL
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.api.serving import ServingDeploymentSpec

ClusterProfile = Literal["standard", "autopilot"]
STANDARD: ClusterProfile = "standard"
AUTOPILOT: ClusterProfile = "autopilot"
CLUSTER_PROFILES: tuple[ClusterProfile, ...] = (STANDARD, AUTOPILOT)
# Node labels a pod may not select on Autopilot: they name node pools, which Autopilot creates and names itself.
NODE_POOL_LABELS = (GKE_NODEPOOL,)


def _node_pool_errors(field: str, selector: dict[str, str]) -> list[tuple[str, str]]:
    return [
        (
            f"{field}[{key}]",
            "the cluster runs GKE Autopilot (the operator's --cluster-profile autopilot), which creates and names "
            "its node pools itself: no node carries a pool name you chose, so the pod would never be scheduled. "
            "Remove the key; the TPU slice, spot and reservation settings already pick the nodes",
        )
        for key in selector
        if key in NODE_POOL_LABELS
    ]


def finetune_autopilot_errors(spec: FineTuneJobSpec) -> list[tuple[str, str]]:
    """(field, message) for each setting of a FineTuneJob spec that cannot work on GKE Autopilot."""
    errors = _node_pool_errors("spec.tpu.scheduling.nodeSelector", spec.tpu.scheduling.node_selector)
    errors += _node_pool_errors("spec.preflight.nodeSelector", spec.preflight.node_selector)
    errors += _node_pool_errors("spec.merge.nodeSelector", spec.merge.node_selector)
    if spec.evaluation is not None:
        errors += _node_pool_errors("spec.evaluation.nodeSelector", spec.evaluation.node_selector)
        errors += _node_pool_errors("spec.evaluation.scheduling.nodeSelector", spec.evaluation.scheduling.node_selector)
    return errors


def serving_autopilot_errors(spec: ServingDeploymentSpec) -> list[tuple[str, str]]:
    """(field, message) for each setting of a ServingDeployment spec that cannot work on GKE Autopilot."""
    return _node_pool_errors("spec.tpu.scheduling.nodeSelector", spec.tpu.scheduling.node_selector)


__all__ = [
    "AUTOPILOT",
    "CLUSTER_PROFILES",
    "NODE_POOL_LABELS",
    "STANDARD",
    "ClusterProfile",
    "finetune_autopilot_errors",
    "serving_autopilot_errors",
]
