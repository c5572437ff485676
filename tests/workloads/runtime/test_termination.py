"""termination: the message a pod's program leaves, and how a program that ran a vLLM engine ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpuforge_workloads.runtime import termination

WORKLOADS = Path(__file__).resolve().parents[3] / "workloads"


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
        "from tpuforge_workloads.runtime import termination\n"
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


# libtpu's words when the container's user may not open a chip's device file (as reported on TPU VMs and in
# containers: /dev/vfio/N on v5p and v6e, /dev/accelN before them).
LIBTPU_DENIED = (
    "Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: open(/dev/vfio/0): "
    "Permission denied; Couldn't open iommu group /dev/vfio/0 (set JAX_PLATFORMS='' to automatically choose "
    "an available backend)"
)


def test_a_tpu_device_the_user_may_not_open_is_reported_with_the_run_as_root_switch(tmp_path: Path) -> None:
    # GKE requirement: non-root TPU containers need device files open to their user
    # (docs/platform-team.md, Pod security: "Non-root on TPU").
    path = tmp_path / "termination-log"
    code = termination.fail(str(path), RuntimeError(LIBTPU_DENIED), 1, unexpected="training failed")
    said = path.read_text()
    assert code == 1
    assert said.startswith("libtpu cannot open the TPU device /dev/vfio/0 as uid ")
    assert "spec.tpu.runAsRoot: true" in said and "tpu.runAsRoot: true" in said
    accel = "TPU initialization failed: open(/dev/accel2): Operation not permitted"
    termination.fail(str(path), RuntimeError(accel), 1)
    assert "/dev/accel2" in path.read_text() and "runAsRoot" in path.read_text()
    # Any other TPU failure keeps its own words.
    busy = "TPU initialization failed: open(/dev/vfio/1): Device or resource busy"
    termination.fail(str(path), RuntimeError(busy), 1, unexpected="training failed")
    assert path.read_text() == f"RuntimeError: {busy}"
