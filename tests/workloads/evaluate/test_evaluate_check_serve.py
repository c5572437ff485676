"""The checker beside a trainer (evaluate.check --serve, GRPO's sidecar), run as the pod runs it on GKE (root
with CAP_SETUID and CAP_SETGID only): the trainer's side (train/grpo.SpoolChecker) hands it batches through the
spool and gets the same verdicts as the in-process runner gives; a sample cannot forge a verdict or stop it;
it stops on the trainer's stop marker and on SIGTERM; a trainer whose checker died fails the step, naming why,
instead of waiting for ever."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuforge_workloads.data.verilog_tasks import PROBLEMS, VERILOG_CHECK_COMMAND, fenced
from tpuforge_workloads.evaluate import check
from tpuforge_workloads.train import grpo

pytestmark = [
    pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"),
]
GKE = ["setpriv", "--bounding-set=-all,+setuid,+setgid", "--inh-caps=-all", "--no-new-privs"]
MUX = PROBLEMS[0]
TEST = {"files": {"tb.v": MUX.testbench}}
COMMAND = ["sh", "-c", "if grep -q '\"shell\": true' test.json; then exec sh sample.txt; else exec "
           + " ".join(VERILOG_CHECK_COMMAND) + "; fi"]  # fmt: skip


def start(spool: Path, scratch: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GKE, sys.executable, "-m", "tpuforge_workloads.evaluate.check", "--serve", str(spool), "--timeout", "5",
         "--memory", str(256 << 20), "--parallel", "2", "--scratch", str(scratch), "--", *COMMAND],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A spool as the pod's emptyDir is (0777), and the sidecar on it."""
    tmp = Path(tempfile.mkdtemp(prefix="tpuforge-serve-"))
    tmp.chmod(0o755)
    spool = tmp / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    proc = start(spool, tmp / "check" / "scratch")
    yield spool, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


def test_the_sidecar_gives_the_runners_verdicts_and_a_sample_cannot_forge_or_stop_it(
    pod: tuple[Path, subprocess.Popen[str]],
) -> None:
    spool, proc = pod
    trainer = grpo.SpoolChecker(str(spool), 5.0)
    forge = (
        f"echo '{{}}' > {spool}/verdicts/x.jsonl; touch {spool}/requests/stop; touch {spool}/requests/y.jsonl; "
        f"ls {spool}/verdicts/x.jsonl {spool}/requests/stop {spool}/requests/y.jsonl"
    )
    items = [(MUX.solution, TEST), (MUX.broken, TEST), (forge, {"shell": True}), (MUX.solution, TEST)]
    verdicts = trainer(items)
    assert [v["passed"] for v in verdicts] == [True, False, False, True]
    assert verdicts[1]["failure"] == "mismatch"
    assert not any((spool / "requests" / n).exists() for n in ("stop", "y.jsonl"))
    assert not (spool / "verdicts" / "x.jsonl").exists()
    # Another batch after it: the sidecar is still up, and the first batch's files are gone.
    assert [v["passed"] for v in trainer([(MUX.broken, TEST), (MUX.solution, TEST)])] == [False, True]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(list((spool / "verdicts").glob("*.jsonl"))) > 0:
        time.sleep(0.05)
    assert list((spool / "requests").glob("*.jsonl")) == [] == list((spool / "verdicts").glob("*.jsonl"))
    trainer.stop()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "own-uid" in out and "stopped after" in out


def test_sigterm_stops_the_sidecar_and_the_trainer_then_fails_the_step_naming_why(
    pod: tuple[Path, subprocess.Popen[str]],
) -> None:
    spool, proc = pod
    trainer = grpo.SpoolChecker(str(spool), 5.0)
    assert trainer([(MUX.solution, TEST)])[0]["passed"]
    proc.send_signal(signal.SIGTERM)  # the kubelet ending the sidecar (or the sidecar dying)
    assert proc.wait(timeout=30) == 0
    trainer.STALE_SECONDS = 1.0
    started = time.monotonic()
    with pytest.raises(grpo.CheckerUnavailable, match=r"sidecar stopped|died or was killed"):
        trainer([(MUX.solution, TEST)])
    assert time.monotonic() - started < 10


def test_a_trainer_without_a_sidecar_fails_after_the_start_grace(tmp_path: Path) -> None:
    trainer = grpo.SpoolChecker(str(tmp_path / "spool"), 5.0)
    trainer.START_SECONDS = 0.5
    with pytest.raises(grpo.CheckerUnavailable, match="checker sidecar is not running"):
        trainer([("module m; endmodule", TEST)])


def test_the_spool_root_is_made_sticky_and_the_verdicts_the_checkers_alone(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    requests, verdicts = check._spool_dirs(spool)
    assert spool.stat().st_mode & 0o1777 == 0o1777
    assert verdicts.stat().st_mode & 0o777 == 0o755
    assert requests == spool / "requests"
    assert fenced  # the Verilog answers the trainer sends are fenced; the checker gets the code taken out


def test_a_restarted_checker_keeps_the_verdicts_the_trainer_has_not_read_and_drops_the_others(tmp_path: Path) -> None:
    import threading

    from tpuforge_workloads.evaluate.jail import Limits

    spool = tmp_path / "spool"
    requests, verdicts = check._spool_dirs(spool)
    requests.mkdir()
    (requests / "kept.jsonl").write_text("")
    (verdicts / "kept.jsonl").write_text('{"id": "0"}\n')
    (verdicts / "read.jsonl").write_text('{"id": "0"}\n')
    stop = threading.Event()
    stop.set()
    assert check.serve(spool, ["true"], Limits(1.0, 64 << 20), tmp_path / "scratch", 1, stop) == 0
    assert sorted(p.name for p in verdicts.iterdir()) == ["kept.jsonl"]
