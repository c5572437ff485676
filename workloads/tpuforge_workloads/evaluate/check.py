"""python -m tpuforge_workloads.evaluate.check --samples S --out V --timeout T --memory BYTES [--parallel N]
    [--scratch DIR] -- COMMAND...
python -m tpuforge_workloads.evaluate.check --serve SPOOL --timeout T --memory BYTES [--parallel N]
    [--scratch DIR] -- COMMAND...

Runs the checker on each sample, up to N at once, each in a fresh scratch directory under a user id of its own,
confined by evaluate.jail. The checker protocol (docs/ml-engineer.md):
  - in the scratch directory (the working directory, also HOME and TMPDIR): sample.txt, the code taken from
    the answer; test.json, the record's test object as it is; and each entry of the test's "files" object
    (name -> text) as a file of that name. These inputs belong to root and are read-only; the directory is
    sticky, so the sample may add files beside them but not replace them;
  - exit code 0 means the sample passes; anything else (a nonzero exit, a signal, the timeout, a limit) fails.
    Exit codes name the failure for the report: 1 the test failed (a mismatch), 3 it did not compile, 4 a
    syntax error, 5 the checker refused the sample (e.g. evaluate.verilog's rules), 6 the problem itself is
    broken (its own reference does not compile with this checker: a problem of the task set, kept out of
    pass@k); any other is an error. A line "simulator: <name and version>" in the checker's stderr is kept
    in the verdict as its `simulator`;
  - the first OUTPUT_KEPT bytes of stdout and of stderr are kept in the report.
A sample that hangs, forks without end, eats memory, writes too much or outside its directory, leaves a
process behind or crashes fails with a verdict saying so, and the next sample runs as if it had not been
there. Each verdict carries a `failure` category: syntax, compile, mismatch, timeout, refused, limit or error.

The runner must start as root with CAP_SETUID and CAP_SETGID (the evaluation pod's `check` container gets
exactly these and no other capability); it refuses to run otherwise, since samples sharing its uid could
forge their verdicts. With CAP_SYS_ADMIN as well (the sandbox's node agent), samples also get read-only mounts
and no network namespace.

S is JSONL: {"id": ..., "code": "...", "test": {...}} per sample; V gets one line per sample:
{"id", "passed", "verdict", "failure", "exitCode", "seconds", "peakMemory", "stdout", "stderr",
"simulator", "uid"} (uid: the one it ran as, null if it did not run). Stdlib only (the checker image).

With --serve, the checker stays up beside a trainer (GRPO's sidecar; `serve`): the trainer writes each batch
of samples as SPOOL/requests/<name>.jsonl (a temporary name renamed into place), the checker writes its
verdicts as SPOOL/verdicts/<name>.jsonl the same way, and keeps SPOOL/verdicts/alive fresh every second so
that the trainer can tell a dead checker from a slow one. It stops on SPOOL/requests/stop, on SIGTERM (the
kubelet ending a sidecar after the trainer) or when its parent process goes away.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuforge_workloads.evaluate.jail import Limits, can_change_uid, can_use_namespaces, isolation

SAMPLE_FILE = "sample.txt"
TEST_FILE = "test.json"
OUTPUT_KEPT = 2048  # bytes of stdout and of stderr kept per sample in the report
# Each sample runs as a uid drawn from here, fresh for it: no account, file or other process has it.
SAMPLE_UIDS = (1_000_000, 2_000_000_000)
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# The checker protocol's exit codes (see the docstring) and the failure each names.
EXIT_MISMATCH, EXIT_COMPILE, EXIT_SYNTAX, EXIT_REFUSED, EXIT_TASK = 1, 3, 4, 5, 6
FAILURES = ("syntax", "compile", "mismatch", "timeout", "refused", "limit", "task", "error")
_BY_EXIT = {
    EXIT_MISMATCH: "mismatch", EXIT_COMPILE: "compile", EXIT_SYNTAX: "syntax", EXIT_REFUSED: "refused",
    EXIT_TASK: "task",
}  # fmt: skip
# The checker names the program that judged the sample (e.g. its simulator and version) on a stderr line.
_SIMULATOR = re.compile(r"^simulator: (?P<name>.+)$", re.MULTILINE)
# The runner cannot confine samples as it is: as evaluate.sample's, so the Job fails at once, not retried.
EXIT_CANNOT_CONFINE = 2
# The package root, for checkers that are modules of this package (evaluate.verilog): on the samples' path.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Verdict:
    id: str
    passed: bool
    verdict: str  # passed | failed (exit N) | timed out after T s | killed by SIGxxx (why) | not run: why
    failure: str | None  # None when passed, else one of FAILURES
    exit_code: int | None
    seconds: float
    peak_memory: int
    stdout: str
    stderr: str
    simulator: str = ""  # what judged it, as the checker says (Verilog: the iverilog version)
    uid: int | None = None  # the fresh uid it ran as (its processes' owner), None when it did not run

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["exitCode"] = out.pop("exit_code")
        out["peakMemory"] = out.pop("peak_memory")
        return out


_SIGNAL_WHY = {
    signal.SIGXFSZ: "a file or its output passed the size limit",
    signal.SIGXCPU: "CPU time limit",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "crashed (or out of memory)",
    signal.SIGABRT: "aborted (or out of memory)",
}
_LIMIT_SIGNALS = {signal.SIGXFSZ, signal.SIGXCPU, signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL}


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and name not in (SAMPLE_FILE, TEST_FILE)


def write_inputs(scratch: Path, code: str, test: Any) -> None:
    """The protocol's files, read-only: sample.txt, test.json and test.files. Raises ValueError for a bad
    file name."""
    files = test.get("files", {}) if isinstance(test, dict) else {}
    if not isinstance(files, dict):
        raise ValueError("test.files must be an object of file name -> text")
    for name, text in files.items():
        if not _safe_name(name) or not isinstance(text, str):
            raise ValueError(f"test.files[{name!r}]: a plain file name (no '/') with text content")
    for name, text in [(SAMPLE_FILE, code), (TEST_FILE, json.dumps(test)), *files.items()]:
        path = scratch / name
        path.write_text(text, encoding="utf-8")
        path.chmod(0o444)


def _head(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(OUTPUT_KEPT + 1)
    except OSError:
        return ""
    text = data[:OUTPUT_KEPT].decode("utf-8", errors="replace")
    return text + ("\n[... cut]" if len(data) > OUTPUT_KEPT else "")


def _signal(number: int) -> str:
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"signal {number}"
    return f"{sig.name} ({_SIGNAL_WHY.get(sig, 'signal')})"


def describe(outcome: dict[str, Any], limits: Limits) -> tuple[str, str | None]:
    """(verdict, failure) from the launcher's outcome (evaluate.jail.Outcome)."""
    code = outcome["exit_code"]
    if outcome["error"]:
        return f"not run: {outcome['error']}", "error"
    if outcome["memory_exceeded"]:
        return f"killed: its processes passed the memory limit ({limits.memory_bytes >> 20} MiB)", "limit"
    if outcome["timed_out"]:
        return f"timed out after {limits.timeout_seconds:g} s", "timeout"
    if code is not None and code < 0:
        return f"killed by {_signal(-code)}", "limit" if -code in _LIMIT_SIGNALS else "error"
    if code is not None and 128 < code < 128 + 65:
        # A shell's way of saying that a command it ran died of a signal.
        failure = "limit" if code - 128 in _LIMIT_SIGNALS else "error"
        return f"failed (exit {code}: a process it ran was killed by {_signal(code - 128)})", failure
    if code != 0:
        return f"failed (exit {code})", _BY_EXIT.get(code or 0, "error")
    if outcome["left"]:
        return "failed (exit 0, but it left processes running: killed)", "refused"
    if outcome["outside"]:
        where = ", ".join(outcome["outside"][:3])
        return f"failed (exit 0, but it wrote outside its scratch directory: {where}; removed)", "refused"
    return "passed", None


class Runner:
    """Runs samples, each under a fresh uid in a fresh directory under `root`."""

    def __init__(self, command: list[str], limits: Limits, root: Path) -> None:
        self.command = command
        self.limits = limits
        self.root = root
        self.namespaces = can_use_namespaces()
        self._uids: set[int] = set()
        self._random = random.SystemRandom()

    def _fresh_uid(self) -> int:
        while True:
            uid = self._random.randrange(*SAMPLE_UIDS)
            if uid not in self._uids:
                self._uids.add(uid)
                return uid

    def run(self, sample_id: str, code: str, test: Any) -> Verdict:
        """Run the checker once on one sample; never raises for what the sample does."""
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="sample-", dir=self.root))  # 0700 until the inputs are in
        cwd, out = work / "run", work / "out"
        cwd.mkdir()
        out.mkdir(mode=0o700)
        try:
            try:
                write_inputs(cwd, code, test)
            except ValueError as e:
                return Verdict(sample_id, False, f"not run: {e}", "error", None, 0.0, 0, "", "")
            cwd.chmod(0o1777)  # the sample adds files; the sticky bit keeps root's inputs in place
            work.chmod(0o711)  # passable, not listable
            uid = self._fresh_uid()
            env = {**ENV, "HOME": str(cwd), "TMPDIR": str(cwd), "PYTHONPATH": PACKAGE_ROOT}
            launcher = [
                sys.executable, "-m", "tpuforge_workloads.evaluate.jail", "--uid", str(uid), "--cwd", str(cwd),
                "--stdout", str(out / "stdout"), "--stderr", str(out / "stderr"),
                "--timeout", f"{self.limits.timeout_seconds:g}", "--memory", str(self.limits.memory_bytes),
                "--processes", str(self.limits.max_processes),
                *(["--namespaces"] if self.namespaces else []),
                *(f"--env={k}={v}" for k, v in env.items()), "--", *self.command,
            ]  # fmt: skip
            proc = subprocess.run(launcher, capture_output=True, text=True, check=False)
            try:
                outcome = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                outcome = {"error": f"the launcher failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"}
            verdict, failure = describe({"exit_code": None, **outcome}, self.limits)
            stderr = _head(out / "stderr")
            said = _SIMULATOR.search(stderr)
            return Verdict(
                sample_id,
                failure is None,
                verdict,
                failure,
                outcome.get("exit_code"),
                round(time.monotonic() - started, 3),
                int(outcome.get("peak_rss") or 0),
                _head(out / "stdout"),
                stderr,
                said.group("name").strip() if said else "",
                uid,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _not_world_writable(path: Path) -> None:
    """A directory of the runner's that a sample's uid could otherwise write to (an emptyDir is 0777). A
    sticky one (a machine's /tmp) is shared on purpose and left as it is."""
    mode = path.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX and path.stat().st_uid == os.geteuid():
        path.chmod(stat.S_IMODE(mode) & ~stat.S_IWOTH & ~stat.S_IWGRP)


def scratch_root(root: Path) -> Path:
    """Where the samples' scratch directories go: `root` when every directory above it lets other users pass
    (a sample runs as its own uid), else a fresh directory under /tmp. Not writable by anyone else."""
    root.mkdir(parents=True, exist_ok=True)
    resolved = root.resolve()
    if not all(d.stat().st_mode & stat.S_IXOTH for d in [resolved, *resolved.parents]):
        fallback = Path(tempfile.mkdtemp(prefix="tpuforge-check-", dir="/tmp"))
        print(f"--scratch {root} is not reachable by the samples' uids; using {fallback}", file=sys.stderr)
        root = fallback
    root.chmod(0o711)
    return root


def check_all(runner: Runner, samples: list[dict[str, Any]], pool: ThreadPoolExecutor) -> list[Verdict]:
    """Each sample ({id, code, test}) run by `runner`, as many at once as `pool` has workers; in order."""
    return list(pool.map(lambda s: runner.run(str(s["id"]), s["code"], s["test"]), samples))


def run_all(
    samples: list[dict[str, Any]], command: list[str], limits: Limits, root: Path, parallel: int = 1
) -> list[Verdict]:
    runner = Runner(command, limits, scratch_root(root))
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return check_all(runner, samples, pool)


def write_verdicts(path: Path, verdicts: list[Verdict]) -> None:
    """All at once, through a new file renamed over `path`: whatever a sample put at that name is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _not_world_writable(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=".verdicts-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("".join(json.dumps(v.to_json()) + "\n" for v in verdicts))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# ---- beside a trainer: the spool (--serve) -------------------------------------------------------------------

SPOOL_REQUESTS = "requests"  # the trainer's: batches of samples, and the stop marker
SPOOL_VERDICTS = "verdicts"  # the checker's: a verdict file per batch, and the heartbeat
SPOOL_STOP = "stop"
SPOOL_ALIVE = "alive"
HEARTBEAT_SECONDS = 1.0
SPOOL_POLL_SECONDS = 0.05


def write_atomically(path: Path, text: str) -> None:
    """`text` at `path` through a temporary file renamed into place: a reader sees all of it or nothing."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _spool_dirs(spool: Path) -> tuple[Path, Path]:
    """The spool's two directories. Its root is shared with the trainer (an emptyDir, 0777): made sticky, so a
    sample's uid (which could reach it) can neither remove nor replace what the trainer or the checker put
    there; verdicts/ is the checker's, not writable by anyone else."""
    spool.mkdir(parents=True, exist_ok=True)
    mode = spool.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX and spool.stat().st_uid == os.geteuid():
        spool.chmod(stat.S_IMODE(mode) | stat.S_ISVTX)
    verdicts = spool / SPOOL_VERDICTS
    verdicts.mkdir(mode=0o755, exist_ok=True)
    _not_world_writable(verdicts)
    return spool / SPOOL_REQUESTS, verdicts


def _read_request(path: Path) -> list[dict[str, Any]]:
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for s in samples:
        if not isinstance(s, dict) or not {"id", "code", "test"} <= set(s):
            raise ValueError("each line must be an object with id, code and test")
    return samples


def serve(
    spool: Path, command: list[str], limits: Limits, scratch: Path, parallel: int, stop: threading.Event | None = None
) -> int:
    """Check every batch the trainer puts in spool/requests, `parallel` samples at once, until spool/requests/stop
    appears, `stop` is set (SIGTERM) or the parent process goes away. Returns the number of batches checked."""
    stop = stop or threading.Event()
    requests, verdicts = _spool_dirs(spool)
    runner = Runner(command, limits, scratch_root(scratch))
    parent = os.getppid()
    alive = json.dumps({"pid": os.getpid(), "parallel": parallel})

    def heartbeat() -> None:
        while not stop.is_set():
            write_atomically(verdicts / SPOOL_ALIVE, alive)
            stop.wait(HEARTBEAT_SECONDS)

    beat = threading.Thread(target=heartbeat, name="heartbeat", daemon=True)
    beat.start()
    # A checker restarted beside the same trainer: the verdicts it wrote before stay until the trainer has
    # read them; those read already go.
    done = {v.name for v in verdicts.glob("*.jsonl")}
    for name in [n for n in done if not (requests / n).exists()]:
        (verdicts / name).unlink(missing_ok=True)
        done.discard(name)
    batches = 0
    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            while not stop.is_set() and os.getppid() == parent and not (requests / SPOOL_STOP).exists():
                pending = sorted(p for p in requests.glob("*.jsonl") if p.name not in done) if requests.is_dir() else []
                for request in pending:
                    started = time.monotonic()
                    try:
                        samples = _read_request(request)
                    except (OSError, ValueError) as e:
                        write_atomically(verdicts / request.name, json.dumps({"error": f"{request.name}: {e}"}) + "\n")
                    else:
                        write_verdicts(verdicts / request.name, check_all(runner, samples, pool))
                        print(f"{request.name}: {len(samples)} samples in {time.monotonic() - started:.1f} s")
                    done.add(request.name)
                    batches += 1
                # A verdict the trainer has read (it removed its request) is removed too.
                for name in [n for n in done if not (requests / n).exists()]:
                    (verdicts / name).unlink(missing_ok=True)
                    done.discard(name)
                if not pending:
                    stop.wait(SPOOL_POLL_SECONDS)
    finally:
        stop.set()
        beat.join()
        (verdicts / SPOOL_ALIVE).unlink(missing_ok=True)
    return batches


def cannot_confine() -> str | None:
    """Why this process cannot run samples under uids of their own, or None."""
    if os.geteuid() != 0 or not can_change_uid():
        return (
            f"the checker runs each sample under a user id of its own and needs to start as root with "
            f"CAP_SETUID and CAP_SETGID (the evaluation pod tpuforge writes grants exactly these); it runs as uid "
            f"{os.geteuid()} without them: an admission policy or a mutating webhook changed the `check` "
            f"container's securityContext; exempt it (runAsUser: 0, capabilities.add: [SETUID, SETGID])"
        )
    return unreadable_source(Path(PACKAGE_ROOT))


def unreadable_source(root: Path) -> str | None:
    """Why the samples' uids cannot import the checker's own modules from `root` (every directory above it must
    let other users pass, and `root` itself be readable), or None. Without this every sample would fail with an
    ImportError, blamed on the sample."""
    shut = [d for d in [root, *root.parents] if not d.stat().st_mode & stat.S_IXOTH]
    if not root.stat().st_mode & stat.S_IROTH:
        shut.insert(0, root)
    if not shut:
        return None
    return (
        f"the checker runs each sample under a user id of its own, which imports the checker's modules from "
        f"{root}; {shut[0]} does not let other users in (mode {stat.S_IMODE(shut[0].stat().st_mode):o}): "
        f"chmod o+rx it, or install the project where other users can read it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_workloads.evaluate.check", description=__doc__)
    parser.add_argument("--samples", help="JSONL of {id, code, test}")
    parser.add_argument("--out", help="JSONL of verdicts, one per sample")
    parser.add_argument("--serve", metavar="SPOOL", help="stay up and check the batches a trainer puts in SPOOL")
    parser.add_argument("--timeout", type=float, required=True, help="seconds per sample")
    parser.add_argument("--memory", type=int, required=True, help="memory of each sample's processes, bytes")
    parser.add_argument("--parallel", type=int, default=1, help="samples checked at once")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="where scratch directories go")
    parser.add_argument("command", nargs="+", help="the checker command")
    args = parser.parse_args(argv)
    if not args.serve and not (args.samples and args.out):
        parser.error("give --samples and --out, or --serve")
    why = cannot_confine()
    if why is not None:
        print(why, file=sys.stderr)
        return EXIT_CANNOT_CONFINE
    limits = Limits(timeout_seconds=args.timeout, memory_bytes=args.memory)
    if args.serve:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        scratch = Path(args.scratch)
        if scratch.resolve().parent.is_dir():
            _not_world_writable(scratch.resolve().parent)  # the checker's own volume, before any sample runs
        print(
            f"checking the batches in {args.serve}, {args.parallel} samples at once; "
            f"isolation: {', '.join(isolation(can_use_namespaces()))}"
        )
        batches = serve(Path(args.serve), args.command, limits, scratch, args.parallel, stop)
        print(f"stopped after {batches} batches")
        return 0
    for volume in {Path(args.scratch).resolve().parent, Path(args.out).resolve().parent.parent}:
        if volume.is_dir():
            _not_world_writable(volume)  # the checker's own volume, before any sample runs
    samples = [json.loads(line) for line in Path(args.samples).read_text().splitlines() if line.strip()]
    started = time.monotonic()
    verdicts = run_all(samples, args.command, limits, Path(args.scratch), args.parallel)
    write_verdicts(Path(args.out), verdicts)
    passed = sum(v.passed for v in verdicts)
    print(
        f"{passed}/{len(verdicts)} samples passed in {time.monotonic() - started:.1f} s, {args.parallel} at once; "
        f"isolation: {', '.join(isolation(can_use_namespaces()))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
