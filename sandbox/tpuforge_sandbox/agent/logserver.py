"""The one kubelet endpoint the sandbox serves: /containerLogs/<ns>/<pod>/<container>, which the apiserver
calls for `kubectl logs` (and clients' read_namespaced_pod_log) at the node's InternalIP and kubelet port.
Every emulated node has the same address, so one server answers for all of them. Beside it, /sd/pods: the pods
as Prometheus's HTTP service discovery reads them (the sandbox's Prometheus has no Kubernetes discovery)."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tpuforge_sandbox.custommetrics import SD_PATH
from tpuforge_sandbox.pki import Pki
from tpuforge_sandbox.podlogs import follow, pod_finished, tail


def serve_logs(
    pods_dir: Path, stopping: threading.Event, port: int, pki: Pki, targets: Callable[[], list[Any]] = list
) -> ThreadingHTTPServer:
    """Serve the logs under `pods_dir`; a followed log ends with its pod, or when `stopping` is set. `targets`
    answers /sd/pods."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked responses, so `kubectl logs -f` streams

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path == SD_PATH:
                try:
                    body = json.dumps(targets()).encode()
                except Exception as e:  # the apiserver's answer: Prometheus keeps its last targets meanwhile
                    self.send_error(503, f"listing the pods failed: {e}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "the sandbox node agent serves only /containerLogs/<ns>/<pod>/<container>")
                return
            _, ns, pod, container = parts
            query = urllib.parse.parse_qs(url.query)
            path = pods_dir / ns / pod / "logs" / f"{container}.log"
            if not path.exists():
                self.send_error(404, f"no logs for container {container} of pod {ns}/{pod}")
                return
            lines = int(query["tailLines"][0]) if "tailLines" in query else None
            data, size = tail(path, lines)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(data)
            if query.get("follow", ["false"])[0] == "true":
                try:
                    follow(
                        path,
                        size,
                        self._chunk,
                        lambda: pod_finished(pods_dir, ns, pod) or stopping.is_set(),
                    )
                except (BrokenPipeError, ConnectionResetError):
                    return
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            if not data and self.wfile.closed:
                return
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.apiserver_crt), str(pki.apiserver_key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
    return server
