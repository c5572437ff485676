"""The checker on hostile samples, as a model trying to pass without a right answer would write them: each gets
the failing verdict (and failure category) it must get, leaves nothing running and nothing written outside its
scratch directory, and the good samples around it pass as if it had not been there. One run of the real CLI
per mode, two samples at once:
  - sandbox: the runner as root with every capability (the sandbox's node agent): namespaces as well;
  - gke: the runner as the evaluation pod's `check` container runs on GKE: root with CAP_SETUID and
    CAP_SETGID only, no privilege escalation, so no namespaces (and a node where the pods' uid 65532 already
    has 64 processes).
Verilog samples go through the Verilog checker (evaluate.verilog, Debian's iverilog); the others through a
shell, as a checker script that interpolates a sample would run it."""

from __future__ import annotations

import json
import os
import re
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

from tpuforge_workloads.data import verilogeval
from tpuforge_workloads.data.verilog_tasks import PROBLEMS, VERILOG_CHECK_COMMAND
from tpuforge_workloads.evaluate.check import SAMPLE_UIDS

pytestmark = [
    pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog (make iverilog)"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"),
]
TIMEOUT = 4.0
MEMORY = 256 << 20
MUX = PROBLEMS[0]
VERILOG = {"files": {"tb.v": MUX.testbench}}
SHELL = {"shell": True}
# Samples whose test says "shell" to a shell, the others to the Verilog checker.
COMMAND = ["sh", "-c", "if grep -q '\"shell\": true' test.json; then exec sh sample.txt; else exec "
           + " ".join(VERILOG_CHECK_COMMAND) + "; fi"]  # fmt: skip
# Five real VerilogEval v2 spec-to-RTL problems (NVlabs/verilog-eval, MIT): their records as the converter
# writes them.
VERILOGEVAL = verilogeval.read_problems(Path(__file__).resolve().parents[2] / "data" / "verilogeval")
# A verilog case's expected failure when it must pass.
PASSED = "passed"
GKE = ["setpriv", "--bounding-set=-all,+setuid,+setgid", "--inh-caps=-all", "--no-new-privs"]


def simulator_major() -> int:
    """The major version of the iverilog on PATH."""
    said = subprocess.run(["iverilog", "-V"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"version (\d+)", said)
    return int(found.group(1)) if found else 0


def wrong(extra: str) -> str:
    """The wrong mux (its inputs swapped) with `extra` inside the module: passes only if `extra` cheats."""
    return MUX.broken.replace("endmodule", extra + "\nendmodule")


def verilog_cases() -> list[tuple[str, str, Any, str]]:
    """(name, code, failure(s), what stderr or stdout says) of wrong designs that try to pass anyway, against a
    testbench whose verdict is its exit code ($fatal on a mismatch)."""
    refused = "refused"
    return [
        ("$finish", wrong("initial $finish;"), refused, "$finish ends the simulation"),
        ("$stop", wrong("initial $stop;"), refused, "$stop ends the simulation"),
        ("$fatal", wrong("initial #0 $fatal(0);"), refused, "$fatal ends the simulation"),
        ("$finish escaped", wrong("initial \\$finish ;"), ("refused", "syntax", "compile"), ""),
        ("force", wrong("initial force tb.errors = 0;"), refused, "tb.errors: a reference to what is not"),
        ("force an input port", wrong("initial begin force a = 0; force b = 0; end"), refused, "force"),
        ("watch the testbench", wrong("always @(tb.errors) if (tb.errors) $finish;"), refused, "tb.errors"),
        ("escaped name", wrong("initial \\tb .errors = 0;"), refused, "tb.errors"),
        ("disable the testbench", wrong("initial disable tb.run;"), refused, "tb.run"),
        ("defparam into the testbench", wrong("defparam tb.N = 3;"), refused, "tb.N"),
        ("$root", wrong("initial $root.tb.errors = 0;"), (refused, "syntax"), ""),
        ("own tb, open comment", MUX.broken + "\nmodule tb; endmodule\n/*", ("mismatch", "syntax", "compile"), ""),
        ("own tb, open ifdef", MUX.broken + "\nmodule tb; endmodule\n`ifdef NEVER", ("refused", "syntax"), ""),
        # The answer's own testbench is dropped, not judged: the design alone fails the test's.
        ("own tb", MUX.broken + '\nmodule tb; initial $display("PASS"); endmodule', "mismatch", "not judged"),
        ("own tb instantiated", MUX.broken.replace("endmodule", "tb t();\nendmodule") + "\nmodule tb; endmodule",
         refused, "the test defines tb"),
        ("$fopen", wrong('integer f; initial f = $fopen("../../x", "w");'), refused, "$fopen"),
        ("$readmemh", wrong('reg [7:0] m [0:3]; initial $readmemh("/etc/passwd", m);'), refused, "$readmemh"),
        ("$dumpfile", wrong('initial $dumpfile("../../x.vcd");'), refused, "$dumpfile"),
        ("$random", wrong("integer r; initial r = $random;"), refused, "$random draws from the random stream"),
        ("$display PASS", wrong('initial $display("PASS");'), "mismatch", "FAIL: 4 mismatches"),
        ("macro pasting", "`define F $fin``ish\n" + wrong("initial `F;"), ("refused", "syntax", "compile"), ""),
        ("macro hiding", "`define F $finish\n" + wrong("initial `F;"), refused, "$finish"),
        ("`include", '`include "/etc/passwd"\n' + MUX.solution, refused, "`include reads a file"),
        ("`include in a macro", '`define I `include "tb.v"\n' + MUX.solution, refused, "`include reads a file"),
        ("inout", MUX.broken.replace("input a", "inout a"), refused, "inout"),
        ("switch", wrong("tran t(a, y);"), refused, "bidirectional switch"),
        ("DPI", wrong('import "DPI-C" function int system(input string s);'), ("refused", "syntax", "compile"), ""),
        ("bind", wrong("bind tb mux2 other(.a(1'b0));"), ("refused", "syntax", "compile"), ""),
        ("run-time loop", MUX.solution.replace("endmodule", "reg r = 0; initial while (1) r = ~r;\nendmodule"),
         "timeout", ""),
        ("compile-time loop", MUX.solution.replace("endmodule", "reg r; always r = ~r;\nendmodule"), "compile",
         "always process does not have any delay"),
        ("syntax", MUX.solution.replace(";", "", 1), "syntax", "syntax error"),
        ("mismatch", MUX.broken, "mismatch", "FAIL: 4 mismatches"),
    ]  # fmt: skip


def _reuse(ref: str, body: str) -> str:
    """A TopModule with the reference's ports whose body is `body`."""
    ports = re.search(r"module TopModule\s*\((.*?)\);", ref, re.DOTALL)
    assert ports is not None
    return f"module TopModule ({ports.group(1)});\n{body}\nendmodule\n"


def verilogeval_cases() -> list[tuple[str, str, Any, Any]]:
    """(name, code, failure(s), test) on the real VerilogEval problems (tests/data/verilogeval), whose verdict is
    the testbench's own counters: every reference passes (where the simulator compiles it; else the problem is
    the task set's), no TopModule that reuses a test module passes, and right answers with debug output, an
    assertion, a simulation-only block or a testbench of their own pass."""
    ok = PASSED
    cases: list[tuple[str, str, Any, Any]] = []
    for problem in VERILOGEVAL:
        test = verilogeval.to_record(problem)["test"]
        ref = test["reference"]
        compiles = "'(" not in ref or simulator_major() >= 12  # its casts need iverilog 12 or newer
        cases += [
            (f"{problem.name} reference", ref, ok if compiles else "task", test),
            (f"{problem.name} reuses RefModule", _reuse(ref, "  RefModule r (.*);"), "refused", test),
        ]
    test = verilogeval.to_record(VERILOGEVAL[1])["test"]  # Prob058_alwaysblock2
    ref = test["reference"]
    wrong_ve = ref.replace("out_always_ff <= a ^ b;", "out_always_ff <= a | b;")
    assert wrong_ve != ref
    extra = ref.replace("endmodule", "{}\nendmodule")
    cases += [
        ("reuse by macro", "`define R RefModule\n" + _reuse(ref, "  `R r (.*);"), "refused", test),
        ("reuse by escaped name", _reuse(ref, "  \\RefModule  r (.*);"), "refused", test),
        ("reuse under the test's macro", _reuse(ref, "`ifdef OK\n  RefModule r (.*);\n`endif"), "mismatch", test),
        ("own RefModule", _reuse(ref, "  RefModule r (.*);") + wrong_ve.replace("TopModule", "RefModule"), "refused",
         test),
        ("unused own RefModule (dropped)", wrong_ve + ref.replace("TopModule", "RefModule"), "mismatch", test),
        ("reuse the stimulus", _reuse(ref, "  stimulus_gen s (.*);"), "refused", test),
        ("print the pass line", wrong_ve.replace("endmodule", 'initial $display("Mismatches: 0 in 9 samples");\n'
                                                  "final $display(\"Mismatches: 0 in 9 samples\");\nendmodule"),
         "mismatch", test),
        ("counters", wrong_ve.replace("endmodule", "initial tb.stats1.errors = 0;\nendmodule"), "refused", test),
        ("timescale", "`timescale 1s/1s\n" + wrong_ve, "mismatch", test),
        ("right, debug output", extra.format('always @(posedge clk) $display("a=%b b=%b", a, b);'), ok, test),
        ("right, assertion", extra.format('always @(posedge clk) assert (out_assign == (a ^ b)) else '
                                          '$error("out_assign");'), ok, test),
        ("right, `ifdef SIMULATION", extra.format('`ifdef SIMULATION\ninitial $display("sim");\n`endif'), ok, test),
        ("right, own testbench", ref + "\nmodule tb;\n  initial begin $display(\"PASS\"); $finish; end\nendmodule\n",
         ok, test),
    ]  # fmt: skip
    return cases


def shell_cases(outside: Path, port: int) -> list[tuple[str, str, str | None, str]]:
    """(name, code, failure, said) of samples run by a shell: what a checker that runs code must survive. Each
    exits 0 (passes) only if its attack worked. failure None: its own verdict does not matter (it cheats no
    one by it), only that it hurts nothing and no one else."""
    return [
        ("fork bomb", "f() { f | f & }; f; sleep 1", None, ""),
        ("1 GB output", "yes 0123456789abcdef | head -c 1000000000", "limit", "File size limit exceeded"),
        ("memory, many processes", "for i in 1 2 3 4; do python3 -c 'b = bytearray(100 << 20); import time; "
         "time.sleep(5)' & done; wait", "limit", ""),
        ("write the evaluation's files", f"echo pwned > {outside / 'work' / 'samples.jsonl'}", "error",
         "cannot create"),
        ("write a shared directory", f"echo x > {outside / 'open' / 'x'}", None, ""),
        ("write /tmp", "echo x > /tmp/tpuforge-hostile-$$", None, ""),
        ("network", f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\"", "mismatch",
         "Permission denied"),
        ("daemon", "setsid sh -c 'sleep 60' & exit 0", "refused", ""),
        # A daemon that waits for the next sample and rewrites its testbench, so that a failing one passes.
        ("rewrite the next testbench", "setsid sh -c 'while :; do for d in ../../*/run; do printf \"module tb; "
         "initial $finish; endmodule\" > $d/tb.v; done; done' >/dev/null 2>&1 & exit 0", "refused", ""),
        ("signal the runner", "kill -9 $PPID 1; kill -STOP -1", None, ""),
    ]  # fmt: skip


def run_checker(mode: str, tmp: Path, samples: list[tuple[str, str, Any]]) -> dict[str, Any]:
    path = tmp / "work" / "samples.jsonl"
    path.write_text("".join(json.dumps({"id": n, "code": c, "test": t}) + "\n" for n, c, t in samples))
    before = path.read_text()
    prefix = GKE if mode == "gke" else []
    started = time.monotonic()
    run = subprocess.run(
        [*prefix, sys.executable, "-m", "tpuforge_workloads.evaluate.check", "--samples", str(path),
         "--out", str(tmp / "out" / "verdicts.jsonl"), "--timeout", str(TIMEOUT), "--memory", str(MEMORY),
         "--parallel", "2", "--scratch", str(tmp / "scratch"), "--", *COMMAND],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in (tmp / "out" / "verdicts.jsonl").read_text().splitlines()]
    return {
        "verdicts": {v["id"]: v for v in lines},
        "order": [v["id"] for v in lines],
        "seconds": time.monotonic() - started,
        "stdout": run.stdout,
        "samples_unchanged": path.read_text() == before,
    }


def sample_processes(uids: set[int]) -> list[str]:
    """The processes owned by these samples' uids, with their command lines. Only this run's uids: other tests
    run the checker at the same time, and their samples' processes are theirs to account for."""
    return [
        f"{p.name} (uid {_uid(p)}): {_cmdline(p)}"
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _uid(p) in uids
    ]


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _uid(p: Path) -> int:
    try:
        return p.stat().st_uid
    except OSError:
        return -1


@pytest.fixture(scope="module", params=["sandbox", "gke"])
def checked(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    mode = request.param
    tmp = Path(tempfile.mkdtemp(prefix=f"tpuforge-check-{mode}-"))
    tmp.chmod(0o755)
    (tmp / "work").mkdir(mode=0o755)  # the evaluation's files: read-only to the check container on GKE
    (tmp / "open").mkdir()
    (tmp / "open").chmod(0o777)  # a place anyone may write to: a sample's write there must not survive
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    # On GKE every tpuforge pod runs as 65532; a node full of its processes must not starve the samples.
    squatters = [] if mode == "sandbox" else [
        subprocess.Popen(["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", "sleep", "300"])
        for _ in range(64)
    ]  # fmt: skip
    samples: list[tuple[str, str, Any]] = [("good 0", MUX.solution, VERILOG)]
    tests = {name: test for name, _, _, test in verilogeval_cases()}
    cases = [*verilog_cases(), *[(*c[:3], "") for c in verilogeval_cases()], *shell_cases(tmp, port)]
    shell = {name for name, *_ in shell_cases(tmp, port)}
    for i, (name, code, _, _) in enumerate(cases):
        test = SHELL if name in shell else tests.get(name, VERILOG)
        samples += [(name, code, test), (f"good {i + 1}", MUX.solution, VERILOG)]
    try:
        result = run_checker(mode, tmp, samples)
    finally:
        for p in squatters:
            p.kill()
            p.wait()
    listener.settimeout(0.0)
    try:
        listener.accept()
        result["connected"] = True
    except BlockingIOError:
        result["connected"] = False
    listener.close()
    uids = {v["uid"] for v in result["verdicts"].values() if v["uid"] is not None}
    assert len(uids) == len(samples)  # each sample ran, each as a uid of its own
    assert all(SAMPLE_UIDS[0] <= u < SAMPLE_UIDS[1] for u in uids)
    result.update(mode=mode, tmp=tmp, cases=cases, left=sample_processes(uids))
    result["open"] = sorted(p.name for p in (tmp / "open").iterdir())
    result["tmp_files"] = [p for p in Path("/tmp").glob("tpuforge-hostile-*")]
    yield result
    shutil.rmtree(tmp, ignore_errors=True)


def test_good_samples_pass_around_every_hostile_one(checked: dict[str, Any]) -> None:
    v = checked["verdicts"]
    goods = [k for k in checked["order"] if k.startswith("good")]
    assert len(goods) == len(checked["cases"]) + 1
    assert [k for k in goods if v[k]["verdict"] != "passed"] == []
    assert "PASS" in v["good 0"]["stdout"]


def test_each_hostile_sample_gets_its_failing_verdict(checked: dict[str, Any]) -> None:
    v = checked["verdicts"]
    wrong_verdicts = []
    for name, _, failure, said in checked["cases"]:
        got = v[name]
        if failure is None:
            continue
        allowed = failure if isinstance(failure, tuple) else (failure,)
        if failure == PASSED:
            if not got["passed"]:
                wrong_verdicts.append((name, failure, said, got))
        elif got["passed"] or got["failure"] not in allowed or said not in got["stderr"] + got["stdout"]:
            wrong_verdicts.append((name, failure, said, got))
        assert got["seconds"] < TIMEOUT + 3, got
        assert len(got["stdout"]) <= 2048 + len("\n[... cut]")
    assert wrong_verdicts == [], "\n".join(map(str, wrong_verdicts))


def test_nothing_is_left_running_or_written_outside_the_scratch(checked: dict[str, Any]) -> None:
    assert checked["left"] == []
    assert checked["samples_unchanged"]
    assert checked["open"] == [] and checked["tmp_files"] == []
    assert not checked["connected"]
    assert sorted(p.name for p in (checked["tmp"] / "scratch").iterdir()) == []
    assert sorted(p.name for p in (checked["tmp"] / "out").iterdir()) == ["verdicts.jsonl"]


def test_each_mode_says_what_isolation_it_gives(checked: dict[str, Any]) -> None:
    said = checked["stdout"]
    assert "own-uid" in said and "kill-by-uid" in said and "no-sockets" in said
    assert ("read-only-mounts" in said) == (checked["mode"] == "sandbox")


def test_a_runner_that_cannot_change_uid_refuses_to_check(tmp_path: Path) -> None:
    """Samples under the runner's own uid could forge verdicts: a runner without CAP_SETUID checks nothing."""
    tmp_path.chmod(0o777)
    (tmp_path / "s.jsonl").write_text(json.dumps({"id": "x", "code": "exit 0", "test": {}}) + "\n")
    run = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
         "tpuforge_workloads.evaluate.check", "--samples", str(tmp_path / "s.jsonl"), "--out",
         str(tmp_path / "v.jsonl"), "--timeout", "1", "--memory", str(MEMORY), "--", "sh", "sample.txt"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "needs to start as root with CAP_SETUID and CAP_SETGID" in run.stderr
    assert not (tmp_path / "v.jsonl").exists()
