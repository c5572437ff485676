"""Startup, readiness and liveness probes on loopback: httpGet, tcpSocket and exec."""

from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

Obj = Mapping[str, Any]


def _port(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def run_probe(
    probe: Obj, container: Obj, exec_command: Callable[[list[str], float], int], host: str = "127.0.0.1"
) -> tuple[bool, str]:
    """One attempt on the pod's loopback address `host`: (success, failure message)."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            scheme = (h.get("scheme") or "HTTP").lower()
            path = h.get("path") or "/"
            url = f"{scheme}://{host}:{_port(container, h['port'])}{path if path.startswith('/') else '/' + path}"
            req = urllib.request.Request(url, headers={x["name"]: x["value"] for x in h.get("httpHeaders") or []})
            ctx = ssl._create_unverified_context() if scheme == "https" else None  # kubelet does not verify
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            if 200 <= code < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {code}"
        if "tcpSocket" in probe:
            port = _port(container, probe["tcpSocket"]["port"])
            with socket.create_connection((host, port), timeout=timeout):
                return True, ""
        if "exec" in probe:
            rc = exec_command(list(probe["exec"].get("command") or []), timeout)
            return (rc == 0), f"exec probe exited with {rc}"
        return False, "probe has no handler the sandbox supports (httpGet, tcpSocket, exec)"
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return False, f"probe failed: {e}"
