"""A ServingDeployment's children: informers keep them in memory (grouped by the owner's name, which their
`tpuforge.dev/servingdeployment` label holds), and `apply` brings one to what the plan asks through the async
API. Each informer keeps a small view of what the decisions read, so that a change of anything else (a
resourceVersion, managed fields, a PVC binding) asks for no reconcile.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge.api.constants import LABEL_SERVING, SERVING_KIND
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.kube import async_client as kube_async
from tpuforge.kube import client as kube_client
from tpuforge.manifests import serving as manifests
from tpuforge.manifests.common import LABEL_OWNER_UID

Obj = dict[str, Any]
Key = tuple[str, str]  # namespace, the owner's name

ANNOTATION_SPEC_HASH = "tpuforge.dev/spec-hash"
CHILD_SELECTOR = f"{LABEL_SERVING},{LABEL_OWNER_UID}"


class ChildTerminating(Exception):
    """A child's name is taken by an object on its way out (a same-named predecessor's): ours is made once
    that one is gone. An expected wait, not an error: the status says so."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name} is being deleted")
        self.kind, self.name = kind, name


def spec_hash(obj: Obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def owner_key(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVING)
    return (meta.get("namespace", ""), name) if name else None


def _meta(obj: Mapping[str, Any], annotations: Sequence[str]) -> Obj:
    meta = obj.get("metadata") or {}
    kept = meta.get("annotations") or {}
    out: Obj = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "annotations": {a: kept[a] for a in annotations if a in kept},
        "labels": {LABEL_OWNER_UID: (meta.get("labels") or {}).get(LABEL_OWNER_UID, "")},
    }
    if meta.get("deletionTimestamp"):
        out["deletionTimestamp"] = meta["deletionTimestamp"]
    if "generation" in meta:
        out["generation"] = meta["generation"]
    return out


def child_view(obj: Mapping[str, Any]) -> Obj:
    """A Service, claim or scrape configuration: whether it is ours as the plan last built it, and whether it
    is on its way out."""
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _meta(obj, [ANNOTATION_SPEC_HASH]),
    }


def deployment_view(obj: Mapping[str, Any]) -> Obj:
    """What rollout reads of the Deployment: its generation and revision, strategy, the model its pod
    template was built for, and its status."""
    spec = obj.get("spec") or {}
    template_meta = (spec.get("template") or {}).get("metadata") or {}
    return {
        **child_view(obj),
        "metadata": _meta(obj, [ANNOTATION_SPEC_HASH, "deployment.kubernetes.io/revision"]),
        "spec": {
            "replicas": spec.get("replicas"),
            "strategy": spec.get("strategy") or {},
            "template": {"metadata": {"annotations": template_meta.get("annotations") or {}}},
        },
        "status": obj.get("status") or {},
    }


def pod_view(obj: Mapping[str, Any]) -> Obj:
    """What rollout and the adapters read of a serving pod: its model, node, status and IP."""
    return {
        "metadata": _meta(obj, [manifests.ANNOTATION_MODEL_URI]),
        "spec": {"nodeName": (obj.get("spec") or {}).get("nodeName")},
        "status": obj.get("status") or {},
    }


class Children:
    """The children in memory, and `apply` over the async API."""

    def __init__(
        self,
        namespaces: Sequence[str] | None,
        on_change: Callable[[Key, Obj | None, Obj | None], None],
        on_served: Callable[[], None],
    ):
        def common(view: Callable[[Obj], Obj]) -> dict[str, Any]:
            return {
                "label_selector": CHILD_SELECTOR,
                "namespaces": namespaces,
                "view": view,
                "owner": owner_key,
                "on_change": on_change,
            }

        # One informer per kind, each named with constants (RBAC: list and watch on it).
        self.deployments: Informer[Key, Obj] = Informer(
            api_version="apps/v1", kind="Deployment", **common(deployment_view)
        )
        self.pods: Informer[Key, Obj] = Informer(api_version="v1", kind="Pod", **common(pod_view))
        self.services: Informer[Key, Obj] = Informer(api_version="v1", kind="Service", **common(child_view))
        self.claims: Informer[Key, Obj] = Informer(api_version="v1", kind="PersistentVolumeClaim", **common(child_view))
        self.budgets: Informer[Key, Obj] = Informer(
            api_version="policy/v1", kind="PodDisruptionBudget", **common(child_view)
        )
        # Scrape configurations, where their CRD is installed; when one is installed later, `on_served`.
        self.pod_monitorings: Informer[Key, Obj] = Informer(
            api_version="monitoring.googleapis.com/v1", kind="PodMonitoring", on_served=on_served, **common(child_view)
        )
        self.service_monitors: Informer[Key, Obj] = Informer(
            api_version="monitoring.coreos.com/v1", kind="ServiceMonitor", on_served=on_served, **common(child_view)
        )
        self._by_kind = {
            "Deployment": self.deployments,
            "Service": self.services,
            "PersistentVolumeClaim": self.claims,
            "PodDisruptionBudget": self.budgets,
            "PodMonitoring": self.pod_monitorings,
            "ServiceMonitor": self.service_monitors,
        }

    @property
    def informers(self) -> tuple[Informer[Key, Obj], ...]:
        return (*self._by_kind.values(), self.pods)

    def get(self, key: Key, kind: str, name: str) -> Obj | None:
        """The child of that kind and name, as its informer last saw it (a predecessor's too)."""
        return next((v for v in self._by_kind[kind].get(key) if v["metadata"]["name"] == name), None)

    def none(self, key: Key) -> bool:
        """Whether no child of that owner's name, of any kind, is in memory (a new object's, or its
        predecessor's)."""
        return not any(informer.get(key) for informer in self.informers)

    def served(self, kind: str) -> bool:
        """Whether the apiserver serves a kind (a monitoring CRD is installed)."""
        return self._by_kind[kind].served

    def serving_pods(self, key: Key, owner_uid: str) -> list[Obj]:
        """This object's pods (not a same-named predecessor's, which may still be going away)."""
        return [p for p in self.pods.get(key) if p["metadata"]["labels"][LABEL_OWNER_UID] == owner_uid]

    async def apply(self, kube_api: kube_async.AsyncApi, key: Key, desired: Obj) -> Obj:
        """Create `desired`, or bring the existing object to it. The desired object's hash, kept in an
        annotation, makes an unchanged object cost no call. Fields the server owns are kept: a Service's
        cluster IP, a PVC's (immutable) spec. Returns the object (as its informer sees it when unchanged)."""
        h = spec_hash(desired)
        desired = copy.deepcopy(desired)
        meta = desired["metadata"]
        meta.setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = h
        known = self.get(key, desired["kind"], meta["name"])
        if known is None:
            try:
                return await kube_api.create(desired)
            except ApiException as e:
                if not kube_client.is_already_exists(e):
                    raise
        elif (
            not known["metadata"].get("deletionTimestamp")
            and known["metadata"]["annotations"].get(ANNOTATION_SPEC_HASH) == h
        ):
            return known
        existing = await kube_api.get(desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"])
        if existing is None:  # gone since the informer saw it (a predecessor's, deleted)
            return await kube_api.create(desired)
        return await self._update(kube_api, desired, existing, h)

    @staticmethod
    async def _update(kube_api: kube_async.AsyncApi, desired: Obj, existing: Obj, h: str) -> Obj:
        meta = existing["metadata"]
        if meta.get("deletionTimestamp"):
            raise ChildTerminating(desired["kind"], desired["metadata"]["name"])
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
        return await kube_api.request("PUT", path, body=existing)
