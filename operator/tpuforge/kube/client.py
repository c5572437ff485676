"""The operator's connection to the Kubernetes API: credentials, one request, a watch stream, outcomes.

`configure()` loads credentials once, from an explicit kubeconfig (never an implicit $KUBECONFIG read
at some later call), from the pod's service account in a cluster, or from the default kubeconfig for the
`tpuforge operator` command; `api_client()` is the process-wide client built from them. `request` and
`WatchStream` take the client explicitly, are synchronous and thread-safe (controllers run them in worker
threads), and raise `ApiException`; `is_conflict` / `is_not_found` / `is_already_exists` name the outcomes a
caller handles. The verbs on objects are in kube_objects, the same writes on the event loop in kube_async,
Events in kube_events.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
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
    KUEUE_WORKLOAD_KIND,
    KUEUE_WORKLOAD_PLURAL,
    SERVING_KIND,
    SERVING_PLURAL,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# Connections kept open to the apiserver, shared by every thread (the controllers' API calls, the informers'
# watches): more than are ever in use at once, so none is closed and opened again (a TLS handshake each).
POOL_SIZE = 256
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read
USER_AGENT = "tpuforge-operator"
# Retries for answers that say "try again" (429, 5xx) or a dropped connection.
RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0)
RETRY_STATUS = frozenset({0, 429, 500, 502, 503, 504})
CREDENTIALS_SECONDS = 60.0  # how long a token read from the configuration is used before reading it again

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
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Job": "jobs",
    "Deployment": "deployments",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "PodMonitoring": "podmonitorings",
    "ServiceMonitor": "servicemonitors",
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "Lease": "leases",
    FINETUNEJOB_KIND: FINETUNEJOB_PLURAL,
    SERVING_KIND: SERVING_PLURAL,
    JOBSET_KIND: JOBSET_PLURAL,
    KUEUE_WORKLOAD_KIND: KUEUE_WORKLOAD_PLURAL,
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
        raise RuntimeError("tpuforge.kube.client.configure() has not been called")
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


# The apiserver's words when an admission webhook it must call (failurePolicy Fail) does not answer.
_WEBHOOK_FAILED = re.compile(r'failed calling webhook "([^"]+)": (.*)')


def unreachable_webhook(exc: BaseException) -> tuple[str, str] | None:
    """(webhook, why) when the apiserver refused a write because it could not call that admission webhook
    (e.g. JobSet's or Kueue's, on port 9443, behind a private cluster's firewall); else None."""
    if not isinstance(exc, ApiException):
        return None
    try:
        text = str(json.loads(exc.body or "{}").get("message", ""))
    except ValueError:
        text = exc.body or ""
    found = _WEBHOOK_FAILED.search(text)
    return (found.group(1), found.group(2).strip()) if found else None


# --- Requests ---------------------------------------------------------------------------------------------


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    plural = PLURALS.get(kind)
    if plural is None:
        raise ValueError(f"tpuforge.kube.client does not know the plural of kind {kind!r}; add it to PLURALS")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class _Credentials:
    """The Authorization header of one configuration, read again at most every CREDENTIALS_SECONDS, or at
    once after the apiserver answered 401. Reading it through the configuration runs the kubeconfig
    loader's refresh hook, which sets up the whole configuration again (proxy settings from the environment
    included): about a millisecond, more than the rest of a request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cfg: k8s.Configuration | None = None
        self._header: dict[str, str] = {}
        self._read_at = -math.inf

    def header(self, cfg: k8s.Configuration) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            if cfg is self._cfg and now - self._read_at < CREDENTIALS_SECONDS:
                return self._header
        header: dict[str, str] = {}
        token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        if token:
            header["Authorization"] = token
        elif cfg.username and cfg.password:
            header.update(urllib3.util.make_headers(basic_auth=f"{cfg.username}:{cfg.password}"))
        with self._lock:
            self._cfg, self._header, self._read_at = cfg, header, now
        return header

    def expire(self) -> None:
        with self._lock:
            self._read_at = -math.inf


credentials = _Credentials()  # every request's, kube_async's too


class Retries:
    """One call's retry decisions, for `request` and kube_async's: a 401 re-reads the token once and tries again
    at once (it may have expired since it was read); the statuses in RETRY_STATUS (and a lost connection, 0)
    are tried again after each of RETRY_DELAYS in turn, each wait logged (debug) with the call's method and
    path; anything else is the caller's to raise."""

    def __init__(self, method: str, path: str) -> None:
        self._call = (method, path)
        self._delays = iter(RETRY_DELAYS)
        self._refreshed = False

    def after(self, exc: ApiException) -> float | None:
        """Seconds to wait before trying again (0: at once), or None: give up and raise `exc`."""
        if exc.status == 401 and not self._refreshed:
            credentials.expire()
            self._refreshed = True
            return 0.0
        if exc.status not in RETRY_STATUS:
            return None
        delay = next(self._delays, None)
        if delay:
            log.debug("%s %s: %s; retrying in %.1fs", *self._call, exc.status, delay)
        return delay


def request_headers(cfg: k8s.Configuration, content_type: str | None) -> dict[str, str]:
    """The request's headers with its credentials; `content_type` when it has a body."""
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **credentials.header(cfg)}
    if content_type:
        headers["Content-Type"] = content_type
    return headers


def _send(
    api: k8s.ApiClient, method: str, path: str, body: Any, content_type: str, timeout: tuple[float, float], stream: bool
) -> urllib3.BaseHTTPResponse:
    """One HTTP exchange on the client's connection pool."""
    cfg = api.configuration
    data = None if body is None else json.dumps(body).encode()
    try:
        return api.rest_client.pool_manager.request(
            method,
            f"{cfg.host}{path}",
            body=data,
            headers=request_headers(cfg, content_type if data is not None else None),
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
    retries = Retries(method, path)
    while True:
        try:
            resp = _send(api, method, path, body, content_type, REQUEST_TIMEOUT, stream=False)
            if not 200 <= resp.status <= 299:
                raise _failure(resp)
            return json.loads(resp.data) if resp.data else {}
        except ApiException as exc:
            delay = retries.after(exc)
            if delay is None:
                raise
            if delay:
                time.sleep(delay)


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
            if resp.status == 401:  # the informer starts it again: with the credentials read again
                credentials.expire()
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


__all__ = [
    "ApiException",
    "WatchStream",
    "api_client",
    "configuration",
    "configure",
    "is_already_exists",
    "is_conflict",
    "is_not_found",
    "request",
    "resource_path",
]
