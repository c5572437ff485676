"""The harness both kinds' controllers run in: what a controller of one kind does that has nothing to do with
the kind. A kind gives its reconcile (key, Snapshot -> when to look again) and what to forget of a deleted
object; the harness gives the rest:

- an informer of the kind's objects (`objects`, as Snapshots) and the kind's other informers (`informers`,
  its children and what else its decisions read), started children first: `start` returns once every one has
  its first LIST in memory, the objects' last, so the first decisions see the whole cluster;
- a keyed work queue (one reconcile per object at a time) that each change of an object asks, except the
  echo of the controller's own status write (`runtime/status_writes.py`);
- the reconcile wrapper: the object as last seen with the controller's own status write where its echo has
  not arrived yet (`current`), the four metrics (reconciles, errors, conflicts, duration, labelled by kind),
  and the 409: a write refused because the object changed since it was read means a newer one is on its
  way, so the reconcile ends and looks again (in CONFLICT_RETRY_SECONDS, if that object's watch event is
  lost);
- the status write on the resourceVersion the decision was computed from (`patch_status`), remembered for
  the echo check;
- a deleted object: its written status forgotten, one more run asked, which (after any run still in flight)
  finds it gone and calls the kind's `forget` (its metric series, its own memory of it), so nothing of it
  outlives it;
- `close`: the informers stopped, the queue and the API client closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from tpuforge import metrics
from tpuforge.api.constants import API_VERSION
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.snapshot import Snapshot, snapshot
from tpuforge.controllers.runtime.status_writes import StatusWrites
from tpuforge.controllers.runtime.workqueue import KeyedQueue
from tpuforge.kube import async_client as kube_async
from tpuforge.kube import client as kube_client

log = logging.getLogger(__name__)

K = TypeVar("K", bound=tuple[str, str])

WORKERS = 64  # reconciles at once, per kind
API_CONCURRENCY = 128  # API calls at once, per kind, one connection each
CONFLICT_RETRY_SECONDS = 1.0  # if the newer object's watch event is lost, look again anyway


class ObjectGone(Exception):
    """The object was deleted between the read a reconcile started from and its status write (404): nothing
    to do; its delete event asks for the run that forgets it."""


class Controller(Generic[K]):
    def __init__(
        self,
        kind: str,
        reconcile: Callable[[K, Snapshot], Awaitable[float | None]],
        *,
        namespaces: Sequence[str] | None,
        key: Callable[[Mapping[str, Any]], K],
        forget: Callable[[K, Snapshot], None],
        annotations: Collection[str] = (),
        on_object: Callable[[K, Snapshot | None, Snapshot | None], None] | None = None,
        skip_deleting: bool = False,
    ):
        """`reconcile(key, snapshot)` decides and acts for one object; `forget(key, last snapshot)` drops what
        the kind keeps of a deleted one; `annotations`, the ones its reconcile reads; `on_object` hears every
        change of an object first (a kind's own bookkeeping); `skip_deleting`: an object being deleted is left
        to the garbage collector, not reconciled."""
        self.kind = kind
        self._reconcile, self._forget, self._on_object = reconcile, forget, on_object
        self._skip_deleting = skip_deleting
        self.queue: KeyedQueue[K] = KeyedQueue(self.reconcile, WORKERS, name=kind.lower())
        # Its kind is the one each `Controller(KIND, ...)` names (what tests/fixtures/rbac_scan.py reads).
        self.objects: Informer[K, Snapshot] = Informer(
            api_version=API_VERSION,
            kind=kind,
            label_selector="",
            namespaces=namespaces,
            view=partial(snapshot, kind=kind, annotations=tuple(annotations)),
            owner=key,
            on_change=self.object_changed,
        )
        self.informers: list[Informer[Any, Any]] = []  # started before `objects`
        self.written: StatusWrites[K] = StatusWrites()
        self._gone: dict[K, Snapshot] = {}  # deleted, until a run finds them gone
        self._api: kube_async.AsyncApi | None = None  # made on the event loop, in start()

    async def start(self) -> None:
        """Start the informers; return once each has its first LIST in memory, the objects' last."""
        self._api = kube_async.AsyncApi(API_CONCURRENCY)
        await asyncio.gather(*(informer.start() for informer in self.informers))
        await self.objects.start()

    @property
    def api(self) -> kube_async.AsyncApi:
        if self._api is None:
            raise RuntimeError(f"the {self.kind} controller has not been started")
        return self._api

    def object_changed(self, key: K, before: Snapshot | None, after: Snapshot | None) -> None:
        if self._on_object is not None:
            self._on_object(key, before, after)
        if after is None:
            if before is not None:
                self.written.forget(key)
                self._gone[key] = before
                self.queue.request(key)  # finds it gone, after any run still in flight
            return
        self._gone.pop(key, None)
        if self.written.is_echo(key, after.resource_version):
            return  # the echo of our own status write: the reconcile that made it already saw this state
        self.queue.request(key)

    def current(self, key: K) -> Snapshot | None:
        """The object as last seen, with our own status write where its echo has not arrived yet."""
        snap = next(iter(self.objects.get(key)), None)
        if snap is None:
            return None
        written = self.written.current(key, snap.resource_version)
        if written is not None:
            snap = dataclasses.replace(snap, resource_version=written.resource_version, status=written.status)
        return snap

    async def reconcile(self, key: K) -> float | None:
        snap = self.current(key)
        if snap is None:
            gone = self._gone.pop(key, None)
            if gone is not None:
                self._forget(key, gone)
            self.queue.forget(key)
            return None
        if snap.deleting and self._skip_deleting:
            return None
        metrics.RECONCILES.labels(self.kind).inc()
        started = time.perf_counter()
        try:
            return await self._reconcile(key, snap)
        except ObjectGone:
            log.debug("%s/%s: deleted meanwhile", snap.namespace, snap.name)
            return None
        except kube_client.ApiException as exc:
            if not kube_client.is_conflict(exc):
                metrics.RECONCILE_ERRORS.labels(self.kind).inc()
                raise
            metrics.RECONCILE_CONFLICTS.labels(self.kind).inc()
            log.debug("%s/%s: changed meanwhile; reconciling the newer one", snap.namespace, snap.name)
            return CONFLICT_RETRY_SECONDS
        except Exception:
            metrics.RECONCILE_ERRORS.labels(self.kind).inc()
            raise
        finally:
            metrics.RECONCILE_DURATION.labels(self.kind).observe(time.perf_counter() - started)

    async def patch_status(self, key: K, snap: Snapshot, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Write `patch` on the version `snap` was read at (a 409 if it changed since), and remember the write
        (its echo asks for no reconcile; until then `current` reads it). Returns the object written."""
        kube_api = self.api
        try:
            new = await kube_api.patch_status(snap.ref, patch, snap.resource_version)
        except kube_client.ApiException as exc:
            if exc.status == 404:
                raise ObjectGone(f"{snap.namespace}/{snap.name}") from exc
            raise
        self.written.record(key, snap.resource_version, new)
        return new

    async def close(self) -> None:
        for informer in (self.objects, *self.informers):
            informer.stop()
        await self.queue.close()
        if self._api is not None:
            await self._api.close()
