"""termination: the message a pod's program leaves, and how a program that ran a vLLM engine ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpuforge_workloads import termination

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def test_write_cuts_to_what_kubernetes_keeps_and_folds_one_line(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    termination.write(str(path), "x" * 5000)
    assert len(path.read_bytes()) == termination.LIMIT - 1
    termination.write(str(path), "a\n  b\tc", one_line=True)
    assert path.read_text() == "a b c\n"


def test_exit_now_keeps_the_code_and_flushes_what_was_printed_and_logged() -> None:
    # stdout to a pipe is block-buffered: os._exit alone would lose the print.
    program = (
        "import logging, threading, time\n"
        "from tpuforge_workloads import termination\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"  # not joined, as an engine's threads
        "print('result line')\n"
        "logging.getLogger('prog').info('logged line')\n"
        "termination.exit_now(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PYTHONPATH": str(WORKLOADS)},
    )
    assert proc.returncode == 3
    assert proc.stdout == "result line\n"
    assert "logged line" in proc.stderr
