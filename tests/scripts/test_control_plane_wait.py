"""`make test` runs the control plane's Go build in the background while the tests that need no cluster run;
the sandbox fixture waits for it (tests/fixtures/cluster.py), and says why when it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.cluster import wait_for_control_plane_build


def _build(tmp_path: Path, output: str = "building\n", rc: str | None = None, pid: int | None = None) -> Path:
    (tmp_path / "control-plane.out").write_text(output)
    if rc is not None:
        (tmp_path / "control-plane.rc").write_text(rc)
    (tmp_path / "control-plane.pid").write_text(str(pid if pid is not None else os.getpid()))
    return tmp_path


def test_no_build_under_way_or_a_finished_one_does_not_wait(tmp_path: Path) -> None:
    wait_for_control_plane_build(tmp_path / "nothing", timeout_s=1)
    wait_for_control_plane_build(_build(tmp_path, rc="0\n"), timeout_s=1)


def test_a_failed_build_fails_the_cluster_tests_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"(?s)build failed.*go: module lookup disabled"):
        wait_for_control_plane_build(_build(tmp_path, "go: module lookup disabled\n", rc="1\n"), timeout_s=1)


def test_a_build_that_died_without_a_status_is_named_not_waited_for(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ended without an exit status"):
        wait_for_control_plane_build(_build(tmp_path, pid=int(gone.stdout)), timeout_s=60)
    assert time.monotonic() - started < 30


def test_a_running_build_is_waited_for_until_it_ends(tmp_path: Path) -> None:
    build = _build(tmp_path)
    threading.Timer(1.0, lambda: (build / "control-plane.rc").write_text("0\n")).start()
    wait_for_control_plane_build(build, timeout_s=60)
    assert (build / "control-plane.rc").exists()
