"""Leader election's pure rules: the Lease's times as the apiserver writes them, when a Lease may be taken, what
a new holder, a renewal and a release write; and the operator's liveness answer while it waits as a standby.
The Lease itself, contended on a real apiserver, is in test_leader_election.py."""

from __future__ import annotations

import json
import socket
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from tpuforge.controllers import main
from tpuforge.controllers.runtime import leader

NOW = datetime(2026, 12, 6, 9, 30, 0, 250000, tzinfo=UTC)


def spec(holder: str, renewed: datetime, duration: int = 15) -> dict[str, object]:
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "acquireTime": leader.format_micro_time(renewed),
        "renewTime": leader.format_micro_time(renewed),
        "leaseTransitions": 3,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-06T09:30:00.250000Z", NOW),
        ("2026-12-06T09:30:00.25Z", NOW),
        ("2026-12-06T09:30:00Z", NOW.replace(microsecond=0)),
        ("2026-12-06T10:30:00.250000123+01:00", NOW),  # nanoseconds are cut to microseconds
        ("", None),
        (None, None),
        ("yesterday", None),
        ("2026-13-06T09:30:00Z", None),
    ],
)
def test_times_read_as_the_apiserver_writes_them(text: str | None, expected: datetime | None) -> None:
    assert leader.parse_time(text) == expected


def test_a_written_time_reads_back() -> None:
    assert leader.format_micro_time(NOW) == "2026-12-06T09:30:00.250000Z"
    assert leader.parse_time(leader.format_micro_time(NOW)) == NOW


def test_a_lease_expires_its_duration_after_its_renewal() -> None:
    assert leader.expires_at(spec("a", NOW)) == NOW + timedelta(seconds=15)
    assert leader.expires_at({"holderIdentity": "a", "leaseDurationSeconds": 15}) is None
    assert leader.expires_at({"holderIdentity": "a", "renewTime": "2026-12-06T09:30:00Z"}) is None


def test_who_may_take_a_lease() -> None:
    held = spec("a", NOW)
    assert leader.may_take(held, "a", NOW, 0.0)  # its own: a renewal
    assert not leader.may_take(held, "b", NOW + timedelta(seconds=14.9), 0.0)
    assert leader.may_take(held, "b", NOW + timedelta(seconds=15), 0.0)  # expired by the clock
    # Whatever the clocks say: a record unchanged for the lease's duration is a holder that stopped renewing.
    assert leader.may_take(held, "b", NOW - timedelta(hours=1), 15.0)
    assert not leader.may_take(held, "b", NOW - timedelta(hours=1), 14.0)
    assert leader.may_take({**held, "holderIdentity": ""}, "b", NOW, 0.0)  # released
    assert leader.may_take({"holderIdentity": "a"}, "b", NOW, 0.0)  # no times: nobody can say it is held


def test_a_new_holder_counts_a_transition_and_a_renewal_keeps_it() -> None:
    later = NOW + timedelta(seconds=20)
    created = leader.taken_spec(None, "a", NOW, 15.0)
    assert created["holderIdentity"] == "a" and created["leaseTransitions"] == 0
    assert created["leaseDurationSeconds"] == 15
    renewed = leader.taken_spec(created, "a", later, 15.0)
    assert renewed["acquireTime"] == created["acquireTime"] and renewed["leaseTransitions"] == 0
    assert renewed["renewTime"] == leader.format_micro_time(later)
    taken = leader.taken_spec(spec("a", NOW), "b", later, 2.5)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 4
    assert taken["acquireTime"] == taken["renewTime"] == leader.format_micro_time(later)
    assert taken["leaseDurationSeconds"] == 3  # whole seconds, never shorter than asked


def test_a_released_lease_has_no_holder_and_keeps_its_count() -> None:
    released = leader.released_spec(spec("a", NOW), NOW)
    assert released["holderIdentity"] == "" and released["leaseTransitions"] == 3
    assert leader.may_take(released, "b", NOW, 0.0)


def test_timings_must_let_the_leader_stop_before_the_lease_expires() -> None:
    leader.Timing()
    leader.Timing(lease_duration=2.0, renew_deadline=1.5, renew_period=0.5, retry_period=0.2)
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        leader.Timing(lease_duration=10.0, renew_deadline=10.0)
    with pytest.raises(ValueError, match="renew period < renew deadline"):
        leader.Timing(renew_period=10.0)


def test_identity_is_the_pod_name_and_a_suffix_and_the_namespace_the_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "tpf-tpuforge-7d9-abcde")
    a, b = leader.default_identity(), leader.default_identity()
    assert a.startswith("tpf-tpuforge-7d9-abcde_") and a != b  # a restarted container is a new candidate
    monkeypatch.setenv("POD_NAMESPACE", "tpuforge-system")
    assert leader.default_namespace() == "tpuforge-system"


def test_the_flags() -> None:
    args = main.parser().parse_args([])
    assert args.leader_elect is False and args.leader_election_name == leader.DEFAULT_LEASE_NAME
    args = main.parser().parse_args(["--leader-elect", "--leader-election-namespace=ops", "--leader-election-name=x"])
    assert (args.leader_elect, args.leader_election_namespace, args.leader_election_name) == (True, "ops", "x")
    assert main.parser().parse_args(["--leader-elect", "--no-leader-elect"]).leader_elect is False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_standby_answers_the_liveness_probe_and_frees_the_port_for_kopf() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    with main.standby_health(url), urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200 and json.loads(resp.read()) == {"standby": True}
    with socket.socket() as s:  # what kopf's health server does next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    with main.standby_health(None):  # no liveness endpoint: nothing to answer
        pass
