"""The trainer's reading of the multi-host pod environment (no JAX needed)."""

from __future__ import annotations

import re

import pytest

from tpuforge_workloads.train.hosts import Agreement, Hosts, HostsError, from_env, metrics_port

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


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TPUFORGE_NUM_PROCESSES": "two"}, "TPUFORGE_NUM_PROCESSES='two' is not an integer"),
        ({"TPUFORGE_PROCESS_ID": "4"}, "TPUFORGE_PROCESS_ID='4' must be set to 0 .. 3"),
        ({"TPUFORGE_PROCESS_ID": ""}, "TPUFORGE_PROCESS_ID='' must be set to 0 .. 3"),
        ({"TPUFORGE_COORDINATOR_ADDRESS": ""}, "TPUFORGE_COORDINATOR_ADDRESS must name process 0's host:port"),
        ({"TPUFORGE_NUM_PROCESSES": "0"}, "TPUFORGE_NUM_PROCESSES=0 must be at least 1"),
    ],
)
def test_an_inconsistent_environment_names_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(HostsError, match=re.escape(message)):
        from_env({**SLICE, **change})


def test_the_metrics_port_can_be_set_per_pod() -> None:
    assert metrics_port(9090, {}) == 9090
    assert metrics_port(9090, {"TPUFORGE_METRICS_PORT": "19091"}) == 19091
    assert metrics_port(9090, {"TPUFORGE_METRICS_PORT": "0"}) == 0  # off for this pod
