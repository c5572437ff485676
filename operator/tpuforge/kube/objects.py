"""The verbs on objects, as plain dicts, each one kube_client.request: create, get, list, delete, patch and
the status patch. They take the client explicitly and raise ApiException, but for the outcomes their names
promise: `get` answers None for an object that is not there, `create_if_absent` False for one that is,
`delete` False for one already gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tpuforge.kube.client import Obj, is_already_exists, is_not_found, request, resource_path

MERGE_PATCH = "application/merge-patch+json"


def object_ref(obj: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    """(apiVersion, kind, namespace, name) of an object."""
    meta = obj.get("metadata") or {}
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


def create(api: k8s.ApiClient, obj: Mapping[str, Any]) -> Obj:
    api_version, kind, namespace, _ = object_ref(obj)
    return request(api, "POST", resource_path(api_version, kind, namespace), body=obj)


def create_if_absent(api: k8s.ApiClient, obj: Mapping[str, Any]) -> bool:
    """Create `obj` unless an object of that name exists; True when this call created it."""
    try:
        create(api, obj)
        return True
    except ApiException as exc:
        if is_already_exists(exc):
            return False
        raise


def get(api: k8s.ApiClient, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
    try:
        return request(api, "GET", resource_path(api_version, kind, namespace, name))
    except ApiException as exc:
        if is_not_found(exc):
            return None
        raise


def list_collection(
    api: k8s.ApiClient, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
) -> tuple[list[Obj], str]:
    """Every object (in `namespace`, or all namespaces when None) and the list's resourceVersion, from which
    a watch continues without a gap."""
    query = {"labelSelector": label_selector} if label_selector else None
    out = request(api, "GET", resource_path(api_version, kind, namespace), query=query)
    return list(out.get("items") or []), str((out.get("metadata") or {}).get("resourceVersion", ""))


def list_objects(
    api: k8s.ApiClient, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
) -> list[Obj]:
    return list_collection(api, api_version, kind, namespace, label_selector)[0]


def delete_options(uid: str | None, propagation: str = "Background") -> Obj:
    """DeleteOptions: how the children go; with `uid`, only the object of that uid."""
    body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
    if uid:
        body["preconditions"] = {"uid": uid}
    return body


def delete(
    api: k8s.ApiClient,
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str,
    propagation: str = "Background",
    uid: str | None = None,
) -> bool:
    """Delete (children go with it, in the background); False when it was already gone. `uid` makes the
    call refuse a newer object of the same name."""
    try:
        request(api, "DELETE", resource_path(api_version, kind, namespace, name), body=delete_options(uid, propagation))
        return True
    except ApiException as exc:
        if is_not_found(exc):
            return False
        raise


def patch(
    api: k8s.ApiClient,
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str,
    body: Mapping[str, Any],
    subresource: str | None = None,
) -> Obj:
    """A JSON merge patch. A `metadata.resourceVersion` in `body` makes it conditional (409 if stale)."""
    path = resource_path(api_version, kind, namespace, name, subresource)
    return request(api, "PATCH", path, body=dict(body), content_type=MERGE_PATCH)


def patch_status(
    api: k8s.ApiClient,
    obj: Mapping[str, Any],
    status: Mapping[str, Any],
    resource_version: str | None = None,
) -> Obj:
    """Merge `status` into `obj`'s status subresource; with `resource_version`, only if it is unchanged."""
    api_version, kind, namespace, name = object_ref(obj)
    return patch(api, api_version, kind, namespace, name, status_body(status, resource_version), subresource="status")


def status_body(status: Mapping[str, Any], resource_version: str | None) -> Obj:
    """The merge patch of a status; conditional on `resource_version` when given."""
    body: Obj = {"status": dict(status)}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return body


__all__ = [
    "create",
    "create_if_absent",
    "delete",
    "get",
    "list_collection",
    "list_objects",
    "patch",
    "patch_status",
]
