"""Where a TPU pod may land beyond its slice: one model, `PodScheduling`, used by every kind that runs pods on TPU
nodes (a FineTuneJob's spec.tpu.scheduling and spec.evaluation.scheduling, a ServingDeployment's
spec.tpu.scheduling). It reaches what the slice alone cannot: a GKE reservation, DWS flex-start capacity, a
dedicated node pool behind its own taint, and pod annotations such as GCS FUSE's.

The operator sets some node labels itself (the slice's accelerator, topology and machine type, and Spot);
`scheduling_errors` refuses a nodeSelector that contradicts them, naming the field and the fix, and
tpuforge.api.admission holds the same rules as CEL."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tpuforge.api.base import ApiModel
from tpuforge.api.catalog import TpuSlice
from tpuforge.api.constants import GKE_SPOT, GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, GROUP, INSTANCE_TYPE
from tpuforge.api.labels import LABEL_KEY_PATTERN, label_errors

# GKE's node labels for a specific reservation ("Consuming reserved zonal resources"): a pod that selects them
# lands only on nodes created from that reservation. A shared reservation, owned by another project, is selected
# by its name plus the owner's project in a label of its own (a label value cannot hold the `/` of
# projects/PROJECT/reservations/NAME).
GKE_RESERVATION_NAME = "cloud.google.com/reservation-name"
GKE_RESERVATION_PROJECT = "cloud.google.com/reservation-project"
GKE_RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
RESERVATION_LABELS = (GKE_RESERVATION_NAME, GKE_RESERVATION_PROJECT, GKE_RESERVATION_AFFINITY)
# A reservation: NAME in the cluster's project, or projects/PROJECT/reservations/NAME for a shared one.
_RFC1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
RESERVATION_PATTERN = rf"^(projects/{_RFC1035}/reservations/)?{_RFC1035}$"
# Flex-start (Dynamic Workload Scheduler) nodes carry this label; node pools with queued provisioning also taint
# their nodes with GKE_QUEUED, which flex-start pods tolerate.
GKE_FLEX_START = "cloud.google.com/gke-flex-start"
GKE_QUEUED = "cloud.google.com/gke-queued"
# Pod annotations under the operator's own prefix (the model URI a serving pod holds, ...) are its to write.
RESERVED_ANNOTATION_PREFIX = f"{GROUP}/"
# The most tolerations one spec lists: enough for any pool, and a bound the apiserver's CEL cost estimate needs.
MAX_TOLERATIONS = 16


class Toleration(ApiModel):
    """A pod toleration, as Kubernetes writes one."""

    key: str | None = Field(
        default=None,
        max_length=316,
        pattern=LABEL_KEY_PATTERN,
        description="The taint key; unset with operator Exists tolerates every taint.",
    )
    operator: Literal["Equal", "Exists"] = Field(
        default="Equal", description="Equal: the taint's value must be `value`; Exists: any value."
    )
    value: str | None = Field(default=None, max_length=63, description="The taint's value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect it tolerates; unset: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="NoExecute only: how long the pod stays once the taint appears."
    )

    @model_validator(mode="after")
    def _well_formed(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value; remove value or use Equal")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key; set key, or use Exists for every taint")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to effect NoExecute only; set that effect or remove it")
        return self

    def to_pod(self) -> dict[str, object]:
        return self.to_wire()


class PodScheduling(ApiModel):
    """Where the pods may run beyond their TPU slice, and what they carry for the node's add-ons. The operator
    keeps the slice's own node selector, the TPU taint's toleration and Spot's (spec.tpu.spot)."""

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pods require, added to the slice's (e.g. cloud.google.com/gke-nodepool for a "
        "dedicated pool). The slice's accelerator, topology and machine type and cloud.google.com/gke-spot are "
        "the operator's: a different value is refused (change spec.tpu.slice or spot instead).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Extra tolerations, e.g. of a dedicated pool's own taint; the TPU and Spot taints are tolerated "
        "already.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description='Pod annotations, e.g. gke-gcsfuse/volumes: "true" for the Cloud Storage FUSE sidecar. Keys '
        f"under {RESERVED_ANNOTATION_PREFIX} are the operator's.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="PriorityClass of the pods (Kueue also orders and preempts workloads by it).",
    )
    reservation: str | None = Field(
        default=None,
        max_length=253,
        pattern=RESERVATION_PATTERN,
        description="Consume this GKE reservation (a specific one: its name, or projects/PROJECT/reservations/NAME "
        "for one shared from another project): selects cloud.google.com/reservation-name NAME, "
        "reservation-project PROJECT for a shared one, and reservation-affinity specific. Not with spot or "
        "flexStart.",
    )
    flex_start: bool = Field(
        default=False,
        description="Run on flex-start (Dynamic Workload Scheduler) capacity: selects "
        "cloud.google.com/gke-flex-start and tolerates the queued-provisioning taint. Not with spot or "
        "reservation. With queued provisioning, Kueue's ProvisioningRequest admission check obtains the nodes "
        "(docs/platform-team.md, DWS flex-start).",
    )

    @model_validator(mode="after")
    def _one_capacity(self) -> PodScheduling:
        if self.reservation and self.flex_start:
            raise ValueError("reservation and flexStart are different kinds of capacity; set one of them")
        return self

    def reservation_labels(self) -> dict[str, str]:
        """GKE's node labels for spec.reservation: its name, its owner's project for a shared one, and affinity."""
        if not self.reservation:
            return {}
        project, _, name = self.reservation.removeprefix("projects/").rpartition("/reservations/")
        out = {GKE_RESERVATION_NAME: name}
        if project:
            out[GKE_RESERVATION_PROJECT] = project
        return out | {GKE_RESERVATION_AFFINITY: "specific"}

    def selector(self) -> dict[str, str]:
        """The node labels these settings require, the reservation's and flex-start's included."""
        out = dict(self.node_selector) | self.reservation_labels()
        if self.flex_start:
            out[GKE_FLEX_START] = "true"
        return out

    def pod_tolerations(self) -> list[dict[str, object]]:
        out = [t.to_pod() for t in self.tolerations]
        if self.flex_start:
            out.append({"key": GKE_QUEUED, "operator": "Exists", "effect": "NoSchedule"})
        return out


def owned_labels(slc: TpuSlice | None, spot: bool) -> dict[str, str]:
    """The node labels the operator puts in a TPU pod's selector (tpuforge.manifests.common.tpu_scheduling)."""
    if slc is None:
        return {}
    out = {GKE_TPU_ACCELERATOR: slc.accelerator, GKE_TPU_TOPOLOGY: slc.topology}
    if slc.hosts == 1:
        out[INSTANCE_TYPE] = slc.machine_type
    if spot:
        out[GKE_SPOT] = "true"
    return out


def scheduling_errors(
    field: str, sched: PodScheduling, slc: TpuSlice | None, spot: bool, slice_field: str, spot_field: str | None
) -> list[tuple[str, str]]:
    """(field, message) for each setting of `sched` (at `field`) that contradicts what the operator sets for the
    pods: the slice's node labels (`slc`, from `slice_field`), Spot (`spot`, from `spot_field`; None where the
    pods have no Spot setting), the annotations it writes; and Spot with a reservation or flex-start."""
    errors: list[tuple[str, str]] = []
    owned = owned_labels(slc, spot)
    where = f"{slice_field} {slc.id}" if slc is not None else slice_field
    errors += label_errors(f"{field}.nodeSelector", sched.node_selector)
    errors += [(f"{field}.reservation", msg) for _, msg in label_errors("", sched.reservation_labels())]
    for key, value in sched.node_selector.items():
        at = f"{field}.nodeSelector[{key}]"
        if key == GKE_SPOT and spot_field is not None:
            if value != "true":
                errors.append((at, f"remove it and set {spot_field} (true or false): the operator sets this label"))
            elif not spot:
                errors.append((at, f"remove it and set {spot_field}: true, which also tolerates the Spot taint"))
            continue
        if key in RESERVATION_LABELS:
            errors.append((at, f"use {field}.reservation, which sets the reservation labels"))
            continue
        if key == GKE_FLEX_START:
            errors.append((at, f"use {field}.flexStart: true, which also tolerates the queued-provisioning taint"))
            continue
        if key in owned and owned[key] != value:
            errors.append(
                (
                    at,
                    f"{value!r} contradicts {where}, whose nodes carry {owned[key]!r}: remove the key (the operator "
                    f"sets it from {slice_field}) or change {slice_field}",
                )
            )
    for key in sched.annotations:
        if key.startswith(RESERVED_ANNOTATION_PREFIX):
            errors.append(
                (
                    f"{field}.annotations[{key}]",
                    f"keys under {RESERVED_ANNOTATION_PREFIX} are the operator's; use another prefix",
                )
            )
    if spot and spot_field is not None:
        if sched.reservation:
            errors.append(
                (f"{field}.reservation", f"Spot VMs do not consume reservations: remove it or set {spot_field}: false")
            )
        if sched.flex_start:
            errors.append(
                (f"{field}.flexStart", f"flex-start capacity is not Spot: remove it or set {spot_field}: false")
            )
    return errors


__all__ = [
    "GKE_FLEX_START",
    "GKE_QUEUED",
    "GKE_RESERVATION_AFFINITY",
    "GKE_RESERVATION_NAME",
    "GKE_RESERVATION_PROJECT",
    "MAX_TOLERATIONS",
    "PodScheduling",
    "Toleration",
    "owned_labels",
    "scheduling_errors",
]
