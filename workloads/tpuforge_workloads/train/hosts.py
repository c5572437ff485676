"""One training program on one host or on every host of a multi-host slice (JAX multi-controller).

On a multi-host slice the operator runs one pod per TPU VM host (a JobSet) and sets, in each pod:

    TPUFORGE_NUM_PROCESSES        the slice's hosts
    TPUFORGE_PROCESS_ID           this pod's completion index, 0 .. hosts-1 (the JAX process id)
    TPUFORGE_COORDINATOR_ADDRESS  process 0's host:port (the JobSet's DNS name of its pod)

Without them the run is one process, exactly as on a single host; every function here is then a no-op or
a local answer, so the trainer has one code path for 1 and N processes.

`TPUFORGE_JOIN_TIMEOUT_SECONDS` (the operator sets it from spec.tpu.joinTimeoutSeconds; default 1800) bounds
the wait for every host to come up: on a big slice hosts start minutes apart, each pulling the trainer image.
Past it every host fails naming the missing ones
(rollcall.py, which also joins the slice: `rollcall.initialize`).

`TPUFORGE_METRICS_PORT`, when set, overrides the config's metrics port for this pod: on GKE every pod has its
own address (the sandbox gives each host's pod its own loopback address), but trainer processes started by
hand on one machine share one, and need a port each.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The pod environment the operator sets on every host of a JobSet (one definition, in the contract).
from tpuforge.api.constants import (
    ENV_COORDINATOR_ADDRESS,
    ENV_JOIN_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    JOIN_TIMEOUT_SECONDS,
)
from tpuforge_workloads.runtime import termination

log = logging.getLogger(__name__)

ENV_METRICS_PORT = "TPUFORGE_METRICS_PORT"
# A host waits this long at an agreement for the slowest one; the first comes after model load, which
# differs between hosts by their download time. A host that dies fails the others' wait sooner: the
# coordination service reports it.
AGREEMENT_TIMEOUT_MS = 60 * 60 * 1000
# Set by a host that stops before the training loop (a SIGTERM while loading): the others stop too, instead
# of waiting for it at their first agreement.
STOPPED_KEY = "tpuforge/stopped-before-training"
# Set by each host once it has written everything it writes, as it leaves (see `leave`).
LEFT_KEY = "tpuforge/left/"
# How long a leaving host waits for the others to be done too. They normally end within seconds of each
# other; one whose main thread is stuck in a collective is finished from another thread after
# PEER_STOP_GRACE_S (train/__main__.py).
LEAVE_TIMEOUT_S = 60.0


class HostsError(ValueError):
    """The multi-host environment is inconsistent (names the variable)."""


class PeerStopped(Exception):
    """Another host stopped before training: this host's first agreement can never complete."""


_peer_stopped = threading.Event()
_leaving = threading.Lock()


@dataclass(frozen=True)
class Hosts:
    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None
    join_timeout_s: int = JOIN_TIMEOUT_SECONDS

    @property
    def primary(self) -> bool:
        """Process 0: the one that reports the job's progress and writes job-level files and metrics."""
        return self.process_id == 0

    @property
    def multi(self) -> bool:
        return self.num_processes > 1

    def __str__(self) -> str:
        return f"process {self.process_id} of {self.num_processes}" if self.multi else "single process"


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise HostsError(f"{name}={raw!r} is not an integer") from None


def from_env(env: Mapping[str, str] = os.environ) -> Hosts:
    """This pod's place in the slice, from the environment the operator sets (see the module doc)."""
    count = _int(env, ENV_NUM_PROCESSES)
    if count is None or count == 1:
        return Hosts()
    if count < 1:
        raise HostsError(f"{ENV_NUM_PROCESSES}={count} must be at least 1")
    pid = _int(env, ENV_PROCESS_ID)
    if pid is None or not 0 <= pid < count:
        raise HostsError(f"{ENV_PROCESS_ID}={env.get(ENV_PROCESS_ID)!r} must be set to 0 .. {count - 1}")
    coordinator = env.get(ENV_COORDINATOR_ADDRESS, "").strip()
    if not coordinator:
        raise HostsError(f"{ENV_COORDINATOR_ADDRESS} must name process 0's host:port when {ENV_NUM_PROCESSES}>1")
    _, _, port = coordinator.rpartition(":")
    if not port.isdigit():
        raise HostsError(f"{ENV_COORDINATOR_ADDRESS}={coordinator!r} must end with :PORT")
    timeout = _int(env, ENV_JOIN_TIMEOUT)
    if timeout is not None and timeout < 1:
        raise HostsError(f"{ENV_JOIN_TIMEOUT}={timeout} must be at least 1 (seconds)")
    return Hosts(pid, count, coordinator, JOIN_TIMEOUT_SECONDS if timeout is None else timeout)


def metrics_port(config_port: int, env: Mapping[str, str] = os.environ) -> int:
    port = _int(env, ENV_METRICS_PORT)
    return config_port if port is None else port


def announce_stop(hosts: Hosts) -> None:
    """Tell the other hosts that this one stops before training (see `on_peer_stop`)."""
    if not hosts.multi or _client_or_none() is None:
        return
    try:
        _client().key_value_set(STOPPED_KEY, str(hosts.process_id))
    except Exception as e:  # another host announced first (the key exists), or the coordinator is gone
        log.info("not announcing this host's stop: %s", " ".join(str(e).split())[:200])


def on_peer_stop(hosts: Hosts, callback: Callable[[int], None]) -> None:
    """Once another host has announced that it stops, make agreements raise PeerStopped and call
    `callback(process_id)`, from a daemon thread."""
    if not hosts.multi:
        return
    client = _client()

    def wait() -> None:
        try:
            who = int(client.blocking_key_value_get(STOPPED_KEY, AGREEMENT_TIMEOUT_MS))
        except Exception:  # no host stopped within the hour, or this one is leaving
            return
        if who != hosts.process_id:
            _peer_stopped.set()
            callback(who)

    threading.Thread(target=wait, name="peer-stop", daemon=True).start()


def leave(hosts: Hosts, code: int, timeout_s: float = LEAVE_TIMEOUT_S) -> None:
    """End the process with `code`, on a multi-host slice only once every host has written what it writes.

    JAX's coordination client aborts its process (SIGABRT) as soon as another host disappears without a clean
    shutdown, or the coordinator (process 0) goes: a host that simply exits kills the others, even in the
    middle of writing their checkpoint lookup or termination message. So each host says it is done (a key),
    waits for the others to say so, and then all shut the client down together (JAX's shutdown barrier, which
    aborts everyone if a host never comes, hence the keys first). A host still missing after `timeout_s` is
    stuck: this one then exits without the shutdown. Returns only on a single host."""
    if not hosts.multi or _client_or_none() is None:
        return
    if not _leaving.acquire(blocking=False):
        threading.Event().wait()  # another thread of this process is leaving: it ends the process
    client = _client()
    deadline = time.monotonic() + timeout_s
    missing: list[int] = []
    try:
        client.key_value_set(f"{LEFT_KEY}{hosts.process_id}", str(code))
        for other in range(hosts.num_processes):
            if other == hosts.process_id:
                continue
            try:
                client.blocking_key_value_get(f"{LEFT_KEY}{other}", max(1, int((deadline - time.monotonic()) * 1000)))
            except Exception:
                missing.append(other)
    except Exception as e:
        log.warning("leaving the slice without the others: %s", " ".join(str(e).split())[:300])
        termination.exit_now(code)
    if missing:
        log.warning("processes %s not done after %.0f s: exiting without them", missing, timeout_s)
    else:
        import jax

        jax.distributed.shutdown()  # type: ignore[no-untyped-call]
    termination.exit_now(code)


def _client_or_none() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def _client() -> Any:
    # The coordination service's key-value store and barriers: host-side RPCs to process 0, so agreeing
    # never waits for the devices (a device collective would queue behind the step in flight).
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized")
    return client


class Agreement:
    """Agreements between the hosts, in the same order on every host: `any(flag)` is True on every host
    when it was True on at least one. One host's SIGTERM thereby stops all of them at the same step."""

    def __init__(self, hosts: Hosts, name: str):
        self.hosts = hosts
        self.name = name
        self._round = 0

    def any(self, flag: bool) -> bool:
        if not self.hosts.multi:
            return flag
        client = _client()
        key = f"tpuforge/{self.name}/{self._round}"
        self._round += 1
        if flag:
            client.key_value_set(f"{key}/flags/{self.hosts.process_id}", "1")
        _wait_unless_peer_stopped(lambda: client.wait_at_barrier(f"{key}/barrier", AGREEMENT_TIMEOUT_MS))
        return bool(client.key_value_dir_get(f"{key}/flags/"))


def _wait_unless_peer_stopped(wait: Callable[[], None]) -> None:
    """`wait()` in a helper thread; raises PeerStopped if another host stops before training meanwhile (it
    would never come). The main thread thereby stays where signals and PeerStopped reach it."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            wait()
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="agreement", daemon=True).start()
    while not done.wait(0.25):
        if _peer_stopped.is_set():
            raise PeerStopped("another host stopped before training started")
    if errors:
        raise errors[0]
