"""Informers: a LIST, then a WATCH from the list's resourceVersion, of one kind of child object (selected by
label on the server), kept in memory as small views grouped by owner, so that a reconcile reads its children
without an API call.

Why not kopf's indices: kopf holds back every handler until each indexed object has been indexed once, and
its bookkeeping for that costs more than linear time in the number of objects: with a few thousand children
an operator restart stalled for minutes. An informer knows when its LIST is in memory (`ready`), which is
the one guarantee the decisions need: a child that is absent from the store is absent from the cluster.
A kind the apiserver does not serve (404: its CRD is not installed) lists as empty with `served` False, and
is looked for again every UNSERVED_RETRY_SECONDS; `on_served` hears when it is served again (a CRD installed
since), for a controller whose decisions depend on whether it is.

Each informer streams in a thread of its own and hands every change to the event loop, where the store lives;
`on_change(owner_key, before, after)` is called there when an object's view changed (most status updates of
pods and Jobs change nothing a controller reads, and cost nothing); `before` is None for a new object,
`after` None for a deleted one. Another controller that follows the same kind adds its own callback with
`listen` rather than opening a second watch of it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Obj = dict[str, Any]

RETRY_SECONDS = 1.0
WATCH_SECONDS = 300
# A kind the cluster does not serve (a CRD not installed, such as JobSet's) is looked for again this often.
UNSERVED_RETRY_SECONDS = 30.0


class Informer(Generic[K, V]):
    def __init__(
        self,
        *,
        api_version: str,
        kind: str,
        label_selector: str,
        namespaces: Sequence[str] | None,
        view: Callable[[Obj], V],
        owner: Callable[[Obj], K | None],
        on_change: Callable[[K, V | None, V | None], None],
        on_served: Callable[[], None] | None = None,
    ):
        self.api_version, self.kind, self.selector = api_version, kind, label_selector
        self._namespaces: list[str | None] = list(namespaces) if namespaces else [None]
        self._view, self._owner = view, owner
        self._listeners: list[Callable[[K, V | None, V | None], None]] = [on_change]
        self._entries: dict[str, tuple[K, V, str]] = {}  # uid -> (owner, view, namespace)
        self._by_owner: dict[K, dict[str, V]] = {}
        self._listed: set[str | None] = set()
        self._ready = asyncio.Event()
        # False while the apiserver answers 404 for the kind: the store is empty and counts as listed.
        self.served = True
        self._on_served = on_served  # called when a kind that was not served is served again
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- reading (event loop thread) -------------------------------------------------------------------

    def get(self, owner: K) -> tuple[V, ...]:
        return tuple(self._by_owner.get(owner, {}).values())

    def __len__(self) -> int:
        return len(self._entries)

    def owners(self) -> list[K]:
        """The owner keys that have objects in the store."""
        return list(self._by_owner)

    def owner_of(self, uid: str) -> K | None:
        """The owner key of the object with `uid`, if it is in the store."""
        entry = self._entries.get(uid)
        return entry[0] if entry is not None else None

    def listen(self, on_change: Callable[[K, V | None, V | None], None]) -> None:
        """Also call `on_change` for every change, after the owner's callback; first, for every object in the
        store now, as a new one (a listener that comes after the first LIST misses nothing)."""
        self._listeners.append(on_change)
        for owner, views in list(self._by_owner.items()):
            for view in list(views.values()):
                on_change(owner, None, view)

    def _changed(self, owner: K, before: V | None, after: V | None) -> None:
        for on_change in self._listeners:
            on_change(owner, before, after)

    async def start(self) -> None:
        """Start streaming; return once every namespace's first LIST is in memory."""
        self._loop = asyncio.get_running_loop()
        for ns in self._namespaces:
            threading.Thread(target=self._run, args=(ns,), name=f"informer-{self.kind}-{ns}", daemon=True).start()
        await self._ready.wait()

    def stop(self) -> None:
        """Stop handing changes over. The streaming threads are daemons: they end with the process, or at
        their watch's next event or timeout (closing a stream another thread reads can block)."""
        self._stopping.set()

    # --- the store (event loop thread) -----------------------------------------------------------------

    def _put(self, uid: str, owner: K | None, view: V | None, namespace: str) -> None:
        old = self._entries.get(uid)
        if old is not None and (view is None or old[0] != owner):
            del self._entries[uid]
            siblings = self._by_owner.get(old[0], {})
            siblings.pop(uid, None)
            if not siblings:
                self._by_owner.pop(old[0], None)
            self._changed(old[0], old[1], None)
            old = None
        if owner is None or view is None or (old is not None and old[1] == view):
            return
        self._entries[uid] = (owner, view, namespace)
        self._by_owner.setdefault(owner, {})[uid] = view
        self._changed(owner, old[1] if old is not None else None, view)

    def _replace(self, namespace: str | None, listed: list[tuple[str, K | None, V, str]], served: bool = True) -> None:
        """A fresh LIST: what is not in it is gone."""
        became_served = served and not self.served
        self.served = served
        present = {uid for uid, *_ in listed}
        for uid, (_, _, ns) in list(self._entries.items()):
            if (namespace is None or ns == namespace) and uid not in present:
                self._put(uid, None, None, ns)
        for uid, owner, view, ns in listed:
            self._put(uid, owner, view, ns)
        self._listed.add(namespace)
        if became_served and self._on_served is not None:
            self._on_served()
        if len(self._listed) == len(self._namespaces):
            self._ready.set()

    # --- streaming (one thread per namespace) ----------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop has closed: the operator is exiting
            self._stopping.set()

    def _digest(self, obj: Obj) -> tuple[str, K | None, V, str]:
        meta = obj.get("metadata") or {}
        return meta.get("uid", ""), self._owner(obj), self._view(obj), meta.get("namespace", "")

    def _run(self, namespace: str | None) -> None:
        api = kube_client.api_client()
        version = ""
        while not self._stopping.is_set():
            try:
                if not version:
                    try:
                        items, version = kube_objects.list_collection(
                            api, self.api_version, self.kind, namespace, self.selector
                        )
                    except kube_client.ApiException as exc:
                        if not kube_client.is_not_found(exc):
                            raise
                        self._post(self._replace, namespace, [], False)
                        time.sleep(UNSERVED_RETRY_SECONDS)
                        continue
                    self._post(self._replace, namespace, [self._digest(o) for o in items])
                stream = kube_client.WatchStream(
                    api, self.api_version, self.kind, namespace, version, self.selector, WATCH_SECONDS
                )
                for event in stream:
                    if self._stopping.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:  # too old: the apiserver no longer has our version
                            version = ""
                            break
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    if event.get("type") == "BOOKMARK":
                        continue
                    uid, owner, view, ns = self._digest(obj)
                    self._post(self._put, uid, owner, None if event["type"] == "DELETED" else view, ns)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                if isinstance(exc, kube_client.ApiException) and exc.status == 410:
                    version = ""
                log.warning("watching %s (%s): %s; again in %.0fs", self.kind, namespace or "all", exc, RETRY_SECONDS)
                time.sleep(RETRY_SECONDS)
