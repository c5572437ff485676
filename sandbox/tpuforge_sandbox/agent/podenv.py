"""A container's environment and command line as a kubelet would build them, then mapped onto the host.

There is no container filesystem, so every absolute path a pod would see inside its container (volume
mountPaths and the terminationMessagePath) is rewritten to the per-pod host directory that holds it,
wherever it starts a path in the command, args and env values: `--config=/etc/tpuforge/config.json` becomes
`--config=<state>/pods/<ns>/<pod>/volumes/config/config.json`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = Mapping[str, Any]
# (kind "ConfigMap" | "Secret", name) -> key -> bytes, or None when it does not exist
Lookup = Callable[[str, str], "dict[str, bytes] | None"]


class ConfigError(Exception):
    """What kubelet calls CreateContainerConfigError: something the pod refers to is missing. Retried."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known variables are replaced, unknown ones left as written, `$$`
    escapes a dollar."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Obj, path: str) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ip = (pod.get("status") or {}).get("podIP") or "127.0.0.1"  # the agent sets it before the pod starts
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": "127.0.0.1",
        "status.podIP": ip,
        "status.podIPs": ip,
    }
    if path in simple:
        return str(simple[path])
    m = _LABEL_REF.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ConfigError("CreateContainerConfigError", f"unsupported fieldRef fieldPath {path!r}")


def resource_value(container: Obj, ref: Obj, node_resources: Mapping[str, str]) -> str:
    """resourceFieldRef: the container's limit (or request), else the node's allocatable; no divisor."""
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    res = container.get("resources") or {}
    value = (res.get(kind) or {}).get(name) or (res.get("limits") or {}).get(name) or node_resources.get(name)
    return str(value or "0")


def _key_ref(kind: str, ref: Obj, lookup: Lookup) -> str | None:
    data = lookup(kind, ref["name"])
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return None
        raise ConfigError("CreateContainerConfigError", f'{kind.lower()} "{ref["name"]}" not found')
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError("CreateContainerConfigError", f"couldn't find key {ref['key']} in {kind} {ref['name']}")
    return data[ref["key"]].decode(errors="replace")


def container_env(pod: Obj, container: Obj, lookup: Lookup, node_resources: Mapping[str, str]) -> dict[str, str]:
    """envFrom first, then env in order, each value `$(VAR)`-expanded against what came before."""
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = src.get(key)
            if not ref:
                continue
            data = lookup(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ConfigError("CreateContainerConfigError", f'{kind.lower()} "{ref["name"]}" not found')
            for k, v in data.items():
                env[prefix + k] = v.decode(errors="replace")
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        src = var["valueFrom"]
        value: str | None
        if "fieldRef" in src:
            value = field_value(pod, src["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in src:
            value = resource_value(container, src["resourceFieldRef"], node_resources)
        elif "configMapKeyRef" in src:
            value = _key_ref("ConfigMap", src["configMapKeyRef"], lookup)
        elif "secretKeyRef" in src:
            value = _key_ref("Secret", src["secretKeyRef"], lookup)
        else:
            raise ConfigError("CreateContainerConfigError", f"env {name}: unsupported valueFrom {sorted(src)}")
        if value is not None:
            env[name] = value
    return env


class PathMap:
    """Rewrites container paths (mount paths and the termination message path) to host paths."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        # "/" would swallow every path; a trailing slash would stop "/data/" from matching "/data".
        self.mapping = {k.rstrip("/"): v for k, v in mapping.items() if k.startswith("/") and k != "/"}
        alts = "|".join(re.escape(k) for k in sorted(self.mapping, key=len, reverse=True))
        # A container path starts the string or follows a separator (=, :, space, quote, comma...), and ends
        # at the string's end, a "/" or a separator: "/data" maps in "--out=/data/x" but not in "/data2".
        self._re = re.compile(rf"(?<![\w.\-/~])({alts})(?![\w.\-])") if alts else None

    def apply(self, value: str) -> str:
        if self._re is None:
            return value
        return self._re.sub(lambda m: self.mapping[m.group(1)], value)
