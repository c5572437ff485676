"""The ServingDeployment's children, read and written as plain dicts through tpuforge.kube.objects and
kube_client: create or bring an object to what the pure manifests say (one read when unchanged), whether a
monitoring kind is served, and the serving pods."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge.api.constants import SERVING_KIND
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests import serving as manifests

Obj = dict[str, Any]

ANNOTATION_SPEC_HASH = "tpuforge.dev/spec-hash"


class ChildTerminating(Exception):
    """A child's name is taken by an object on its way out (a same-named predecessor's): ours is made once
    that one is gone. An expected wait, not an error: the status says so."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name} is being deleted")
        self.kind, self.name = kind, name


def spec_hash(obj: Obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class Children:
    """Reads and writes the children as plain dicts, through tpuforge.kube.objects and kube_client."""

    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client

    def get(self, obj: Obj) -> Obj | None:
        meta = obj["metadata"]
        return kube_objects.get(self.api_client, obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])

    def apply(self, desired: Obj) -> Obj:
        """Create `desired`, or bring the existing object to it. The desired object's hash, kept in an
        annotation, makes an unchanged object cost one read. Fields the server owns are kept: a Service's
        cluster IP, a PVC's (immutable) spec."""
        h = spec_hash(desired)
        desired = copy.deepcopy(desired)
        desired["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = h
        existing = self.get(desired)
        if existing is not None and existing["metadata"].get("deletionTimestamp"):
            raise ChildTerminating(desired["kind"], desired["metadata"]["name"])
        if existing is None:
            try:
                return kube_objects.create(self.api_client, desired)
            except ApiException as e:
                if not kube_client.is_already_exists(e):
                    raise
                existing = self.get(desired)
                if existing is None:
                    raise
        meta = existing["metadata"]
        if (meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == h:
            return existing
        want = desired["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), **want.get("labels", {})}
        meta["annotations"] = {**(meta.get("annotations") or {}), **want["annotations"]}
        # Ours are replaced (a retained cache PVC drops its owner); anyone else's are kept.
        others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != SERVING_KIND]
        meta["ownerReferences"] = others + want.get("ownerReferences", [])
        kind = desired["kind"]
        if kind == "Service":
            existing["spec"] = {**existing.get("spec", {}), **desired["spec"]}
        elif kind != "PersistentVolumeClaim":
            existing["spec"] = desired["spec"]
        existing.pop("status", None)
        path = kube_client.resource_path(desired["apiVersion"], kind, meta["namespace"], meta["name"])
        # PUT with the resourceVersion just read: a concurrent writer makes this fail (409) and retry.
        return kube_client.request(self.api_client, "PUT", path, body=existing)

    def served(self, group_version: str, plural: str) -> bool:
        """Whether the apiserver serves a resource (a monitoring CRD is installed)."""
        try:
            resources = kube_client.request(self.api_client, "GET", f"/apis/{group_version}").get("resources") or []
        except ApiException as e:
            if kube_client.is_not_found(e) or e.status == 403:
                return False
            raise
        return any(r.get("name") == plural for r in resources)

    def serving_pods(self, namespace: str, owner_uid: str) -> list[Obj]:
        """This object's pods (not a same-named predecessor's, which may still be going away)."""
        return kube_objects.list_objects(self.api_client, "v1", "Pod", namespace, manifests.pods_selector(owner_uid))
