"""python -m tpuforge_workloads.evaluate.check --samples S --out V --timeout T --memory BYTES -- COMMAND...

Runs the checker on each sample, one after another, each in a fresh scratch directory, confined by
evaluate.jail. The checker protocol (docs/ml-engineer.md):
  - in the scratch directory (the working directory, also HOME and TMPDIR): sample.txt, the code taken from
    the answer; test.json, the record's test object as it is; and each entry of the test's "files" object
    (name -> text) as a file of that name;
  - exit code 0 means the sample passes; anything else (a nonzero exit, a signal, the timeout, a limit) fails;
  - the first OUTPUT_KEPT bytes of stdout and of stderr are kept in the report.
A sample that hangs, forks without end, writes too much or crashes fails with a verdict saying so, and the
next sample runs as if it had not been there.

S is JSONL: {"id": ..., "code": "...", "test": {...}} per sample; V gets one line per sample:
{"id", "passed", "verdict", "exitCode", "seconds", "stdout", "stderr"}. Stdlib only (the checker image).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuforge_workloads.evaluate.jail import Limits, become_subreaper, isolation_available, kill_all, preexec

SAMPLE_FILE = "sample.txt"
TEST_FILE = "test.json"
OUTPUT_KEPT = 2048  # bytes of stdout and of stderr kept per sample in the report
# The uid a sample runs as when the checker runs as root: one no account uses, so that killing every process
# of it after the sample touches nothing else.
SAMPLE_UID = 61_000
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Verdict:
    id: str
    passed: bool
    verdict: str  # passed | failed (exit N) | timed out after T s | killed by SIGxxx (why) | not run: why
    exit_code: int | None
    seconds: float
    stdout: str
    stderr: str

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["exitCode"] = out.pop("exit_code")
        return out


_SIGNAL_WHY = {
    signal.SIGXFSZ: "a file or its output passed the size limit",
    signal.SIGXCPU: "CPU time limit",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "crashed (or out of memory)",
    signal.SIGABRT: "aborted (or out of memory)",
}


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and name not in (SAMPLE_FILE, TEST_FILE)


def write_inputs(scratch: Path, code: str, test: Any) -> None:
    """The protocol's files: sample.txt, test.json and test.files. Raises ValueError for a bad file name."""
    (scratch / SAMPLE_FILE).write_text(code, encoding="utf-8")
    (scratch / TEST_FILE).write_text(json.dumps(test), encoding="utf-8")
    files = test.get("files", {}) if isinstance(test, dict) else {}
    if not isinstance(files, dict):
        raise ValueError("test.files must be an object of file name -> text")
    for name, text in files.items():
        if not _safe_name(name) or not isinstance(text, str):
            raise ValueError(f"test.files[{name!r}]: a plain file name (no '/') with text content")
        (scratch / name).write_text(text, encoding="utf-8")


def _head(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(OUTPUT_KEPT + 1)
    text = data[:OUTPUT_KEPT].decode("utf-8", errors="replace")
    return text + ("\n[... cut]" if len(data) > OUTPUT_KEPT else "")


def _describe(code: int | None, timed_out: bool, limits: Limits) -> str:
    if timed_out:
        return f"timed out after {limits.timeout_seconds:g} s"
    if code == 0:
        return "passed"
    if code is not None and code < 0:
        return f"killed by {_signal(-code)}"
    if code is not None and 128 < code < 128 + 65:
        # A shell's way of saying that a command it ran died of a signal.
        return f"failed (exit {code}: a process it ran was killed by {_signal(code - 128)})"
    return f"failed (exit {code})"


def _signal(number: int) -> str:
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"signal {number}"
    return f"{sig.name} ({_SIGNAL_WHY.get(sig, 'signal')})"


def run_sample(sample_id: str, command: list[str], code: str, test: Any, limits: Limits, root: Path) -> Verdict:
    """Run the checker once on one sample; never raises for what the sample does."""
    started = time.monotonic()
    as_root = os.geteuid() == 0
    uid = SAMPLE_UID if as_root else None
    work = Path(tempfile.mkdtemp(prefix="sample-", dir=root))
    scratch, out_dir = work / "scratch", work / "out"
    work.chmod(0o711)  # the sample's own uid passes through to its scratch, and sees nothing else here
    scratch.mkdir()
    out_dir.mkdir()
    try:
        try:
            write_inputs(scratch, code, test)
        except ValueError as e:
            return Verdict(sample_id, False, f"not run: {e}", None, 0.0, "", "")
        if uid is not None:
            for path in [scratch, *scratch.iterdir()]:
                os.chown(path, uid, uid)
        env = {**ENV, "HOME": str(scratch), "TMPDIR": str(scratch)}
        with (out_dir / "stdout").open("wb") as out, (out_dir / "stderr").open("wb") as err:
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=scratch,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=lambda: preexec(limits, str(scratch), uid),  # the runner has no threads
                )
            except (OSError, subprocess.SubprocessError) as e:
                return Verdict(sample_id, False, f"not run: the checker did not start ({e})", None, 0.0, "", "")
            timed_out = False
            try:
                exit_code: int | None = proc.wait(timeout=limits.timeout_seconds)
            except subprocess.TimeoutExpired:
                timed_out, exit_code = True, None
            if timed_out:
                kill_all(proc.pid, uid)
                proc.wait()
            left = kill_all(proc.pid, uid)
        verdict = _describe(exit_code, timed_out, limits)
        if left and verdict == "passed":
            verdict = "failed (exit 0, but it left processes running: killed)"
        return Verdict(
            sample_id,
            verdict == "passed",
            verdict,
            exit_code,
            round(time.monotonic() - started, 3),
            _head(out_dir / "stdout"),
            _head(out_dir / "stderr"),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scratch_root(root: Path) -> Path:
    """Where the samples' scratch directories go. As root, samples run as SAMPLE_UID, which must pass through
    every directory above its scratch: when `root` is not reachable so (a pod's volume under a private
    directory), a fresh directory under /tmp is used instead. Created when missing."""
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return root
    resolved = root.resolve()
    if all(d.stat().st_mode & stat.S_IXOTH for d in [resolved, *resolved.parents]):
        return root
    fallback = Path(tempfile.mkdtemp(prefix="tpuforge-check-", dir="/tmp"))
    fallback.chmod(0o711)
    print(f"--scratch {root} is not reachable by the samples' uid {SAMPLE_UID}; using {fallback}", file=sys.stderr)
    return fallback


def run_all(samples: list[dict[str, Any]], command: list[str], limits: Limits, root: Path) -> list[Verdict]:
    root = scratch_root(root)
    become_subreaper()
    return [run_sample(str(s["id"]), command, s["code"], s["test"], limits, root) for s in samples]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_workloads.evaluate.check", description=__doc__)
    parser.add_argument("--samples", required=True, help="JSONL of {id, code, test}")
    parser.add_argument("--out", required=True, help="JSONL of verdicts, one per sample")
    parser.add_argument("--timeout", type=float, required=True, help="seconds per sample")
    parser.add_argument("--memory", type=int, required=True, help="address-space limit per sample, bytes")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="where scratch directories go")
    parser.add_argument("command", nargs="+", help="the checker command")
    args = parser.parse_args(argv)
    samples = [json.loads(line) for line in Path(args.samples).read_text().splitlines() if line.strip()]
    limits = Limits(timeout_seconds=args.timeout, memory_bytes=args.memory)
    verdicts = run_all(samples, args.command, limits, Path(args.scratch))
    Path(args.out).write_text("".join(json.dumps(v.to_json()) + "\n" for v in verdicts))
    passed = sum(v.passed for v in verdicts)
    print(f"{passed}/{len(verdicts)} samples passed; isolation: {', '.join(isolation_available())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
