"""The confinement one checked sample runs in, as far as the process running the checker can enforce it.

Always (any user): its own session and process group, resource limits (address space, processes, file
size, CPU time, open files, no core dumps), a wall-clock timeout after which the group is killed, and (on
x86_64 and arm64) a seccomp filter under which opening any socket but a Unix one fails: no network, whatever
the pod's network allows.
When the checker runs as root (the sandbox's emulated node runs pods as local processes; a checker container
never does): a private mount namespace in which every mount is read-only except the sample's scratch
directory, a network namespace of its own (no interface but a loopback that is down), and a user id of its
own, so that when the sample ends every process of that user id is killed, even one that left the group.
In GKE the checker container gets the same from the pod instead: readOnlyRootFilesystem, a non-root user,
and the evaluation's NetworkPolicy denying all egress (docs/sandbox.md lists what differs).

Linux only. Stdlib only: the checker image carries Python and this package's stdlib-only modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


@dataclass(frozen=True)
class Limits:
    timeout_seconds: float
    memory_bytes: int
    max_processes: int = 64
    max_file_bytes: int = 16 << 20  # any one file the sample writes, stdout and stderr included
    max_open_files: int = 256


# seccomp: a sample may open Unix sockets only. (syscall number of socket(2), the kernel's audit arch).
_SOCKET_SYSCALL = {"x86_64": (41, 0xC000003E), "aarch64": (198, 0xC00000B7)}
_AF_UNIX, _EACCES = 1, 13
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
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


def _deny_network(libc: ctypes.CDLL) -> None:
    socket_nr, arch = _SOCKET_SYSCALL[platform.machine()]
    program = _no_network_filter(socket_nr, arch)
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    prog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def isolation_available() -> list[str]:
    """What confinement samples get on this machine, as the report states it."""
    got = ["session", "rlimits", "timeout"]
    if platform.machine() in _SOCKET_SYSCALL:
        got.append("no-sockets")
    if os.geteuid() == 0:
        got += ["own-uid", "read-only-mounts", "no-network"]
    return got


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split(" ")[1].replace("\\040", " ")
        points.append(point)
    return points


def _confine_as_root(libc: ctypes.CDLL, scratch: str, uid: int) -> None:
    """In the child, before exec: own mount and network namespaces, every mount read-only but the scratch
    directory, then the sample's own uid/gid with no supplementary groups."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    # The scratch directory becomes a mount of its own, so that remounting its parent read-only spares it.
    if libc.mount(scratch.encode(), scratch.encode(), None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind-mount {scratch}")
    for point in _mount_points():
        if point == scratch:
            continue
        # Some (proc's own submounts, locked ones) refuse: they stay as they are, the rest become read-only.
        libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    # The working directory was entered before the bind mount: enter it again, through the writable mount.
    os.chdir(scratch)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def preexec(limits: Limits, scratch: str, uid: int | None) -> None:
    """Runs in the child between fork and exec. `uid` set: confine as root first (see the module's docstring)."""
    libc = _libc()
    if uid is not None:
        _confine_as_root(libc, scratch, uid)
    if platform.machine() in _SOCKET_SYSCALL:
        _deny_network(libc)
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


def processes_of(uid: int) -> list[int]:
    """Every live process of `uid` (by /proc; zombies, already dead, left out)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
            pids.append(int(entry.name))
    return pids


def become_subreaper() -> None:
    """Processes a sample orphans are reparented to this one, which reaps them (reap_orphans): a zombie still
    counts against the sample uid's process limit."""
    PR_SET_CHILD_SUBREAPER = 36
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all(pgid: int, uid: int | None) -> int:
    """Kill the sample's process group and, with a uid of its own, every process of that uid (repeated until
    none is left: a fork bomb can fork between one kill and the next). Returns how many were still running."""
    left = 0
    try:
        os.killpg(pgid, 0)
        left = 1
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        for _ in range(100):
            pids = processes_of(uid)
            if not pids:
                break
            left = max(left, len(pids))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            reap_orphans()
    reap_orphans()
    return left
