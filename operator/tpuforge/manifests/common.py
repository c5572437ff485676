"""Building blocks shared by every kind's children: names, labels, owner references, and the small objects
(ConfigMap, ServiceAccount, Role, RoleBinding) that both controllers create. Pure: no I/O, no clock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tpuforge.api.constants import (
    GROUP,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
)

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
