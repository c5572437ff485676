"""The sandbox's API calls, on plain JSON (camelCase dicts, as the apiserver sends them): the typed client's
methods with dict bodies and unparsed responses."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("tpuforge_sandbox.agent")

Obj = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_api_client(kubeconfig: Path) -> client.ApiClient:
    """An ApiClient from this kubeconfig file only (never $KUBECONFIG)."""
    return cast(client.ApiClient, config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # Typed as Any: bodies are dicts and responses raw JSON, not the client's model classes.
        self.core: Any = client.CoreV1Api(api)
        self.ext: Any = client.ApiextensionsV1Api(api)
        self.batch: Any = client.BatchV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.admission: Any = client.AdmissionregistrationV1Api(api)

    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    # -- pods ------------------------------------------------------------------------------------------
    def list_pods(self) -> tuple[list[Obj], str]:
        data = self._json(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return data["items"], data["metadata"].get("resourceVersion", "")

    def watch_pods(self, resource_version: str, timeout: int) -> Iterator[bytes]:
        resp = self.core.list_pod_for_all_namespaces(
            watch=True,
            resource_version=resource_version or None,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=timeout + 10,
        )
        try:
            yield from resp
        finally:
            resp.release_conn()

    def patch_pod_status(self, ns: str, name: str, status: Obj) -> bool:
        """False when the pod is gone."""
        try:
            self.core.patch_namespaced_pod_status(
                name, ns, {"status": status}, _content_type=STRATEGIC, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def bind(self, ns: str, name: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        # The response is a Status, which the typed client cannot read as a V1Binding.
        self.core.create_namespaced_pod_binding(name, ns, body, _preload_content=False)

    def delete_pod_now(self, ns: str, name: str, uid: str) -> None:
        """What kubelet does once a terminating pod's containers are gone: delete with grace 0, only this
        incarnation (a new pod of the same name must survive)."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self.core.delete_namespaced_pod(name, ns, body=body, _preload_content=False)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def service_account_token(
        self, ns: str, sa: str, pod: Obj, audience: str | None = None, expiration: int | None = None
    ) -> str:
        """A token bound to the pod (invalid once the pod is deleted), from the TokenRequest API."""
        spec: Obj = {
            "audiences": [audience] if audience else [],
            "expirationSeconds": expiration or 24 * 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
        resp = self.core.create_namespaced_service_account_token(sa, ns, {"spec": spec}, _preload_content=False)
        return str(self._json(resp)["status"]["token"])

    def read_service_account(self, ns: str, name: str) -> Obj | None:
        try:
            return cast(Obj, self._json(self.core.read_namespaced_service_account(name, ns, _preload_content=False)))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def read_pvc(self, ns: str, name: str) -> Obj | None:
        try:
            return cast(
                Obj, self._json(self.core.read_namespaced_persistent_volume_claim(name, ns, _preload_content=False))
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def key_data(self, ns: str, kind: str, name: str) -> dict[str, bytes] | None:
        """A ConfigMap's or Secret's keys as bytes; None when it does not exist."""
        try:
            if kind == "ConfigMap":
                obj = self._json(self.core.read_namespaced_config_map(name, ns, _preload_content=False))
                out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
                out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
                return out
            obj = self._json(self.core.read_namespaced_secret(name, ns, _preload_content=False))
            return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def event(
        self, obj: Obj, type_: str, reason: str, message: str, component: str = "kubelet", host: str | None = None
    ) -> None:
        """Best effort, like kubelet's events: a lost event is no reason to fail a pod."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        ts = now()
        body = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(ns, body, _preload_content=False)
        except ApiException as e:
            log.debug("event %s on %s/%s not recorded: %s", reason, ns, meta["name"], e.status)

    # -- nodes -----------------------------------------------------------------------------------------
    def list_nodes(self, selector: str) -> list[Obj]:
        return list(self._json(self.core.list_node(label_selector=selector, _preload_content=False))["items"])

    def ensure_node(self, manifest: Obj) -> None:
        """Create the node, or bring its labels and taints to `manifest` (a merge patch replaces the taint
        list, dropping the not-ready taint the apiserver adds to new nodes)."""
        name = manifest["metadata"]["name"]
        try:
            self.core.create_node(manifest, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
        patch = {"metadata": {"labels": manifest["metadata"]["labels"]}, "spec": {"taints": manifest["spec"]["taints"]}}
        self.core.patch_node(name, patch, _content_type=MERGE, _preload_content=False)

    def read_node(self, name: str) -> Obj | None:
        try:
            return cast(Obj, self._json(self.core.read_node(name, _preload_content=False)))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_node_status(self, name: str, status: Obj) -> None:
        self.core.patch_node_status(name, {"status": status}, _content_type=STRATEGIC, _preload_content=False)

    def patch_node(self, name: str, patch: Obj) -> None:
        self.core.patch_node(name, patch, _content_type=MERGE, _preload_content=False)

    def delete_node(self, name: str) -> None:
        try:
            self.core.delete_node(name, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def list_namespaces(self, selector: str) -> list[Obj]:
        return cast(
            list[Obj], self._json(self.core.list_namespace(label_selector=selector, _preload_content=False))["items"]
        )

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": name}}, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise

    def apply_custom_object(self, obj: Obj, plural: str) -> bool:
        """Create, or replace what is there (namespaced when the object names a namespace); True if created."""
        group, version = obj["apiVersion"].split("/")
        name, ns = obj["metadata"]["name"], obj["metadata"].get("namespace")
        where = (group, version, ns, plural) if ns else (group, version, plural)
        kind = "namespaced" if ns else "cluster"
        try:
            getattr(self.custom, f"create_{kind}_custom_object")(*where, obj)
            return True
        except ApiException as e:
            if e.status != 409:
                raise
        current = getattr(self.custom, f"get_{kind}_custom_object")(*where, name)
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        getattr(self.custom, f"replace_{kind}_custom_object")(*where, name, obj)
        return False

    def apply_webhook_configuration(self, doc: Obj) -> None:
        """Create, or replace what is there: a Mutating- or ValidatingWebhookConfiguration."""
        kind = {"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}[doc["kind"]]
        name = doc["metadata"]["name"]
        try:
            getattr(self.admission, f"create_{kind}_webhook_configuration")(doc, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
            read = getattr(self.admission, f"read_{kind}_webhook_configuration")
            current = self._json(read(name, _preload_content=False))
            doc = {**doc, "metadata": {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            getattr(self.admission, f"replace_{kind}_webhook_configuration")(name, doc, _preload_content=False)

    def server_side_apply(self, obj: Obj, plural: str) -> None:
        """Apply `obj` (any kind; `plural` its resource) server-side as the sandbox's field manager."""
        group_version = obj["apiVersion"]
        base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        ns = obj["metadata"].get("namespace")
        path = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
        headers = {"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"}
        query = [("fieldManager", "tpuforge-sandbox"), ("force", "true")]
        self._call("PATCH", f"{path}/{obj['metadata']['name']}", query, headers, obj)

    def delete(self, path: str) -> None:
        """DELETE `path` (an object's API path); gone already is fine."""
        try:
            self._call("DELETE", path, [], {"Accept": "application/json"}, None)
        except ApiException as e:
            if e.status != 404:
                raise

    def _call(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str], body: Any) -> None:
        """One request to `path` with the client's credentials; ApiException unless the answer is 2xx."""
        req = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        resp = self.api.call_api(*req)
        resp.read()  # type: ignore[no-untyped-call]
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)

    # -- CustomResourceDefinitions ---------------------------------------------------------------------------
    def apply_crd(self, crd: Obj) -> None:
        """Create, or replace what is there."""
        try:
            self.ext.create_custom_resource_definition(crd, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
            name = crd["metadata"]["name"]
            current = self._json(self.ext.read_custom_resource_definition(name, _preload_content=False))
            crd = {**crd, "metadata": {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
            self.ext.replace_custom_resource_definition(name, crd, _preload_content=False)

    def crd_established(self, name: str) -> bool:
        crd = self._json(self.ext.read_custom_resource_definition(name, _preload_content=False))
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)
