"""Leader election against the sandbox's kube-apiserver: candidates contending for one coordination.k8s.io
Lease. Exactly one leads; a standby takes over as soon as the leader releases the Lease, and only once the
lease has expired when the leader stops renewing (never two at once); of two writes on the same read, one
loses with 409; a leader whose Lease another took loses and says so. Short durations (a 2 s lease) keep it
fast. Last, `tpuforge operator --leader-elect` as a process: a standby that acts on nothing until the Lease is
released, then leads, and releases it on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import WAIT, Cluster, Operator
from tpuforge.controllers.runtime import leader
from tpuforge.controllers.runtime.leader import LeaderElection, LeaderElector, LeadershipLost, Timing
from tpuforge.kube import async_client as kube_async
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.procs import free_port

pytestmark = pytest.mark.cluster

FAST = Timing(lease_duration=2.0, renew_deadline=1.5, renew_period=0.4, retry_period=0.2)
NAME = "tpuforge-operator"


def lease_spec(ns: str) -> dict[str, Any]:
    got = kube_objects.get(kube_client.api_client(), leader.LEASE_API_VERSION, leader.LEASE_KIND, ns, NAME)
    assert got is not None
    return dict(got["spec"])


def candidates(ns: str, *names: str) -> tuple[list[kube_async.AsyncApi], list[LeaderElector]]:
    """Electors that share nothing but the apiserver (a connection pool each, as two replicas would)."""
    apis = [kube_async.AsyncApi(4) for _ in names]
    return apis, [LeaderElector(api, ns, NAME, name, FAST) for api, name in zip(apis, names, strict=True)]


async def close(apis: list[kube_async.AsyncApi]) -> None:
    for api in apis:
        await api.close()


def steal(ns: str) -> None:
    """Write another holder into the Lease, as its current holder would never expect."""
    api = kube_client.api_client()
    path = kube_client.resource_path(leader.LEASE_API_VERSION, leader.LEASE_KIND, ns, NAME)
    for _ in range(10):  # the leader may renew between this read and write
        lease = kube_client.request(api, "GET", path)
        lease["spec"]["holderIdentity"] = "intruder"
        try:
            kube_client.request(api, "PUT", path, body=lease)
            return
        except kube_client.ApiException as exc:
            assert kube_client.is_conflict(exc), exc
    raise AssertionError("the Lease kept changing")


@pytest.fixture
def ns(sandbox: Sandbox, namespace: str) -> str:
    kube_client.configure(sandbox.kubeconfig)
    return namespace


def test_one_of_two_leads_and_the_other_takes_over_when_it_releases(ns: str) -> None:
    async def scenario() -> None:
        apis, (a, b) = candidates(ns, "replica-a", "replica-b")
        stop = {e.identity: asyncio.Event() for e in (a, b)}
        try:
            tasks = {asyncio.create_task(e.acquire(stop[e.identity])): e for e in (a, b)}
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=10)
            assert len(done) == 1, "exactly one candidate leads"
            first = tasks[done.pop()]
            other = b if first is a else a
            waiting = next(t for t, e in tasks.items() if e is other)
            assert first.leading and not other.leading
            spec = lease_spec(ns)
            assert spec["holderIdentity"] == first.identity and spec["leaseTransitions"] == 0
            assert spec["leaseDurationSeconds"] == 2

            # The leader renews; the standby keeps trying through three lease durations and never leads.
            keeping = asyncio.create_task(first.keep(stop[first.identity]))
            await asyncio.sleep(3 * FAST.lease_duration)
            assert not waiting.done() and not other.leading
            renewed = lease_spec(ns)
            assert renewed["holderIdentity"] == first.identity
            before, after = leader.parse_time(spec["renewTime"]), leader.parse_time(renewed["renewTime"])
            assert before is not None and after is not None and after > before

            # A clean stop releases the Lease: the standby leads at its next try, well within a lease duration.
            stop[first.identity].set()
            await keeping
            assert await first.release() and not first.leading
            released_at = time.monotonic()
            assert await asyncio.wait_for(waiting, FAST.lease_duration) is True
            assert time.monotonic() - released_at < FAST.lease_duration
            spec = lease_spec(ns)
            assert spec["holderIdentity"] == other.identity and spec["leaseTransitions"] == 1
        finally:
            for e in stop.values():
                e.set()
            await close(apis)

    asyncio.run(scenario())


def test_a_leader_that_stops_renewing_is_replaced_only_after_the_lease_expires(ns: str) -> None:
    async def scenario() -> None:
        apis, (a, b) = candidates(ns, "hung", "standby")
        try:
            assert await a.acquire()
            acquired = time.monotonic()  # a then hangs: it never renews
            assert await asyncio.wait_for(b.acquire(), 4 * FAST.lease_duration)
            took = time.monotonic() - acquired
            assert FAST.lease_duration - 0.3 <= took < FAST.lease_duration + 1.0, took
            spec = lease_spec(ns)
            assert spec["holderIdentity"] == "standby" and spec["leaseTransitions"] == 1
            # The old leader wakes up: its next renewal finds another holder, and it is no leader any more.
            a._renewed_at = time.monotonic()  # as if within its deadline, so that the Lease decides
            with pytest.raises(LeadershipLost, match="another candidate holds the Lease"):
                await a.keep()
            assert not a.leading
            assert lease_spec(ns)["holderIdentity"] == "standby"  # and it wrote nothing
        finally:
            await close(apis)

    asyncio.run(scenario())


def test_of_two_writes_on_the_same_read_one_loses_with_a_conflict(ns: str) -> None:
    """Each candidate reads the Lease, then writes it conditionally; here the other writes in between."""

    class Overtaken(LeaderElector):
        rival: LeaderElector

        async def _read(self) -> dict[str, Any] | None:
            lease = await super()._read()
            assert await self.rival.try_acquire_or_renew()  # the rival writes after this read
            return lease

    async def scenario() -> None:
        apis = [kube_async.AsyncApi(4) for _ in range(2)]
        rival = LeaderElector(apis[0], ns, NAME, "rival", FAST)
        late = Overtaken(apis[1], ns, NAME, "late", FAST)
        late.rival = rival
        try:
            # No Lease yet: both would create it; the second create is refused (409 AlreadyExists).
            assert await late.try_acquire_or_renew() is False
            assert rival.leading and not late.leading
            assert lease_spec(ns)["holderIdentity"] == "rival"
            # A released Lease: both would replace it; the stale resourceVersion is refused (409 Conflict).
            assert await rival.release()
            assert await late.try_acquire_or_renew() is False
            assert rival.leading and not late.leading
            spec = lease_spec(ns)
            assert spec["holderIdentity"] == "rival" and spec["leaseTransitions"] == 1
        finally:
            await close(apis)

    asyncio.run(scenario())


def test_the_operators_election_thread_releases_on_stop_and_reports_a_lost_lease(ns: str) -> None:
    lost: list[str] = []
    gone = threading.Event()
    states: list[bool] = []

    def on_lost(why: str) -> None:
        lost.append(why)
        gone.set()

    first = LeaderElection(ns, NAME, "first", on_lost, FAST, on_change=states.append)
    first.start()
    assert first.wait_leading(10)
    assert lease_spec(ns)["holderIdentity"] == "first" and states == [True]
    first.stop()
    assert not first.leading.is_set() and states == [True, False] and not lost
    assert lease_spec(ns)["holderIdentity"] == ""  # released: the next takes it at once

    second = LeaderElection(ns, NAME, "second", on_lost, FAST)
    second.start()
    try:
        assert second.wait_leading(2 * FAST.retry_period + 2)
        # Someone else writes the Lease (a split the rules should make impossible): the leader must stop.
        steal(ns)
        assert gone.wait(FAST.renew_period + FAST.renew_deadline + 2)
        assert lost == ["another candidate holds the Lease"] and not second.leading.is_set()
    finally:
        second.stop()


def test_the_operator_waits_as_a_standby_then_leads_and_releases_on_sigterm(
    sandbox: Sandbox, api_client: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    lost: list[str] = []
    other = LeaderElection(ns, NAME, "other-replica", lost.append)  # the chart's timings: a 15 s lease
    other.start()
    assert other.wait_leading(10)
    op = Operator(sandbox, ns, tmp_path)
    health = f"http://127.0.0.1:{free_port()}/healthz"
    try:
        election = ["--leader-elect", f"--leader-election-namespace={ns}", f"--leader-election-name={NAME}"]
        op.start(*election, f"--liveness={health}")
        assert op.metric("tpuforge_operator_leader") == 0
        with urllib.request.urlopen(health, timeout=5) as resp:  # a standby answers the liveness probe itself
            assert json.loads(resp.read()) == {"standby": True}
        cluster = Cluster(api_client, ns)
        name = cluster.create()
        time.sleep(3)
        assert cluster.status(name) == {}, "a standby acted"

        other.stop()  # releases the Lease: the standby takes it at its next try
        assert not lost and lease_spec(ns)["holderIdentity"] == ""
        wait_for(lambda: op.metric("tpuforge_operator_leader") == 1, WAIT, "the standby to lead")
        cluster.wait_phase(name, "Pending")
        spec = lease_spec(ns)
        assert spec["holderIdentity"] not in ("", "other-replica") and spec["leaseTransitions"] == 1

        assert op.proc is not None
        op.proc.terminate()
        assert op.proc.wait(30) == 0
        assert lease_spec(ns)["holderIdentity"] == ""  # released after kopf stopped: the next leads at once

        # Leading again at once; then another holder appears in the Lease: the operator exits (status 4) at its
        # next renewal instead of acting beside it.
        op.start(*election)
        wait_for(lambda: op.metric("tpuforge_operator_leader") == 1, WAIT, "the operator to lead again")
        steal(ns)
        assert op.proc.wait(2 * leader.Timing().renew_period) == 4
        assert "lost the Lease (another candidate holds the Lease)" in op.log_tail()
        assert "Traceback" not in op.log.read_text(errors="replace"), op.log_tail()
    finally:
        op.stop()
        other.stop()
