"""Background processes the sandbox starts, each with a pidfile and a log, stopped by pid only.

A pidfile alone can point at a reused pid, so a process counts as ours only while its command line still
contains the sandbox's state directory (every component is given a path under it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # The servers set SO_REUSEADDR too, so a socket in TIME_WAIT does not count as taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child still answers kill(0): reap it
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def stop_pid(pid: int, timeout: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """`sig`, then SIGKILL after `timeout` seconds if the process is still there."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(100):
        if not pid_alive(pid):
            return
        time.sleep(0.05)


# Resolved once here: a preexec_fn runs between fork and exec, where loading a library is not safe.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def pdeathsig(sig: int) -> Callable[[], None]:
    """A preexec_fn after which the child gets `sig` when the thread that started it dies."""

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


@dataclass(frozen=True)
class Daemon:
    """One component: `<run>/<name>.pid` and `<logs>/<name>.log`."""

    name: str
    run_dir: Path
    logs_dir: Path
    marker: str  # must appear in the process's command line

    @property
    def pidfile(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log(self) -> Path:
        return self.logs_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid when the process is running and is ours, else None (and a stale pidfile is removed)."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        # Just after exec the kernel can show an empty command line for a moment: look again.
        for _ in range(50):
            if not pid_alive(pid):
                break
            line = cmdline(pid)
            if line:
                if self.marker in line:
                    return pid
                break
            time.sleep(0.01)
        self.pidfile.unlink(missing_ok=True)
        return None

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None, attach: bool = False) -> int:
        """Start detached (own session, survives the caller) unless `attach`, in which case the process dies
        with its parent."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        # attached: dies with its parent (test sandboxes, so a killed pytest leaves nothing running)
        preexec = pdeathsig(signal.SIGTERM) if attach else None
        with open(self.log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=preexec,  # only prctl: safe between fork and exec
                close_fds=True,
            )
        self.pidfile.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop it if it runs; True when something was stopped."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        stop_pid(pid, timeout)
        self.pidfile.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
