"""Joining the slice (`initialize`): a roll call over the coordinator's own port, which names the hosts that
did not come, then `jax.distributed.initialize`.

JAX's join has a timeout, but when it expires it aborts the process (SIGABRT, exit 134) with
"DEADLINE_EXCEEDED ... RegisterTask" and no word of which host was missing. On a big slice hosts start
minutes apart (each pulls the trainer image), and one that never comes (a node that did not get its image, a
pod stuck Pending) should be named. So process 0 first listens on the coordinator's port (the one the
NetworkPolicies and the JobSet's DNS name already allow) and the others say their process id there; when all
have, process 0 says "go", everyone closes, and JAX's coordination service takes the port. When the join
timeout passes first, every host raises HostsError naming the missing process ids (process 0 tells the hosts
that came which ones did not; a host that never reached process 0 says so, with the address it tried).
"""

from __future__ import annotations

import logging
import socket
import time

from tpuforge.api.constants import ENV_JOIN_TIMEOUT
from tpuforge_workloads.train.hosts import Hosts, HostsError

log = logging.getLogger(__name__)

HELLO = "tpuforge-rollcall"
RETRY_S = 1.0  # between attempts to reach process 0 (it may start minutes after this host)


def _port(hosts: Hosts) -> tuple[str, int]:
    host, _, port = (hosts.coordinator or "").rpartition(":")
    return host.strip("[]"), int(port)


def roll_call(hosts: Hosts, timeout_s: float) -> None:
    """Return once every host of the slice is up; raise HostsError naming the missing ones after `timeout_s`."""
    if not hosts.multi:
        return
    started = time.monotonic()
    if hosts.primary:
        _call(hosts, started + timeout_s, timeout_s)
    else:
        _answer(hosts, started + timeout_s, timeout_s)
    log.info("every host is up (roll call: %.1f s)", time.monotonic() - started)


# Where the join timeout comes from, as the messages name it.
_SETTING = f"spec.tpu.joinTimeoutSeconds, pod env {ENV_JOIN_TIMEOUT}"


def _missing_message(missing: list[int], hosts: Hosts, timeout_s: float) -> str:
    names = ", ".join(str(i) for i in missing)
    return (
        f"process{'es' if len(missing) > 1 else ''} {names} of {hosts.num_processes} did not join the slice within "
        f"{timeout_s:.0f} s ({_SETTING}): see why those pods did not start (kubectl describe pod: image pull, "
        "scheduling)"
    )


def _call(hosts: Hosts, deadline: float, timeout_s: float) -> None:
    _, port = _port(hosts)
    if socket.has_dualstack_ipv6():
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    else:
        server = socket.create_server(("", port))
    came: dict[int, socket.socket] = {}
    try:
        server.settimeout(0.5)
        while len(came) < hosts.num_processes - 1 and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            try:
                word, _, pid = conn.recv(64).decode().strip().partition(" ")
                if word != HELLO or not pid.isdigit():
                    raise ValueError(word)
            except (OSError, ValueError, UnicodeDecodeError):
                conn.close()  # not one of ours (a probe): ignore it
                continue
            came[int(pid)] = conn
        missing = [i for i in range(1, hosts.num_processes) if i not in came]
        reply = f"missing {','.join(map(str, missing))}\n" if missing else "go\n"
        for conn in came.values():
            try:
                conn.sendall(reply.encode())
                conn.recv(1)  # the other side closes first: the port is then free for JAX at once
            except OSError:
                pass
        if missing:
            raise HostsError(_missing_message(missing, hosts, timeout_s))
    finally:
        for conn in came.values():
            conn.close()
        server.close()


def _answer(hosts: Hosts, deadline: float, timeout_s: float) -> None:
    address = _port(hosts)
    reached = False
    while time.monotonic() < deadline:
        try:
            conn = socket.create_connection(address, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        except OSError:
            time.sleep(RETRY_S)
            continue
        reached = True
        with conn:
            try:
                conn.sendall(f"{HELLO} {hosts.process_id}\n".encode())
                conn.settimeout(max(0.1, deadline - time.monotonic() + 5))
                reply = conn.recv(256).decode().strip()
            except (OSError, UnicodeDecodeError):
                continue
        if reply == "go":
            return
        if reply.startswith("missing "):
            missing = [int(i) for i in reply.removeprefix("missing ").split(",") if i]
            raise HostsError(_missing_message(missing, hosts, timeout_s))
        time.sleep(RETRY_S)  # process 0 went away mid-call (restarted): try again
    where = "answered but did not finish the roll call" if reached else "could not be reached"
    raise HostsError(
        f"process 0 of {hosts.num_processes} (coordinator {hosts.coordinator}) {where} within {timeout_s:.0f} s "
        f"({_SETTING}): see why that pod did not start (kubectl describe pod: image pull, scheduling)"
    )


def initialize(hosts: Hosts) -> None:
    """Join the slice's processes; must run before anything else touches JAX's backends."""
    if not hosts.multi:
        return
    import jax

    # Cross-process collectives on CPU (the sandbox and the tests); TPUs have their own interconnect.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    # JAX's own preemption service would take SIGTERM from our handler (preemption.py); Agreement does its job.
    jax.config.update("jax_enable_preemption_service", False)  # type: ignore[no-untyped-call]
    roll_call(hosts, hosts.join_timeout_s)  # names the missing hosts; JAX's own timeout just aborts
    jax.distributed.initialize(
        hosts.coordinator, hosts.num_processes, hosts.process_id, initialization_timeout=hosts.join_timeout_s
    )
    log.info("joined the slice as %s (coordinator %s): %d devices", hosts, hosts.coordinator, jax.device_count())
