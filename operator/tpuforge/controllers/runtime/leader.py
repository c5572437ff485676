"""Leader election on a coordination.k8s.io/v1 Lease, so that several replicas of the operator can run and
only one of them handles objects.

The rules are client-go's (what controller-runtime operators use):
- a candidate writes its identity into the Lease when the Lease is free (no holder: released) or expired,
  and counts the change of holder in `leaseTransitions`;
- every write is a replace conditional on the resourceVersion the candidate read: of two candidates that
  read the same Lease, one write wins and the other gets 409 Conflict and stays a candidate;
- the leader renews `renewTime` every `renew_period`; when no renewal has succeeded for `renew_deadline`
  (shorter than the lease's duration, so that it stops before another can take over), it has lost;
- a Lease is expired when its renewTime plus leaseDurationSeconds has passed, or, whatever the clocks say,
  when it has not changed for leaseDurationSeconds since this candidate first saw it;
- the leader that stops cleanly releases the Lease (no holder), so that a candidate takes over on its next
  try instead of waiting for the lease to expire.

`LeaderElector` is those rules on the event loop (`AsyncApi`); `LeaderElection` runs one on a loop of its own in
a thread, beside kopf's, for `tpuforge operator --leader-elect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tpuforge.kube import client as kube_client
from tpuforge.kube.async_client import AsyncApi

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"
LEASE_KIND = "Lease"
DEFAULT_LEASE_NAME = "tpuforge-operator"
# Where the pod's namespace is when POD_NAMESPACE is not set (every pod with a service account token has it).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Timing:
    """Seconds; the defaults are controller-runtime's, but for renewing every 5 s instead of every 2 s."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    renew_period: float = 5.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(f"leader election needs 0 < retry period < renew deadline < lease duration: {self}")
        if not 0 < self.renew_period < self.renew_deadline:
            raise ValueError(f"leader election needs 0 < renew period < renew deadline: {self}")


# --- The Lease's record (pure) ------------------------------------------------------------------------------

_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$")


def format_micro_time(t: datetime) -> str:
    """A MicroTime as the apiserver writes it: UTC, microseconds, `Z`."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    """A Time or MicroTime (RFC 3339: any number of fraction digits, `Z` or an offset); None when absent or not
    one (such a Lease is treated as expired: a record nobody can read cannot hold off a candidate)."""
    if not text:
        return None
    found = _TIME.match(text.strip())
    if found is None:
        return None
    whole, fraction, zone = found.groups()
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    try:
        base = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return base.replace(microsecond=micros).astimezone(UTC)


def holder(spec: dict[str, Any]) -> str:
    return str(spec.get("holderIdentity") or "")


def expires_at(spec: dict[str, Any]) -> datetime | None:
    """When the holder's lease runs out by the wall clock: renewTime (else acquireTime) plus its duration;
    None when the record has neither time or no duration."""
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int | float) or duration <= 0:
        return None
    return renewed + timedelta(seconds=duration)


def may_take(spec: dict[str, Any], identity: str, now: datetime, unchanged_for: float) -> bool:
    """Whether `identity` may write itself into a Lease with this spec at wall time `now`, having seen the same
    record for `unchanged_for` seconds: it holds it already, nobody does, or the holder's lease has expired."""
    current = holder(spec)
    if current in ("", identity):
        return True
    expiry = expires_at(spec)
    if expiry is None or now >= expiry:
        return True
    duration = spec.get("leaseDurationSeconds")
    return isinstance(duration, int | float) and unchanged_for >= duration


def taken_spec(old: dict[str, Any] | None, identity: str, now: datetime, lease_duration: float) -> dict[str, Any]:
    """The spec that makes `identity` the holder (a renewal when it holds it already)."""
    stamp = format_micro_time(now)
    old = old or {}
    if old and holder(old) == identity:
        acquired, transitions = old.get("acquireTime") or stamp, int(old.get("leaseTransitions") or 0)
    else:
        # A new holder: a Lease that was there changes hands (released or expired), a new one starts at 0.
        acquired, transitions = stamp, int(old.get("leaseTransitions") or 0) + (1 if old else 0)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, math.ceil(lease_duration)),
        "acquireTime": acquired,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


def released_spec(old: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The spec of a Lease given up: no holder, so the next candidate takes it at once."""
    stamp = format_micro_time(now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": int(old.get("leaseTransitions") or 0),
    }


def default_identity() -> str:
    """The pod's name (POD_NAME from the downward API, else the hostname, which is the pod's name in a pod)
    and a random suffix: a container restarted in place is a new candidate, not the old leader."""
    name = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{name}_{secrets.token_hex(4)}"


def default_namespace() -> str:
    """The operator's own namespace: POD_NAMESPACE (downward API), else the service account's, else default."""
    if ns := os.environ.get("POD_NAMESPACE", "").strip():
        return ns
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


# --- The elector (on an event loop) ------------------------------------------------------------------------


class LeadershipLost(Exception):
    """The leader could not renew before its deadline, or another candidate holds the Lease now."""


class LeaderElector:
    """One candidate for the Lease `namespace`/`name`. `acquire` waits until it leads; `keep` renews until it
    cannot (LeadershipLost); `release` gives the Lease up. `wall` is the clock written into the Lease and
    compared with others' renewTime; `monotonic` measures deadlines."""

    def __init__(
        self,
        api: AsyncApi,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing = Timing(),
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self._wall = wall
        self._monotonic = monotonic
        self.leading = False
        self._renewed_at = -math.inf  # monotonic start of the last successful write as leader
        # The record last seen (resourceVersion) and since when (monotonic), for the clock-free expiry.
        self._seen: tuple[str, float] | None = None
        self._logged_holder: str | None = None

    async def _read(self) -> dict[str, Any] | None:
        kube_api = self.api
        lease = await kube_api.get(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name)
        if lease is not None:
            version = str(lease["metadata"].get("resourceVersion", ""))
            if self._seen is None or self._seen[0] != version:
                self._seen = (version, self._monotonic())
        return lease

    def _unchanged_for(self) -> float:
        return self._monotonic() - self._seen[1] if self._seen else 0.0

    def _lease(self, spec: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": LEASE_API_VERSION, "kind": LEASE_KIND, "metadata": metadata, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease after it (written just now). False when another
        holds it, or won the race for it (409); API errors other than a conflict raise."""
        kube_api = self.api
        started = self._monotonic()
        lease = await self._read()
        now = self._wall()
        if lease is None:
            body = self._lease(taken_spec(None, self.identity, now, self.timing.lease_duration), None)
            try:
                await kube_api.request(
                    "POST", kube_client.resource_path(LEASE_API_VERSION, LEASE_KIND, self.namespace), body=body
                )
            except kube_client.ApiException as exc:
                if exc.status == 409:  # another candidate created it first
                    return self._lost_race()
                raise
            return self._won(started)
        spec = lease.get("spec") or {}
        if not may_take(spec, self.identity, now, self._unchanged_for()):
            self._note_holder(holder(spec))
            return False
        version = str(lease["metadata"].get("resourceVersion", ""))
        body = self._lease(taken_spec(spec, self.identity, now, self.timing.lease_duration), version)
        try:
            await kube_api.request(
                "PUT",
                kube_client.resource_path(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name),
                body=body,
            )
        except kube_client.ApiException as exc:
            if kube_client.is_conflict(exc):  # the Lease changed since it was read: someone else wrote first
                return self._lost_race()
            raise
        return self._won(started)

    def _won(self, started: float) -> bool:
        if not self.leading:
            log.info("leader election: %s now leads (Lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading = True
        self._renewed_at = started
        return True

    def _lost_race(self) -> bool:
        log.debug("leader election: another candidate wrote Lease %s/%s first", self.namespace, self.name)
        return False

    def _note_holder(self, current: str) -> None:
        if current != self._logged_holder:
            log.info(
                "leader election: %s waits; Lease %s/%s is held by %s",
                self.identity,
                self.namespace,
                self.name,
                current,
            )
            self._logged_holder = current

    async def acquire(self, stop: asyncio.Event | None = None) -> bool:
        """Try every retry_period until this candidate leads (True), or `stop` is set (False)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                if await asyncio.wait_for(self.try_acquire_or_renew(), self.timing.retry_period * 2):
                    return True
            except (kube_client.ApiException, TimeoutError) as exc:
                log.warning("leader election: could not read or write Lease %s/%s: %s", self.namespace, self.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.timing.retry_period)
        return False

    async def keep(self, stop: asyncio.Event | None = None) -> None:
        """Renew every renew_period (every retry_period after a failed try) until `stop` is set (returns,
        still leading: `release` next) or leadership is lost (raises LeadershipLost; `leading` is False)."""
        stop = stop or asyncio.Event()
        wait = self.timing.renew_period
        while True:
            try:
                await asyncio.wait_for(stop.wait(), wait)
                return
            except TimeoutError:
                pass
            left = self._renewed_at + self.timing.renew_deadline - self._monotonic()
            why = ""
            try:
                if left > 0 and await asyncio.wait_for(self.try_acquire_or_renew(), left):
                    wait = self.timing.renew_period
                    continue
                why = "another candidate holds the Lease" if left > 0 else ""
            except (kube_client.ApiException, TimeoutError) as exc:
                log.warning("leader election: renewing Lease %s/%s failed: %s", self.namespace, self.name, exc)
            left = self._renewed_at + self.timing.renew_deadline - self._monotonic()
            if why or left <= 0:
                self.leading = False
                raise LeadershipLost(
                    why or f"no renewal of Lease {self.namespace}/{self.name} in {self.timing.renew_deadline:g}s"
                )
            wait = min(self.timing.retry_period, left)

    async def release(self) -> bool:
        """Give the Lease up if this candidate holds it; True when released (failures are logged, not raised:
        the Lease then expires on its own)."""
        if not self.leading:
            return False
        self.leading = False
        kube_api = self.api
        try:
            lease = await kube_api.get(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name)
            if lease is None or holder(lease.get("spec") or {}) != self.identity:
                return False
            version = str(lease["metadata"].get("resourceVersion", ""))
            body = self._lease(released_spec(lease.get("spec") or {}, self._wall()), version)
            await kube_api.request(
                "PUT",
                kube_client.resource_path(LEASE_API_VERSION, LEASE_KIND, self.namespace, self.name),
                body=body,
            )
        except (kube_client.ApiException, TimeoutError) as exc:
            log.warning("leader election: could not release Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        log.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        return True


# --- Beside kopf: an elector on a loop in a thread of its own ------------------------------------------------


class LeaderElection:
    """Runs a `LeaderElector` in a daemon thread: `start`, then `wait_leading` (a threading.Event is set once
    this process leads); `stop` releases the Lease and ends the thread. When leadership is lost, `on_lost` is
    called with why, from that thread (the operator exits there: it must not act once another may lead)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        identity: str,
        on_lost: Callable[[str], None],
        timing: Timing = Timing(),
        on_change: Callable[[bool], None] = lambda leading: None,
    ):
        self.namespace, self.name, self.identity, self.timing = namespace, name, identity, timing
        self.leading = threading.Event()
        self._on_lost = on_lost
        self._on_change = on_change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def wait_leading(self, timeout: float | None = None) -> bool:
        return self.leading.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Release the Lease (when held) and end the thread; returns after at most about `timeout` seconds."""
        self._stopping = True
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.run(self._elect())

    async def _elect(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        api = AsyncApi(4)
        elector = LeaderElector(api, self.namespace, self.name, self.identity, self.timing)
        try:
            if not await elector.acquire(self._stop):
                return
            self.leading.set()
            self._on_change(True)
            await elector.keep(self._stop)
            await asyncio.wait_for(elector.release(), self.timing.renew_deadline)
            self._lead_no_more()
        except Exception as exc:  # LeadershipLost, or a failure that would leave nobody renewing
            self._lead_no_more()
            if not self._stopping:
                self._on_lost(str(exc) if isinstance(exc, LeadershipLost) else f"leader election failed: {exc!r}")
        finally:
            await api.close()

    def _lead_no_more(self) -> None:
        if self.leading.is_set():
            self.leading.clear()
            self._on_change(False)


__all__ = [
    "DEFAULT_LEASE_NAME",
    "LEASE_API_VERSION",
    "LEASE_KIND",
    "LeaderElection",
    "LeaderElector",
    "LeadershipLost",
    "Timing",
    "default_identity",
    "default_namespace",
    "expires_at",
    "may_take",
    "parse_time",
]
