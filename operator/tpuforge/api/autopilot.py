"""The cluster profiles the operator renders for, and what a spec may not ask for on GKE Autopilot.

`standard` (the default): a GKE Standard cluster whose TPU node pools the platform team creates. `autopilot`: a GKE
Autopilot cluster, where GKE creates the nodes from each pod's own spec. There the operator renders every pod the
way Autopilot admits it (tpuforge.manifests.autopilot) and refuses, before anything is created, the spec fields
that only make sense with node pools of one's own: a node selector naming a node pool (Autopilot names its pools
itself, so such a pod would never be scheduled), and a Spot grace longer than Autopilot gives a Spot Pod.

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
# The most a Spot Pod is given on preemption on Autopilot ("Run fault-tolerant workloads at lower costs in Spot
# Pods"): a longer terminationGracePeriodSeconds is not honoured then, so the trainer's checkpoint would be held
# against time it never gets.
AUTOPILOT_SPOT_GRACE_SECONDS = 25


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


def _spot_grace_errors(spot: bool, grace: int | None) -> list[tuple[str, str]]:
    if not spot or grace is None or grace <= AUTOPILOT_SPOT_GRACE_SECONDS:
        return []
    return [
        (
            "spec.tpu.spotGraceSeconds",
            f"{grace} s is more than GKE Autopilot gives a Spot Pod on preemption "
            f"({AUTOPILOT_SPOT_GRACE_SECONDS} s): set at most {AUTOPILOT_SPOT_GRACE_SECONDS}, or leave it unset",
        )
    ]


def finetune_autopilot_errors(spec: FineTuneJobSpec) -> list[tuple[str, str]]:
    """(field, message) for each setting of a FineTuneJob spec that cannot work on GKE Autopilot."""
    errors = _spot_grace_errors(spec.tpu.spot, spec.tpu.spot_grace_seconds)
    errors += _node_pool_errors("spec.tpu.scheduling.nodeSelector", spec.tpu.scheduling.node_selector)
    errors += _node_pool_errors("spec.preflight.nodeSelector", spec.preflight.node_selector)
    errors += _node_pool_errors("spec.merge.nodeSelector", spec.merge.node_selector)
    if spec.evaluation is not None:
        errors += _node_pool_errors("spec.evaluation.nodeSelector", spec.evaluation.node_selector)
        errors += _node_pool_errors("spec.evaluation.scheduling.nodeSelector", spec.evaluation.scheduling.node_selector)
    return errors


def serving_autopilot_errors(spec: ServingDeploymentSpec) -> list[tuple[str, str]]:
    """(field, message) for each setting of a ServingDeployment spec that cannot work on GKE Autopilot."""
    errors = _spot_grace_errors(spec.tpu.spot, spec.tpu.spot_grace_seconds)
    return errors + _node_pool_errors("spec.tpu.scheduling.nodeSelector", spec.tpu.scheduling.node_selector)


__all__ = [
    "AUTOPILOT",
    "AUTOPILOT_SPOT_GRACE_SECONDS",
    "CLUSTER_PROFILES",
    "NODE_POOL_LABELS",
    "STANDARD",
    "ClusterProfile",
    "finetune_autopilot_errors",
    "serving_autopilot_errors",
]
