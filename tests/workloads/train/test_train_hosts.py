"""The trainer's reading of the multi-host pod environment (no JAX needed)."""

from __future__ import annotations

import re
import threading

import pytest

from tpuforge_sandbox.gcs import free_port
from tpuforge_workloads.train.hosts import JOIN_TIMEOUT_SECONDS, Agreement, Hosts, HostsError, from_env, metrics_port
from tpuforge_workloads.train.rollcall import roll_call

SLICE = {
    "TPUFORGE_NUM_PROCESSES": "4",
    "TPUFORGE_PROCESS_ID": "2",
    "TPUFORGE_COORDINATOR_ADDRESS": "job-train-1-trainer-0-0.job-train-1:8476",
}


def test_without_the_variables_the_run_is_one_process() -> None:
    for env in ({}, {"TPUFORGE_NUM_PROCESSES": "1"}, {"TPUFORGE_NUM_PROCESSES": ""}):
        hosts = from_env(env)
        assert hosts == Hosts() and hosts.primary and not hosts.multi
    # One process agrees with itself, without any coordination service.
    agree = Agreement(Hosts(), "stop")
    assert agree.any(True) and not agree.any(False)


def test_a_host_of_a_slice_knows_its_place() -> None:
    hosts = from_env(SLICE)
    assert (hosts.process_id, hosts.num_processes, hosts.coordinator) == (2, 4, SLICE["TPUFORGE_COORDINATOR_ADDRESS"])
    assert hosts.multi and not hosts.primary
    assert str(hosts) == "process 2 of 4"
    assert hosts.join_timeout_s == JOIN_TIMEOUT_SECONDS == 1800
    assert from_env({**SLICE, "TPUFORGE_JOIN_TIMEOUT_SECONDS": "90"}).join_timeout_s == 90


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TPUFORGE_NUM_PROCESSES": "two"}, "TPUFORGE_NUM_PROCESSES='two' is not an integer"),
        ({"TPUFORGE_PROCESS_ID": "4"}, "TPUFORGE_PROCESS_ID='4' must be set to 0 .. 3"),
        ({"TPUFORGE_PROCESS_ID": ""}, "TPUFORGE_PROCESS_ID='' must be set to 0 .. 3"),
        ({"TPUFORGE_COORDINATOR_ADDRESS": ""}, "TPUFORGE_COORDINATOR_ADDRESS must name process 0's host:port"),
        ({"TPUFORGE_NUM_PROCESSES": "0"}, "TPUFORGE_NUM_PROCESSES=0 must be at least 1"),
        ({"TPUFORGE_COORDINATOR_ADDRESS": "job-0"}, "TPUFORGE_COORDINATOR_ADDRESS='job-0' must end with :PORT"),
        ({"TPUFORGE_JOIN_TIMEOUT_SECONDS": "0"}, "TPUFORGE_JOIN_TIMEOUT_SECONDS=0 must be at least 1 (seconds)"),
    ],
)
def test_an_inconsistent_environment_names_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(HostsError, match=re.escape(message)):
        from_env({**SLICE, **change})


def test_the_metrics_port_can_be_set_per_pod() -> None:
    assert metrics_port(9090, {}) == 9090
    assert metrics_port(9090, {"TPUFORGE_METRICS_PORT": "19091"}) == 19091
    assert metrics_port(9090, {"TPUFORGE_METRICS_PORT": "0"}) == 0  # off for this pod


def _roll_call(processes: int, present: list[int], timeout_s: float) -> dict[int, str]:
    """The roll call between threads standing for the `present` hosts: what each got ("" = every host up)."""
    coordinator = f"127.0.0.1:{free_port()}"
    got: dict[int, str] = {}

    def host(pid: int) -> None:
        try:
            roll_call(Hosts(pid, processes, coordinator), timeout_s)
            got[pid] = ""
        except HostsError as e:
            got[pid] = str(e)

    threads = [threading.Thread(target=host, args=(pid,)) for pid in present]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return got


def test_the_roll_call_returns_once_every_host_is_up() -> None:
    assert _roll_call(3, [2, 1, 0], timeout_s=30) == {0: "", 1: "", 2: ""}


def test_the_roll_call_names_the_hosts_that_did_not_come() -> None:
    got = _roll_call(4, [0, 2], timeout_s=2)
    for pid in (0, 2):  # process 0 tells the hosts that came which did not
        assert got[pid].startswith("processes 1, 3 of 4 did not join the slice within 2 s"), got
        assert "TPUFORGE_JOIN_TIMEOUT_SECONDS" in got[pid]


def test_a_host_that_never_reaches_process_0_says_so() -> None:
    (message,) = _roll_call(2, [1], timeout_s=2).values()
    assert re.match(r"process 0 of 2 \(coordinator 127\.0\.0\.1:\d+\) could not be reached within 2 s", message)
