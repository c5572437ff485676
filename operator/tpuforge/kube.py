"""The few Kubernetes API calls the controllers need, on plain dicts, over the official client.

`configure()` loads credentials once, from an explicit kubeconfig (never an implicit $KUBECONFIG read
at some later call), from the pod's service account in a cluster, or from the default kubeconfig for the
`tpuforge operator` command; `api_client()` is the process-wide client built from them. The calls take the
client explicitly, are synchronous and thread-safe (controllers run them in worker threads), and raise
`ApiException`; `is_conflict` / `is_not_found` / `is_already_exists` name the outcomes a caller handles.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tpuforge.api.constants import (
    FINETUNEJOB_KIND,
    FINETUNEJOB_PLURAL,
    JOBSET_KIND,
    JOBSET_PLURAL,
    SERVING_KIND,
    SERVING_PLURAL,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

COMPONENT = "tpuforge-operator"
MERGE_PATCH = "application/merge-patch+json"
# Connections kept open to the apiserver, shared by every thread (the controllers' API calls, the informers'
# watches): more than are ever in use at once, so none is closed and opened again (a TLS handshake each).
POOL_SIZE = 256
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read
USER_AGENT = "tpuforge-operator"
# Retries for answers that say "try again" (429, 5xx) or a dropped connection.
RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0)
_RETRY_STATUS = frozenset({0, 429, 500, 502, 503, 504})

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# Plural names of the kinds the operator touches; a CRD's plural is its own constant.
PLURALS: dict[str, str] = {
    "ConfigMap": "configmaps",
    "Event": "events",
    "Pod": "pods",
    "Secret": "secrets",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Job": "jobs",
    "Deployment": "deployments",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "PodMonitoring": "podmonitorings",
    "ServiceMonitor": "servicemonitors",
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    FINETUNEJOB_KIND: FINETUNEJOB_PLURAL,
    SERVING_KIND: SERVING_PLURAL,
    JOBSET_KIND: JOBSET_PLURAL,
}

_lock = threading.Lock()
_configuration: k8s.Configuration | None = None
_client: k8s.ApiClient | None = None


def configure(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> k8s.Configuration:
    """Load credentials: `kubeconfig` when given; else the pod's service account inside a cluster; else the
    default kubeconfig ($KUBECONFIG or ~/.kube/config), as kubectl would."""
    global _configuration, _client
    cfg = k8s.Configuration()
    if kubeconfig is not None:
        path = os.fspath(kubeconfig)
        if not os.path.exists(path):
            raise FileNotFoundError(f"kubeconfig {path} does not exist (--kubeconfig)")
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=cfg, persist_config=False
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN):
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            context=context, client_configuration=cfg, persist_config=False
        )
    cfg.connection_pool_maxsize = POOL_SIZE
    with _lock:
        old, _configuration, _client = _client, cfg, None
    if old is not None:
        old.close()  # type: ignore[no-untyped-call]
    return cfg


def configuration() -> k8s.Configuration:
    if _configuration is None:
        raise RuntimeError("tpuforge.kube.configure() has not been called")
    return _configuration


def api_client() -> k8s.ApiClient:
    """The process-wide client (thread-safe; its connection pool is shared)."""
    global _client
    with _lock:
        if _client is None:
            _client = k8s.ApiClient(configuration())
        return _client


# --- Outcomes ---------------------------------------------------------------------------------------------


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("reason", ""))
    except ValueError:
        return ""


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def is_already_exists(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409 and _reason(exc) == "AlreadyExists"


def is_conflict(exc: BaseException) -> bool:
    """A write refused because the object changed since it was read (stale resourceVersion)."""
    return isinstance(exc, ApiException) and exc.status == 409 and _reason(exc) != "AlreadyExists"


# --- Requests ---------------------------------------------------------------------------------------------


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    plural = PLURALS.get(kind)
    if plural is None:
        raise ValueError(f"tpuforge.kube does not know the plural of kind {kind!r}; add it to PLURALS")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def _send(
    api: k8s.ApiClient, method: str, path: str, body: Any, content_type: str, timeout: tuple[float, float], stream: bool
) -> urllib3.BaseHTTPResponse:
    """One HTTP exchange on the client's connection pool, with its credentials (the bearer token is read
    through the configuration, which refreshes it for service accounts and exec plugins)."""
    cfg = api.configuration
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
    token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    if token:
        headers["Authorization"] = token
    elif cfg.username and cfg.password:
        headers.update(urllib3.util.make_headers(basic_auth=f"{cfg.username}:{cfg.password}"))
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = content_type
    try:
        return api.rest_client.pool_manager.request(
            method,
            f"{cfg.host}{path}",
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            preload_content=not stream,
            retries=False,
        )
    except urllib3.exceptions.HTTPError as exc:  # no answer: connection refused, reset, timed out
        raise ApiException(status=0, reason=f"{method} {path}: {exc}") from exc


def _failure(resp: urllib3.BaseHTTPResponse) -> ApiException:
    return ApiException(status=resp.status, reason=resp.reason, body=resp.data.decode(errors="replace"))


def request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    query: Mapping[str, str] | None = None,
) -> Obj:
    """One API call; the JSON answer as a dict. Retries what the apiserver says to retry (and a lost
    connection); raises ApiException for the rest."""
    if query:
        path = f"{path}?{urlencode(query)}"
    for delay in (*RETRY_DELAYS, None):
        try:
            resp = _send(api, method, path, body, content_type, REQUEST_TIMEOUT, stream=False)
            if not 200 <= resp.status <= 299:
                raise _failure(resp)
            return json.loads(resp.data) if resp.data else {}
        except ApiException as exc:
            if exc.status not in _RETRY_STATUS or delay is None:
                raise
            log.debug("%s %s: %s; retrying in %.1fs", method, path, exc.status, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _ref(obj: Mapping[str, Any]) -> tuple[str, str, str | None, str]:
    meta = obj.get("metadata") or {}
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


def create(api: k8s.ApiClient, obj: Mapping[str, Any]) -> Obj:
    api_version, kind, namespace, _ = _ref(obj)
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


class WatchStream:
    """A watch from `resource_version`: iterate for {"type", "object"} events (BOOKMARKs included) until the
    server ends the stream after `timeout_seconds`."""

    def __init__(
        self,
        api: k8s.ApiClient,
        api_version: str,
        kind: str,
        namespace: str | None,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ):
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        path = f"{resource_path(api_version, kind, namespace)}?{urlencode(query)}"
        resp = _send(api, "GET", path, None, "", (REQUEST_TIMEOUT[0], timeout_seconds + 30.0), stream=True)
        if resp.status != 200:
            resp.read()
            raise _failure(resp)
        self._raw = resp

    def __iter__(self) -> Iterator[Obj]:
        pending = b""
        try:
            for chunk in self._raw.stream(amt=None, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            self._raw.release_conn()


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
    body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
    if uid:
        body["preconditions"] = {"uid": uid}
    try:
        request(api, "DELETE", resource_path(api_version, kind, namespace, name), body=body)
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
    api_version, kind, namespace, name = _ref(obj)
    body: Obj = {"status": dict(status)}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return patch(api, api_version, kind, namespace, name, body, subresource="status")


# --- Events -----------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


_INSTANCE = socket.gethostname()


def event_object(involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> Obj:
    """A core/v1 Event about `involved` (any object with apiVersion, kind and metadata)."""
    meta = involved.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace") or "default"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": name,
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_event(api: k8s.ApiClient, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Best effort: an Event that cannot be written is logged, never fails the caller's work."""
    try:
        create(api, event_object(involved, type_, reason, message, _now()))
    except Exception as exc:  # events are advisory; the status carries the same facts
        log.warning("could not post event %s on %s: %s", reason, (involved.get("metadata") or {}).get("name"), exc)


__all__ = [
    "ApiException",
    "WatchStream",
    "api_client",
    "configuration",
    "configure",
    "create",
    "create_if_absent",
    "delete",
    "event_object",
    "get",
    "is_already_exists",
    "is_conflict",
    "is_not_found",
    "list_collection",
    "list_objects",
    "patch",
    "patch_status",
    "post_event",
    "request",
    "resource_path",
]
