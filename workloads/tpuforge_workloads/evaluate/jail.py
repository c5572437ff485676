"""python -m tpuforge_workloads.evaluate.jail --uid U --cwd DIR --stdout F --stderr F --timeout T --memory B
    [--namespaces] -- COMMAND...

Runs one checked sample, confined, and prints what happened as one JSON line (the runner, evaluate.check, reads
it). The sample gets a user id of its own, fresh for this sample and used by nothing else; that is what holds
it on a GKE node, where the checker container has no namespaces to give and starts as root with two
capabilities only (CAP_SETUID, CAP_SETGID: enough to become that uid, nothing else):
  - its own session, and resource limits that belong to its uid alone: processes (RLIMIT_NPROC counts per
    uid, so a fresh uid counts the sample's processes only, not the node's), address space per process, file
    size (stdout and stderr included), CPU time, open files, no core dumps;
  - a memory watch: the resident memory of all the sample's processes together, read every few milliseconds;
    past --memory every one is killed. The runner sizes --memory below the container's limit, so a greedy
    sample fails alone instead of taking the container (and the whole evaluation) with it;
  - a seccomp filter under which any socket but a Unix one fails (x86_64 and arm64): no network, whatever
    the pod's network allows;
  - the end: this launcher is a child subreaper, so whatever the sample starts (setsid, double forks) stays
    below it; when the sample's first process ends or its time is up, every process of its uid is killed
    (kill(-1) as that uid, repeated until none is left) and checked after;
  - its files: anything of its uid left in its working directory and in the world-writable places it could
    reach (/tmp, /var/tmp, /dev/shm, ...) is removed, and a file outside its working directory is reported
    (the runner fails such a sample).
With --namespaces (the sandbox's node agent runs pods as root processes with every capability): also a mount
namespace in which every mount is read-only but the working directory, and a network namespace of its own.

Linux only. Stdlib only: the checker image carries Python and this package's stdlib-only modules.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import platform
import resource
import signal
import stat
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21
# Where a sample whose uid owns nothing could still write on a node (besides its working directory).
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")
POLL_SECONDS = 0.01
# exec failed in the sample's process (the command is missing, or the confinement failed): as a shell says.
EXIT_NOT_RUN = 127


@dataclass(frozen=True)
class Limits:
    timeout_seconds: float
    memory_bytes: int  # the sample's processes together (resident), and each one's address space
    max_processes: int = 64
    max_file_bytes: int = 16 << 20  # any one file the sample writes, stdout and stderr included
    max_open_files: int = 256


@dataclass
class Outcome:
    """What happened to one sample, as the launcher prints it."""

    exit_code: int | None = None  # the first process's exit status, or -signal
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss: int = 0
    left: int = 0  # processes still running when the first one ended (then killed)
    outside: list[str] | None = None  # files it left outside its working directory (then removed)
    error: str = ""  # the launcher's own failure, if any


# --- seccomp: a sample may open Unix sockets only ------------------------------------------------------------
# (syscall number of socket(2), the kernel's audit arch).
_SOCKET_SYSCALL = {"x86_64": (41, 0xC000003E), "aarch64": (198, 0xC00000B7)}
_AF_UNIX, _EACCES = 1, 13
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_PR_SET_CHILD_SUBREAPER = 36
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _no_network_filter(socket_nr: int, arch: int) -> list[tuple[int, int, int, int]]:
    """A seccomp program: socket(2) for anything but AF_UNIX fails with EACCES, as does any syscall of another
    ABI (32-bit or x32, which would have other numbers); everything else is allowed."""
    deny, allow = (_RET, 0, 0, _SECCOMP_RET_ERRNO | _EACCES), (_RET, 0, 0, _SECCOMP_RET_ALLOW)
    return [
        (_LD_ABS, 0, 0, 4),  # arch
        (_JEQ, 1, 0, arch),
        deny,
        (_LD_ABS, 0, 0, 0),  # syscall number
        (_JGE, 0, 1, 0x40000000),  # x32
        deny,
        (_JEQ, 0, 3, socket_nr),
        (_LD_ABS, 0, 0, 16),  # first argument: the address family
        (_JEQ, 1, 0, _AF_UNIX),
        deny,
        allow,
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _deny_network(libc: ctypes.CDLL) -> None:
    socket_nr, arch = _SOCKET_SYSCALL[platform.machine()]
    program = _no_network_filter(socket_nr, arch)
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    prog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# --- what this process may do ------------------------------------------------------------------------------
def capabilities() -> int:
    """This process's effective capability set, as a bit mask."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def can_change_uid() -> bool:
    caps = capabilities()
    return bool(caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1)


def can_use_namespaces() -> bool:
    return bool(capabilities() >> CAP_SYS_ADMIN & 1)


def isolation(namespaces: bool) -> list[str]:
    """What confinement samples get, as the runner's summary states it."""
    got = ["own-uid", "session", "rlimits", "memory-watch", "timeout", "kill-by-uid", "cleanup"]
    if platform.machine() in _SOCKET_SYSCALL:
        got.append("no-sockets")
    if namespaces:
        got += ["read-only-mounts", "no-network"]
    return got


# --- in the sample's process, between fork and exec ---------------------------------------------------------
def _mount_points() -> list[str]:
    return [line.split(" ")[1].replace("\\040", " ") for line in Path("/proc/self/mounts").read_text().splitlines()]


def _confine_namespaces(libc: ctypes.CDLL, cwd: str) -> None:
    """Own mount and network namespaces, every mount read-only but the working directory."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    # The working directory becomes a mount of its own, so that remounting its parent read-only spares it.
    if libc.mount(cwd.encode(), cwd.encode(), None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mount {cwd}")
    for point in _mount_points():
        if point != cwd:
            # Some (proc's own submounts, locked ones) refuse: they stay as they are, the rest become read-only.
            libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    os.chdir(cwd)  # entered again, through the writable mount


def _become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _exec_sample(command: list[str], env: dict[str, str], cwd: str, uid: int, limits: Limits, ns: bool) -> None:
    """The sample's first process: never returns."""
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the sample gets the defaults
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        os.chdir(cwd)
        libc = _libc()
        if ns:
            _confine_namespaces(libc, cwd)
        cpu = int(limits.timeout_seconds) + 1
        for kind, value in (
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_NPROC, limits.max_processes),
            (resource.RLIMIT_FSIZE, limits.max_file_bytes),
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_NOFILE, limits.max_open_files),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(kind, (value, value))
        _become(uid)
        if platform.machine() in _SOCKET_SYSCALL:
            _deny_network(libc)
        os.execvpe(command[0], command, env)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"the checker did not start: {type(e).__name__}: {e}\n".encode())
    os._exit(EXIT_NOT_RUN)


# --- around the sample --------------------------------------------------------------------------------------
def processes_of(uid: int) -> list[int]:
    """Every live process of `uid` (zombies, already dead, left out)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    return total


def _as_uid(uid: int, work: object) -> None:
    """Run `work()` in a child process that has become `uid` (its signals and its file permissions), and wait."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _become(uid)
            work()  # type: ignore[operator]
        except BaseException:
            code = 1
        os._exit(code)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _kill_every_process_of_uid() -> None:
    # Every process this uid may signal: its own, and not this one. The killed become zombies until this
    # launcher (their subreaper) reaps them, so one call here, the caller repeating it while any is alive.
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


def reap(keep: int | None = None) -> None:
    """Collect every child that ended (the sample's orphans come here: this process is their subreaper), but
    `keep`, whose status its waiter collects."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def kill_all(uid: int, keep: int | None = None) -> None:
    """Kill every process of `uid`, reaping them (but `keep`), until none is left (a fork bomb forks between
    kills)."""
    for _ in range(50):
        if not processes_of(uid):
            break
        _as_uid(uid, _kill_every_process_of_uid)
        reap(keep)
    reap(keep)


def _remove_tree(path: str) -> None:
    """Remove `path` as its owner: directories made unreadable or read-only by their owner included."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            _remove_tree(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def _files_of(uid: int, top: str, depth: int = 4) -> list[str]:
    """Entries under `top` owned by `uid`, looking only where it could have gone: into `top` and into the
    directories anyone may pass through, `depth` levels down (it writes where anyone may write: below those)."""
    found: list[str] = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return found
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            found.append(entry.path)
        elif depth > 0 and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH:
            found += _files_of(uid, entry.path, depth - 1)
    return found


def clean_up(uid: int, cwd: str) -> list[str]:
    """Remove what the sample's uid left: in its working directory, and in the shared writable places. Returns
    the files it had left outside its working directory."""
    found = [p for top in SHARED_WRITABLE if os.path.isdir(top) for p in _files_of(uid, top)]
    outside = [p for p in found if os.path.commonpath([p, cwd]) != cwd]

    def remove() -> None:
        for path in [*_files_of(uid, cwd, depth=0), *outside]:
            with contextlib.suppress(OSError):
                _remove_tree(path)

    _as_uid(uid, remove)
    return outside


def run(command: list[str], env: dict[str, str], cwd: str, uid: int, limits: Limits, ns: bool,
        stdout: str, stderr: str) -> Outcome:  # fmt: skip
    """Run the sample to its end (or its limits'), then kill and clean up everything of its uid."""
    out = Outcome()
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if processes_of(uid):
        return Outcome(error=f"uid {uid} already has processes: the runner chooses an unused one")
    out_fd = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err_fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        _exec_sample(command, env, cwd, uid, limits, ns)
    for fd in (out_fd, err_fd, null):
        os.close(fd)
    deadline = time.monotonic() + limits.timeout_seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            out.exit_code = os.waitstatus_to_exitcode(status)
            break
        reap(keep=pid)
        rss = resident_bytes(processes_of(uid))
        out.peak_rss = max(out.peak_rss, rss)
        if rss > limits.memory_bytes:
            out.memory_exceeded = True
        elif time.monotonic() > deadline:
            out.timed_out = True
        else:
            time.sleep(POLL_SECONDS)
            continue
        kill_all(uid, keep=pid)
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(pid, 0)
            out.exit_code = os.waitstatus_to_exitcode(status)
        break
    out.left = len(processes_of(uid))
    kill_all(uid)
    still = processes_of(uid)
    if still:
        out.error = f"{len(still)} processes of the sample's uid outlived every kill"
    out.outside = clean_up(uid, cwd)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_workloads.evaluate.jail", description=__doc__)
    parser.add_argument("--uid", type=int, required=True, help="the sample's own uid (and gid)")
    parser.add_argument("--cwd", required=True, help="the sample's working directory")
    parser.add_argument("--stdout", required=True)
    parser.add_argument("--stderr", required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds")
    parser.add_argument("--memory", type=int, required=True, help="bytes, all its processes together")
    parser.add_argument("--processes", type=int, default=Limits.max_processes)
    parser.add_argument("--namespaces", action="store_true", help="read-only mounts and no network namespace")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the sample's environment")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    limits = Limits(timeout_seconds=args.timeout, memory_bytes=args.memory, max_processes=args.processes)
    env = dict(item.split("=", 1) for item in args.env)
    try:
        outcome = run(args.command, env, args.cwd, args.uid, limits, args.namespaces, args.stdout, args.stderr)
    except OSError as e:
        outcome = Outcome(error=f"{type(e).__name__}: {e}")
    print(json.dumps(asdict(outcome)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
