"""How a JobSet's pods find each other in the sandbox, which has no DNS: each pod gets its own loopback
address, and a pod's `<hostname>.<subdomain>:<port>` in the pods' environment is rewritten to
`127.0.0.1:<loopback port>`, one free port per JobSet and port (jobsets.py keeps them in the JobSet's
loopback-ports annotation)."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from tpuforge.sandbox.agent.jobset_labels import COMPLETION_INDEX, JOBSET_NAME, LOOPBACK_PORTS


def subdomain(js: Mapping[str, Any]) -> str | None:
    """The pods' subdomain (and the headless Service's name); None when DNS hostnames are off."""
    network = (js.get("spec") or {}).get("network") or {}
    if network.get("enableDNSHostnames") is False:
        return None
    return str(network.get("subdomain") or js["metadata"]["name"])


def _address_pattern(js: Mapping[str, Any]) -> re.Pattern[str] | None:
    """`<jobset>-<rjob>-<j>-<p>.<subdomain>[.more]:<port>`: a pod of this JobSet by its DNS name."""
    sub = subdomain(js)
    if sub is None:
        return None
    name = re.escape(js["metadata"]["name"])
    return re.compile(rf"(?<![\w.\-]){name}-[a-z0-9\-]+-\d+-\d+\.{re.escape(sub)}(?:\.[A-Za-z0-9.\-]+)?:(\d+)")


def _template_env_values(js: Mapping[str, Any]) -> Iterable[str]:
    for rjob in (js.get("spec") or {}).get("replicatedJobs") or []:
        pod_spec = ((rjob.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for c in (pod_spec.get("initContainers") or []) + (pod_spec.get("containers") or []):
            for var in c.get("env") or []:
                if isinstance(var.get("value"), str):
                    yield var["value"]


def ports_in_env(js: Mapping[str, Any]) -> list[int]:
    """The ports the JobSet's pods name each other by (the JAX coordinator's), from their templates."""
    pattern = _address_pattern(js)
    if pattern is None:
        return []
    return sorted({int(m.group(1)) for v in _template_env_values(js) for m in pattern.finditer(v)})


def rewrite_addresses(value: str, pod: Mapping[str, Any]) -> str:
    """The sandbox's DNS: a JobSet pod's `<pod hostname>.<subdomain>:<port>` becomes `127.0.0.1:<loopback
    port>`, by the pod's loopback-ports annotation. Other values are returned unchanged."""
    meta = pod.get("metadata") or {}
    ports = json.loads((meta.get("annotations") or {}).get(LOOPBACK_PORTS) or "{}")
    jobset = (meta.get("labels") or {}).get(JOBSET_NAME)
    sub = (pod.get("spec") or {}).get("subdomain")
    if not ports or not jobset or not sub:
        return value
    pattern = _address_pattern({"metadata": {"name": jobset}, "spec": {"network": {"subdomain": sub}}})
    assert pattern is not None

    def sub_port(m: re.Match[str]) -> str:
        port = ports.get(m.group(1))
        return f"127.0.0.1:{port}" if port else m.group(0)

    return pattern.sub(sub_port, value)


def pod_hostname(pod: Mapping[str, Any]) -> str | None:
    """An Indexed Job's pod hostname, `<job name>-<completion index>`, unless the spec names one."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("hostname"):
        return str(spec["hostname"])
    index = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    job = (meta.get("labels") or {}).get("job-name")
    return f"{job}-{index}" if index is not None and job else None


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_ip(ordinal: int) -> str:
    """127.0.0.1 for a JobSet's first pod, then 127.0.0.2, ... (all of 127/8 is loopback on Linux)."""
    n = ordinal + 1
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
