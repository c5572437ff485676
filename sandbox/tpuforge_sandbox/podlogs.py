"""Container logs of sandbox pods: one file per container under the state directory, appended across
restarts. Read by `tpuforge sandbox logs` and served to `kubectl logs` by the node agent."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def pod_logs_dir(pods_dir: Path, namespace: str, pod: str) -> Path:
    return pods_dir / namespace / pod / "logs"


def containers_with_logs(pods_dir: Path, namespace: str, pod: str) -> list[str]:
    return sorted(p.stem for p in pod_logs_dir(pods_dir, namespace, pod).glob("*.log"))


def pod_finished(pods_dir: Path, namespace: str, pod: str) -> bool:
    """The node agent writes `.done` when the pod has ended for good."""
    return (pod_logs_dir(pods_dir, namespace, pod) / ".done").exists()


def tail(path: Path, lines: int | None) -> tuple[bytes, int]:
    """The last `lines` lines (all when None or negative), and the size read, to follow from."""
    data = path.read_bytes() if path.exists() else b""
    if lines is None or lines < 0:
        return data, len(data)
    parts = data.splitlines(keepends=True)
    return b"".join(parts[len(parts) - lines :] if lines else []), len(data)


def follow(path: Path, start: int, write: Callable[[bytes], None], done: Callable[[], bool], poll: float = 0.2) -> None:
    """Copy what is appended to `path` from byte `start` on, until `done()` and nothing more is left."""
    pos = start
    while True:
        finished = done()
        if path.exists():
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
            if chunk:
                write(chunk)
                pos += len(chunk)
                continue
        if finished:
            return
        time.sleep(poll)
