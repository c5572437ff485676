"""The checker runner on hostile samples: each fails with a verdict saying why, within its timeout, leaves
nothing running, and the good samples around it pass as if it had not been there. One run of the real CLI
(as the evaluation runs it) over every case, with Debian's iverilog as the checker for the Verilog ones."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuforge_workloads.evaluate.check import SAMPLE_UID
from tpuforge_workloads.evaluate.jail import processes_of

pytestmark = pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)")
TIMEOUT = 2.0
AS_ROOT = os.geteuid() == 0
MUX = "module mux2(input a, input b, input s, output y);\n  assign y = s ? b : a;\nendmodule\n"
TB = """module tb;
  reg a, b, s; wire y; integer i, errors = 0;
  mux2 dut(.a(a), .b(b), .s(s), .y(y));
  initial begin
    for (i = 0; i < 8; i = i + 1) begin {a, b, s} = i; #1; if (y !== (s ? b : a)) errors = errors + 1; end
    if (errors) $fatal(1, "FAIL: %0d mismatches", errors);
    $display("PASS"); $finish;
  end
endmodule
"""
VERILOG = {"files": {"tb.v": TB}}
# One checker for both kinds of sample: Verilog goes to iverilog, anything else to the checker's shell (the
# way a hostile sample reaches a shell when a checker script interpolates it).
COMMAND = [
    "sh",
    "-c",
    'case "$(head -c 6 sample.txt)" in module) iverilog -g2012 -o sim -s tb sample.txt tb.v && vvp -n sim;; '
    "*) sh sample.txt;; esac",
]


def hostile(outside: Path, port: int) -> list[tuple[str, str, Any]]:
    return [
        ("compile-time loop", MUX.replace("endmodule", "reg r; always r = ~r;\nendmodule"), VERILOG),
        ("run-time loop", MUX.replace("endmodule", "reg r = 0; initial while (1) r = ~r;\nendmodule"), VERILOG),
        ("no $finish", MUX, {"files": {"tb.v": "module tb; reg c = 0; always #1 c = ~c; endmodule\n"}}),
        ("fork bomb", "f() { f | f & }; f", {}),
        ("1 GB output", "yes 0123456789abcdef | head -c 1000000000", {}),
        ("write outside", f"echo pwned > {outside} && echo wrote", {}),
        ("network", f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\"", {}),
        ("escape the group", "setsid sleep 60 & exit 0", {}),
    ]


@pytest.fixture(scope="module")
def checked() -> Iterator[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="tpuforge-check-"))
    tmp.chmod(0o777)  # writable by anyone: only the sample's read-only view of it stops the write outside
    # A scratch root the samples' uid cannot reach (as pytest's own temporary directories): the runner uses
    # one under /tmp instead.
    (tmp / "private").mkdir(mode=0o700)
    outside = tmp / "outside.txt"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    samples = [("good 0", MUX, VERILOG), ("wrong", MUX.replace("s ? b : a", "s ? a : b"), VERILOG)]
    for i, (name, code, test) in enumerate(hostile(outside, port)):
        samples += [(name, code, test), (f"good {i + 1}", MUX, VERILOG)]
    path = tmp / "samples.jsonl"
    path.write_text("".join(json.dumps({"id": n, "code": c, "test": t}) + "\n" for n, c, t in samples))
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "tpuforge_workloads.evaluate.check", "--samples", str(path), "--out",
         str(tmp / "verdicts.jsonl"), "--timeout", str(TIMEOUT), "--memory", str(512 << 20), "--scratch",
         str(tmp / "private"), "--", *COMMAND],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    listener.settimeout(0.0)
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    lines = [json.loads(x) for x in (tmp / "verdicts.jsonl").read_text().splitlines()]
    yield {
        "verdicts": {v["id"]: v for v in lines},
        "order": [v["id"] for v in lines],
        "seconds": time.monotonic() - started,
        "stdout": run.stdout,
        "stderr": run.stderr,
        "outside": outside,
        "connected": connected,
        "scratch": tmp,
    }
    shutil.rmtree(tmp, ignore_errors=True)


def test_good_samples_pass_around_every_hostile_one_and_a_wrong_one_fails(checked: dict[str, Any]) -> None:
    v = checked["verdicts"]
    goods = [k for k in checked["order"] if k.startswith("good")]
    assert len(goods) == 9 and all(v[k]["passed"] and v[k]["verdict"] == "passed" for k in goods)
    assert "PASS" in v["good 0"]["stdout"]
    assert v["wrong"]["verdict"] == "failed (exit 1)" and "FAIL: 4 mismatches" in v["wrong"]["stdout"]
    assert "9/18 samples passed" in checked["stdout"]


@pytest.mark.parametrize(
    ("sample", "verdict", "said"),
    [
        ("compile-time loop", "failed (exit 1)", "always process does not have any delay"),
        ("run-time loop", f"timed out after {TIMEOUT:g} s", ""),
        ("no $finish", f"timed out after {TIMEOUT:g} s", ""),
        # The shell may itself hit the process limit (exit 2, "Cannot fork") or end first with its children
        # still forking ("exit 0, but it left processes running: killed"): failed either way.
        ("fork bomb", "failed (exit ", ""),
        ("1 GB output", "failed (exit 153: a process it ran was killed by SIGXFSZ", "File size limit exceeded"),
        ("escape the group", "failed (exit 0, but it left processes running: killed)", ""),
    ],
)
def test_each_hostile_sample_fails_with_a_verdict_within_its_timeout(
    checked: dict[str, Any], sample: str, verdict: str, said: str
) -> None:
    v = checked["verdicts"][sample]
    assert not v["passed"] and v["verdict"].startswith(verdict), v
    assert said in v["stderr"]
    assert v["seconds"] < TIMEOUT + 1.5, v
    # What is kept of the output is cut: 1 GB never reaches the report.
    assert len(v["stdout"]) <= 2048 + len("\n[... cut]")


def test_a_connection_fails_whoever_runs_the_checker(checked: dict[str, Any]) -> None:
    """The seccomp filter refuses every socket but a Unix one, as root (the sandbox) or not (a checker pod)."""
    v = checked["verdicts"]["network"]
    assert not v["passed"] and "PermissionError: [Errno 13] Permission denied" in v["stderr"]
    assert not checked["connected"]


@pytest.mark.skipif(not AS_ROOT, reason="read-only mounts and namespaces need root (the sandbox node)")
def test_writes_outside_scratch_fail_and_root_adds_namespaces(checked: dict[str, Any]) -> None:
    v = checked["verdicts"]
    assert not v["write outside"]["passed"] and "Read-only file system" in v["write outside"]["stderr"]
    assert not checked["outside"].exists()
    isolation = "isolation: session, rlimits, timeout, no-sockets, own-uid, read-only-mounts, no-network"
    assert isolation in checked["stdout"]


@pytest.mark.skipif(not AS_ROOT or shutil.which("setpriv") is None, reason="needs root to become another user")
def test_as_a_non_root_checker_the_network_is_still_refused(tmp_path: Path) -> None:
    """As a checker container runs on GKE: not root, so no namespaces, and still no socket."""
    work = Path(tempfile.mkdtemp(prefix="tpuforge-check-nonroot-"))
    work.chmod(0o777)
    try:
        code = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 9), 1)\""
        (work / "s.jsonl").write_text(json.dumps({"id": "net", "code": code, "test": {}}) + "\n")
        run = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
             "tpuforge_workloads.evaluate.check", "--samples", str(work / "s.jsonl"), "--out", str(work / "v.jsonl"),
             "--timeout", str(TIMEOUT), "--memory", str(512 << 20), "--scratch", str(work), "--", "sh", "sample.txt"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        (v,) = map(json.loads, (work / "v.jsonl").read_text().splitlines())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert "isolation: session, rlimits, timeout, no-sockets" in run.stdout and "own-uid" not in run.stdout
    assert not v["passed"] and "Permission denied" in v["stderr"]


def test_nothing_is_left_running_or_on_disk(checked: dict[str, Any]) -> None:
    if AS_ROOT:
        assert processes_of(SAMPLE_UID) == []
    assert not any(checked["scratch"].glob("**/sample-*"))
    if AS_ROOT:
        assert "is not reachable by the samples' uid" in checked["stderr"]
    run_time = sum(1 for k in ("run-time loop", "no $finish") if "timed out" in checked["verdicts"][k]["verdict"])
    # Every sample but the two that hang ran in well under a second each.
    assert checked["seconds"] < run_time * TIMEOUT + 15
