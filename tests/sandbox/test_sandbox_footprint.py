"""`tpuforge sandbox up` and `down`, run as a user runs them, write nothing outside the sandbox's state directory
and the cache the build filled, and need no root: with HOME and TMPDIR pointing at empty folders (the state
directory then lies at its default place in that HOME), up/down leaves /etc as it was, TMPDIR empty, and
nothing in HOME but the state directory, which `down --purge` deletes (Prometheus's data and the adapter's
certificate and rules among it); Kueue's metrics certificate, which its
release reads from /etc/kueue/metrics/certs, comes from the state directory."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tpuforge_sandbox import Ports
from tpuforge_sandbox.config import cache_dir

# Its own sandbox (about 20 s), apart from the session's: that one runs under the test process's HOME.
pytestmark = pytest.mark.slow

STATE = Path(".local", "state", "tpuforge", "sandbox")


def tree(root: Path) -> set[str]:
    """Every path under `root`, relative to it (what cannot be read is skipped: /etc has root-only folders)."""
    found = set()
    for parent, dirs, files in os.walk(root, onerror=lambda _e: None):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(parent, name), root))
    return found


def sandbox_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuforge.cli", "sandbox", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_up_and_down_leave_nothing_outside_the_state_directory(tmp_path: Path) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "TPUFORGE_SANDBOX_", "KUBECONFIG"))}
    env |= {"HOME": str(home), "TMPDIR": str(tmp), "TPUFORGE_CACHE": str(cache_dir())}
    env |= {f"TPUFORGE_SANDBOX_{name.upper()}_PORT": str(port) for name, port in asdict(Ports.free()).items()}
    etc = tree(Path("/etc"))

    up = sandbox_cli(env, "up", "--nodes", "cpu=1")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        status = sandbox_cli(env, "status")
        assert status.returncode == 0, status.stderr
        components = ("kueue-controller", "jobset-controller", "kube-apiserver", "node-agent")
        for component in (*components, "prometheus", "prometheus-adapter"):
            assert any(line.split()[:2] == [component, "running"] for line in status.stdout.splitlines()), status.stdout
    finally:
        down = sandbox_cli(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr

    outside = {p for p in tree(home) if not Path(p).is_relative_to(STATE) and not STATE.is_relative_to(p)}
    assert outside == set(), f"up/down wrote outside the state directory {home / STATE}"
    assert (home / STATE / "sandbox.json").is_file()
    # Kueue took its metrics certificate from the state directory, not from /etc/kueue/metrics/certs.
    kueue_log = (home / STATE / "logs" / "kueue-controller.log").read_text()
    assert f'"metrics-cert-path":"{home / STATE / "pki" / "kueue-webhook"}"' in kueue_log, kueue_log[:2000]
    assert tree(tmp) == set(), "up/down left files in TMPDIR"
    assert tree(Path("/etc")) == etc, "up/down changed /etc"

    purge = sandbox_cli(env, "down", "--purge")
    assert purge.returncode == 0, purge.stdout + purge.stderr
    assert not (home / STATE).exists()
