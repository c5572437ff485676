"""The sandbox's stand-in for cluster DNS and pod IPs, for pods that name each other by hostname.

A pod with `spec.subdomain` (an Indexed Job's pods under a headless Service, as JobSet makes them) is
addressable as `<hostname>.<subdomain>[.<namespace>.svc...]`. Every pod runs on this machine, so each such
pod gets a loopback address of its own (127.0.0.2, 127.0.0.3, ...; other pods have 127.0.0.1), and in the
pods' environment `<hostname>.<subdomain>...:<port>` becomes `127.0.0.1:<a free port>`, the same free port
for every pod that names that host and port: the host named binds it (servers listen on all addresses) and
the others connect to it. The table lives as long as the agent; a new agent fails the pods it cannot adopt.

A pod annotated `sandbox.tpuforge.dev/own-address: "true"` gets a loopback address of its own too, without a
subdomain: replicas of one Deployment that serve on fixed ports (the operator's /metrics and /healthz) can each
bind their pod IP, as they would in pods of their own network namespace.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]

OWN_ADDRESS = "sandbox.tpuforge.dev/own-address"


def pod_hostname(pod: Mapping[str, Any]) -> str | None:
    """The pod's hostname as DNS knows it (an Indexed Job's pods have `<job name>-<completion index>`)."""
    hostname = (pod.get("spec") or {}).get("hostname")
    return str(hostname) if hostname else None


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_ip(ordinal: int) -> str:
    """127.0.0.1 for ordinal 0, then 127.0.0.2, ... (all of 127/8 is loopback on Linux)."""
    n = ordinal + 1
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


class LoopbackDns:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, str, str, int], int] = {}  # (namespace, subdomain, host, port) -> port
        self._ips: dict[str, str] = {}  # pod uid -> its loopback address

    def pod_ip(self, pod: Mapping[str, Any]) -> str:
        """127.0.0.1, or for a pod with a subdomain (or the own-address annotation) a loopback address no other
        such pod holds."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not (pod.get("spec") or {}).get("subdomain") and annotations.get(OWN_ADDRESS) != "true":
            return "127.0.0.1"
        uid = pod["metadata"]["uid"]
        with self._lock:
            if uid not in self._ips:
                taken = set(self._ips.values())
                self._ips[uid] = next(loopback_ip(n) for n in range(1, 1 << 24) if loopback_ip(n) not in taken)
            return self._ips[uid]

    def release(self, uid: str) -> None:
        with self._lock:
            self._ips.pop(uid, None)

    def rewrite(self, value: str, pod: Mapping[str, Any]) -> str:
        """`value` with every `<host>.<the pod's subdomain>[...]:<port>` replaced by its loopback address."""
        sub = (pod.get("spec") or {}).get("subdomain")
        if not sub or "." not in value:
            return value
        ns = pod["metadata"]["namespace"]
        pattern = re.compile(rf"(?<![\w.\-])([a-z0-9][a-z0-9\-]*)\.{re.escape(sub)}(?:\.[A-Za-z0-9.\-]+)?:(\d+)")

        def loopback(m: re.Match[str]) -> str:
            key = (ns, sub, m.group(1), int(m.group(2)))
            with self._lock:
                if key not in self._ports:
                    self._ports[key] = free_loopback_port()
                return f"127.0.0.1:{self._ports[key]}"

        return pattern.sub(loopback, value)
