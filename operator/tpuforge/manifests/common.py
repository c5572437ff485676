"""Building blocks shared by every kind's children: names, labels, owner references, and the small objects
(ConfigMap, ServiceAccount, Role, RoleBinding) that both controllers create. Pure: no I/O, no clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, overload

from tpuforge.api.catalog import TpuSlice
from tpuforge.api.constants import (
    GKE_SPOT,
    GKE_SPOT_GRACE_SECONDS,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    GROUP,
    INSTANCE_TYPE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    TPU_RESOURCE,
)
from tpuforge.api.scheduling import PodScheduling

Obj = dict[str, Any]

# Every child carries this managed-by value: the operator watches its children with a server-side label
# selector on it, so it never streams the rest of the cluster's pods.
MANAGED_BY = "tpuforge"
PART_OF = "tpuforge"
# The owner's uid on every child (pods included, which are owned by their Job and not by the custom
# object): children are grouped by it, so a recreated object with the same name never adopts the
# children its predecessor left behind while they are garbage-collected.
LABEL_OWNER_UID = f"{GROUP}/owner-uid"

MAX_NAME = 63  # a DNS label: Job names end up in the pods' job-name label, which allows 63 characters
_HASH_LEN = 8


@dataclass(frozen=True)
class Owner:
    """The custom object that owns a child."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    def reference(self) -> Obj:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def child_name(owner_name: str, suffix: str, limit: int = MAX_NAME) -> str:
    """`<owner>-<suffix>`, shortened with a hash of the owner's name when that exceeds `limit` characters, so
    two long names never collide and the same owner always gets the same name."""
    full = f"{owner_name}-{suffix}"
    if len(full) <= limit:
        return full
    keep = limit - len(suffix) - _HASH_LEN - 2
    return f"{owner_name[:keep].rstrip('-.')}-{_digest(owner_name)}-{suffix}"


def label_value(text: str) -> str:
    """A label value (at most 63 characters) that stands for `text`: itself when it fits."""
    if len(text) <= MAX_NAME:
        return text
    return f"{text[: MAX_NAME - _HASH_LEN - 1].rstrip('-._')}-{_digest(text)}"


def standard_labels(owner: Owner, kind_label: str, app: str, component: str) -> dict[str, str]:
    """The app.kubernetes.io/* labels, the kind's own label (its value names the owner) and the owner uid."""
    instance = label_value(owner.name)
    return {
        LABEL_NAME: app,
        LABEL_INSTANCE: instance,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: PART_OF,
        kind_label: instance,
        LABEL_OWNER_UID: owner.uid,
    }


def metadata(owner: Owner, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def config_map(owner: Owner, name: str, labels: dict[str, str], data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name, labels),
        "data": dict(data),
    }


def service_account(owner: Owner, name: str, labels: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(owner, name, labels)}


def own_status_role(owner: Owner, name: str, labels: dict[str, str], plural: str, verbs: tuple[str, ...]) -> Obj:
    """A Role that grants `verbs` on the status of the owner object only (RBAC resourceNames)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(owner, name, labels),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{plural}/status"],
                "resourceNames": [owner.name],
                "verbs": list(verbs),
            }
        ],
    }


def role_binding(owner: Owner, name: str, labels: dict[str, str], role: str, service_account_name: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(owner, name, labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name, "namespace": owner.namespace}],
    }


def tpu_scheduling(slc: TpuSlice, spot: bool = False, spot_grace: int | None = None) -> Obj:
    """The pod spec fields that put a pod on a node of `slc`'s GKE TPU node pool: its accelerator and
    topology labels, the TPU taint's toleration, and on Spot capacity the Spot label and taint, and the grace
    period a reclaimed Spot VM actually gives (`spot_grace`, else GKE's GKE_SPOT_GRACE_SECONDS). A
    single-host slice also names its machine type: GKE builds a v6e 2x4 topology both as one ct6e-standard-8t
    VM and as two ct6e-standard-4t VMs, and a pod asking for 8 chips never fits the latter."""
    selector = {GKE_TPU_ACCELERATOR: slc.accelerator, GKE_TPU_TOPOLOGY: slc.topology}
    if slc.hosts == 1:
        selector[INSTANCE_TYPE] = slc.machine_type
    tolerations: list[Obj] = [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    out: Obj = {"nodeSelector": selector, "tolerations": tolerations}
    if spot:
        selector[GKE_SPOT] = "true"
        tolerations.append({"key": GKE_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
        out["terminationGracePeriodSeconds"] = grace_seconds(spot, spot_grace, None)
    return out


@overload
def grace_seconds(spot: bool, spot_grace: int | None, off_spot: int) -> int: ...
@overload
def grace_seconds(spot: bool, spot_grace: int | None, off_spot: None) -> int | None: ...
def grace_seconds(spot: bool, spot_grace: int | None, off_spot: int | None) -> int | None:
    """The one decision of a TPU pod's terminationGracePeriodSeconds: on Spot, what a reclaim actually gives
    (`spot_grace`, else GKE's GKE_SPOT_GRACE_SECONDS), whatever the pod would ask; off Spot, `off_spot` (None:
    Kubernetes' default)."""
    return (spot_grace or GKE_SPOT_GRACE_SECONDS) if spot else off_spot


def with_scheduling(pod_spec: Obj, sched: PodScheduling) -> Obj:
    """`pod_spec` with the spec's scheduling settings added to what the operator set: node labels (validation
    refused any that contradict the operator's), tolerations after the operator's, and the PriorityClass.
    The annotations go on the pod template's metadata (`pod_annotations`). Returns a copy."""
    out = dict(pod_spec)
    selector = sched.selector()
    if selector:
        out["nodeSelector"] = {**(out.get("nodeSelector") or {}), **selector}
    tolerations = sched.pod_tolerations()
    if tolerations:
        out["tolerations"] = [*(out.get("tolerations") or []), *tolerations]
    if sched.priority_class_name:
        out["priorityClassName"] = sched.priority_class_name
    return out


def pod_annotations(own: dict[str, str], sched: PodScheduling) -> dict[str, str]:
    """The pod template's annotations: the spec's, then the operator's own (which win: validation refuses the
    operator's prefix, and this keeps e.g. the serving pods' scrape annotations whatever the spec says)."""
    return {**sched.annotations, **own}


def tpu_resources(slc: TpuSlice, requests: dict[str, str]) -> Obj:
    """Every TPU chip of one host of `slc` (the pod owns its TPU VM), and `requests` (CPU and memory, from
    tpuforge.api.resources). No CPU or memory limits: see that module."""
    chips = str(slc.chips_per_host)
    return {"requests": {**requests, TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}}


# --- Pod security ------------------------------------------------------------------------------------------
# The uid and gid every tpuforge container runs as. The images (images/*.Dockerfile) create this user; the
# vLLM image does not need to, since nothing in it looks the user up. Above 10000, so it never shares a uid
# with a user of the node.
POD_UID = 65532
# The one writable place besides the pod's own volumes: the root filesystem is read-only, and Python,
# libtpu (its logs), vLLM (its IPC sockets, compile caches) and the HuggingFace libraries want a /tmp and a
# home with cache directories.
SCRATCH_VOLUME = "tmp"
SCRATCH_DIR = "/tmp"
SCRATCH_ENV = {
    "HOME": SCRATCH_DIR,
    "XDG_CACHE_HOME": f"{SCRATCH_DIR}/.cache",
    "XDG_CONFIG_HOME": f"{SCRATCH_DIR}/.config",
    "HF_HOME": f"{SCRATCH_DIR}/.cache/huggingface",
}


def _locked_container(container: Obj, root: bool) -> Obj:
    out = dict(container)
    out["securityContext"] = {
        "runAsNonRoot": not root,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if root:
        # The device files' owner may open them without any capability: root, and nothing more.
        out["securityContext"] |= {"runAsUser": 0, "runAsGroup": 0}
    own = {e["name"] for e in out.get("env") or []}
    out["env"] = [*(out.get("env") or []), *({"name": k, "value": v} for k, v in SCRATCH_ENV.items() if k not in own)]
    out["volumeMounts"] = [*(out.get("volumeMounts") or []), {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}]
    return out


# The capabilities of the one container that starts as root to run untrusted code under other uids (the
# evaluation's checker, tpuforge_workloads.evaluate.check): becoming another uid, and nothing else.
UID_SWITCH_CAPABILITIES = ["SETUID", "SETGID"]


def switches_uid(container: Obj) -> Obj:
    """`container` (already locked down) as the checker runs: root with CAP_SETUID and CAP_SETGID only, so
    that each sample runs under a uid of its own that cannot touch the runner, the evaluation's files or
    another sample. No privilege escalation, read-only root filesystem, no other capability. Returns a copy."""
    out = dict(container)
    out["securityContext"] = {
        **container["securityContext"],
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "capabilities": {"drop": ["ALL"], "add": list(UID_SWITCH_CAPABILITIES)},
    }
    return out


def locked_down(pod_spec: Obj, *, api_access: bool, root_containers: frozenset[str] = frozenset()) -> Obj:
    """`pod_spec` as every tpuforge pod runs: as POD_UID (never root), no privilege escalation, no Linux
    capabilities, the runtime's default seccomp profile, a read-only root filesystem with a scratch emptyDir
    at /tmp that holds HOME and the caches, and fsGroup so that the pod's volumes are writable by that uid.
    TPU access needs no privileged mode on GKE 1.28 and later. `api_access`: whether the pod talks to the
    Kubernetes API (the trainer reports progress); other pods get no ServiceAccount token. `root_containers`:
    the TPU containers that run as root (spec.tpu.runAsRoot, for nodes whose TPU device files only root may
    open), still unprivileged, without capabilities or privilege escalation. Returns a copy."""
    out = dict(pod_spec)
    out["automountServiceAccountToken"] = api_access
    out["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": POD_UID,
        "runAsGroup": POD_UID,
        "fsGroup": POD_UID,
        # A large XLA cache volume is not walked on every start once its owner is right.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for key in ("initContainers", "containers"):
        if key in out:
            out[key] = [_locked_container(c, c["name"] in root_containers) for c in out[key]]
    out["volumes"] = [*(out.get("volumes") or []), {"name": SCRATCH_VOLUME, "emptyDir": {}}]
    return out


def image_pull_secrets(names: list[str]) -> Obj:
    """The pod spec fields that give a pod its image pull Secrets (the operator's and the spec's, already merged
    by the controller); nothing when there are none."""
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}
