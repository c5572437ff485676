"""Every pod in the cluster, kept in memory by one LIST and then a WATCH, as a kubelet and a scheduler keep
theirs: a pass of the node agent reads this instead of listing every pod again. With thousands of pods (the
operator-scale benchmark's) a LIST per pass cost the apiserver and the agent most of a core, and passes come
on every pod change.

The view may trail the apiserver by a watch event: the agent's passes are level-based (each change wakes
another), and what the agent itself just wrote that a pass must not forget (a binding) it overlays itself.
A watch that ends is resumed from the last resourceVersion seen; one the apiserver says is too old (410), or
that fails, starts again from a LIST.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("tpuforge_sandbox.agent")
Obj = dict[str, Any]

WATCH_SECONDS = 120


class PodApi(Protocol):
    def list_pods(self) -> tuple[list[Obj], str]: ...

    def watch_pods(self, resource_version: str, timeout: int) -> Any: ...


class PodCache:
    def __init__(self, kube: PodApi, on_change: Callable[[], None], stopping: threading.Event) -> None:
        self._kube = kube
        self._on_change = on_change
        self._stopping = stopping
        self._lock = threading.Lock()
        self._pods: dict[str, Obj] = {}  # uid -> the pod as last seen
        self._rv = ""

    def list(self) -> list[Obj]:
        """The pods as last seen (the same objects: a pass may note on one what it just did)."""
        with self._lock:
            return list(self._pods.values())

    def sync(self) -> None:
        """Replace the view with a LIST; the watch resumes from its resourceVersion."""
        pods, rv = self._kube.list_pods()
        with self._lock:
            self._pods = {p["metadata"]["uid"]: p for p in pods}
            self._rv = rv
        self._on_change()

    def apply(self, event: Obj) -> bool:
        """One watch event into the view; False when the watch must start again from a LIST."""
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            return False
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        with self._lock:
            if uid and kind == "DELETED":
                self._pods.pop(uid, None)
            elif uid and kind in ("ADDED", "MODIFIED"):
                self._pods[uid] = pod
            self._rv = meta.get("resourceVersion") or self._rv
        return True

    def watch(self) -> None:
        """Keep the view current until `stopping` (a thread's target; `sync` has run once before)."""
        while not self._stopping.is_set():
            try:
                for line in self._kube.watch_pods(self._rv, timeout=WATCH_SECONDS):
                    if not self.apply(json.loads(line)):
                        break
                    self._on_change()
                    if self._stopping.is_set():
                        return
                else:
                    continue  # the watch's time was up: resume from where it was
                self.sync()  # too old: what was missed comes back with a LIST
            except Exception as e:
                log.debug("pod watch ended: %s", e)
                if self._stopping.wait(1.0):
                    return
                try:
                    self.sync()
                except Exception as e2:
                    log.debug("pod list failed: %s", e2)


def with_bindings(pods: list[Obj], bound: dict[str, str]) -> list[Obj]:
    """The pods with the bindings the agent made (`bound`: uid -> node) that the view does not show yet; a
    binding the view shows, or of a pod gone, is dropped from `bound`."""
    if not bound:
        return pods
    out, live = [], set()
    for pod in pods:
        uid = pod["metadata"]["uid"]
        live.add(uid)
        node = bound.get(uid)
        if node is not None and not pod["spec"].get("nodeName"):
            pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
        elif node is not None:
            del bound[uid]  # the view has caught up
        out.append(pod)
    for uid in set(bound) - live:
        del bound[uid]
    return out
