"""One training program on one host or on every host of a multi-host slice (JAX multi-controller).

On a multi-host slice the operator runs one pod per TPU VM host (a JobSet) and sets, in each pod:

    TPUFORGE_NUM_PROCESSES        the slice's hosts
    TPUFORGE_PROCESS_ID           this pod's completion index, 0 .. hosts-1 (the JAX process id)
    TPUFORGE_COORDINATOR_ADDRESS  process 0's host:port (the JobSet's DNS name of its pod)

Without them the run is one process, exactly as on a single host; every function here is then a no-op or
a local answer, so the trainer has one code path for 1 and N processes.

`TPUFORGE_METRICS_PORT`, when set, overrides the config's metrics port for this pod: on GKE every pod has its
own address (the sandbox gives each host's pod its own loopback address), but trainer processes started by
hand on one machine share one, and need a port each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The pod environment the operator sets on every host of a JobSet (one definition, in the contract).
from tpuforge.api.constants import ENV_COORDINATOR_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID

log = logging.getLogger(__name__)

ENV_METRICS_PORT = "TPUFORGE_METRICS_PORT"
# A host waits this long at an agreement for the slowest one; the first comes after model load, which
# differs between hosts by their download time. A host that dies fails the others' wait sooner: the
# coordination service reports it.
AGREEMENT_TIMEOUT_MS = 60 * 60 * 1000


class HostsError(ValueError):
    """The multi-host environment is inconsistent (names the variable)."""


@dataclass(frozen=True)
class Hosts:
    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None

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
    return Hosts(pid, count, coordinator)


def metrics_port(config_port: int, env: Mapping[str, str] = os.environ) -> int:
    port = _int(env, ENV_METRICS_PORT)
    return config_port if port is None else port


def initialize(hosts: Hosts) -> None:
    """Join the slice's processes; must run before anything else touches JAX's backends."""
    if not hosts.multi:
        return
    import jax

    # Cross-process collectives on CPU (the sandbox and the tests); TPUs have their own interconnect.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    # JAX's own preemption service would take SIGTERM from our handler (preemption.py); Agreement does its job.
    jax.config.update("jax_enable_preemption_service", False)  # type: ignore[no-untyped-call]
    jax.distributed.initialize(hosts.coordinator, hosts.num_processes, hosts.process_id)
    log.info("joined the slice as %s (coordinator %s): %d devices", hosts, hosts.coordinator, jax.device_count())


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
        client.wait_at_barrier(f"{key}/barrier", AGREEMENT_TIMEOUT_MS)
        return bool(client.key_value_dir_get(f"{key}/flags/"))
