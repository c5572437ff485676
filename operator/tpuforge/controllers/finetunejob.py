"""FineTuneJob controller: observe -> desired -> apply -> status.

kopf watches the FineTuneJobs; informers (LIST + WATCH, selected by label on the server) keep their children
(Jobs, JobSets, pods, training ConfigMaps) in memory, grouped by the owner's uid. Any change to an object or to a child
asks for a reconcile of the owner. The reconcile reads memory (no API reads), lets the pure
`finetune_plan.plan` decide, and applies the plan: create missing children, delete the ones to stop, patch
the status on the resourceVersion it was computed from (a 409 means a newer object is on its way: reconcile
that one), then post the Events. The informers finish their first LIST before kopf starts watching the
FineTuneJobs, so an operator that restarts sees every child before it decides anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import kopf
from pydantic import ValidationError

from tpuforge import kube, metrics
from tpuforge.api import FineTuneJobStatus
from tpuforge.api.constants import (
    API_VERSION,
    FINETUNEJOB_KIND,
    FINETUNEJOB_PLURAL,
    GROUP,
    JOBSET_API_VERSION,
    JOBSET_KIND,
    LABEL_COMPONENT,
    LABEL_FINETUNEJOB,
    LABEL_JOBSET_NAME,
    VERSION,
)
from tpuforge.controllers.finetune_children import (
    ConfigView,
    JobView,
    PodView,
    config_view,
    job_view,
    jobset_view,
    pod_view,
)
from tpuforge.controllers.finetune_plan import ChildRef, Event, Observed, Plan, plan, status_patch
from tpuforge.controllers.informer import Informer
from tpuforge.controllers.workqueue import KeyedQueue
from tpuforge.manifests.common import LABEL_OWNER_UID
from tpuforge.manifests.finetune import COMPONENT_TRAINER

log = logging.getLogger(__name__)

Key = tuple[str, str]  # namespace, owner uid
Obj = dict[str, Any]
T = TypeVar("T")
WORKERS = 64  # reconciles at once
API_THREADS = 128  # blocking API calls at once (a reconcile makes up to three at a time)
# What a pod needs to exist when it is created (else the Job controller backs off for seconds).
POD_PREREQUISITES = ("ServiceAccount", "ConfigMap")
CONFLICT_RETRY_SECONDS = 1.0  # if the newer object's watch event is lost, look again anyway
# A child created moments ago may not be in its informer yet: skip creating it again for this long.
CREATED_MEMORY_SECONDS = 30.0
CHILD_SELECTOR = f"{LABEL_FINETUNEJOB},{LABEL_OWNER_UID}"


@dataclass(frozen=True)
class Snapshot:
    """What the reconcile needs of a FineTuneJob, out of its watch event. `spec` and `status` are the event's
    parsed JSON, which nothing mutates: each event brings new dicts."""

    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    deleting: bool
    spec: Mapping[str, Any]
    status: Mapping[str, Any]

    @property
    def ref(self) -> dict[str, Any]:
        """The object as kube.patch_status and kube.post_event address it."""
        return {
            "apiVersion": API_VERSION,
            "kind": FINETUNEJOB_KIND,
            "metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid},
        }


def snapshot(body: Mapping[str, Any]) -> Snapshot:
    meta = body.get("metadata") or {}
    return Snapshot(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=meta.get("resourceVersion", ""),
        deleting=bool(meta.get("deletionTimestamp")),
        spec=body.get("spec") or {},
        status=body.get("status") or {},
    )


# --- The controller ---------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def creation_groups(objs: list[Obj]) -> list[list[Obj]]:
    """What a pod needs at creation, then everything else; each group can be created at once."""
    first = [o for o in objs if o["kind"] in POD_PREREQUISITES]
    rest = [o for o in objs if o["kind"] not in POD_PREREQUISITES]
    return [g for g in (first, rest) if g]


def fresh(view: JobView | PodView | ConfigView) -> bool:
    """A child as it looks just after its creation changes no decision: the reconcile that created the Job
    or ConfigMap (or the Job whose controller made the pod) already counted on it. The next change of it
    does count."""
    if isinstance(view, JobView):
        return not (view.finished or view.deleting)
    if isinstance(view, PodView):
        return view.phase == "Pending" and not (view.unschedulable or view.deleting or view.start_time)
    return True


def owner_key(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    uid = (meta.get("labels") or {}).get(LABEL_OWNER_UID)
    return (meta.get("namespace", ""), uid) if uid else None


class FineTuneJobController:
    def __init__(self, namespaces: Sequence[str] | None = None):
        self.objects: dict[Key, Snapshot] = {}
        self.queue: KeyedQueue[Key] = KeyedQueue(self.reconcile, WORKERS, name="finetunejob")

        # Each informer lists and watches one kind of child (RBAC: list and watch on it).
        trainer_configs = f"{CHILD_SELECTOR},{LABEL_COMPONENT}={COMPONENT_TRAINER}"
        self.jobs: Informer[Key, JobView] = Informer(
            api_version="batch/v1",
            kind="Job",
            # A JobSet's own Jobs are its business: the operator follows the JobSet and its pods.
            label_selector=f"{CHILD_SELECTOR},!{LABEL_JOBSET_NAME}",
            namespaces=namespaces,
            view=job_view,
            owner=owner_key,
            on_change=self.child_changed,
        )
        # Multi-host attempts. Where JobSet is not installed this informer is empty and says so (`served`).
        self.jobsets: Informer[Key, JobView] = Informer(
            api_version=JOBSET_API_VERSION,
            kind=JOBSET_KIND,
            label_selector=CHILD_SELECTOR,
            namespaces=namespaces,
            view=jobset_view,
            owner=owner_key,
            on_change=self.child_changed,
        )
        self.pods: Informer[Key, PodView] = Informer(
            api_version="v1",
            kind="Pod",
            label_selector=CHILD_SELECTOR,
            namespaces=namespaces,
            view=pod_view,
            owner=owner_key,
            on_change=self.child_changed,
        )
        self.configs: Informer[Key, ConfigView] = Informer(
            api_version="v1",
            kind="ConfigMap",
            label_selector=trainer_configs,
            namespaces=namespaces,
            view=config_view,
            owner=owner_key,
            on_change=self.child_changed,
        )
        self.executor = ThreadPoolExecutor(API_THREADS, thread_name_prefix="finetunejob")
        self._created: dict[tuple[str, str, str], float] = {}  # (owner uid, kind, name) -> when
        # Our last status write per object: (resourceVersion it was based on, the new one, the new status).
        # Until the watch brings the new version, the last event holds the old one; reading ours instead
        # saves a second, doomed (409) write.
        self._written: dict[Key, tuple[str, str, dict[str, Any]]] = {}

    async def start(self) -> None:
        """Start the informers; return once each has its first LIST in memory."""
        await asyncio.gather(self.jobs.start(), self.jobsets.start(), self.pods.start(), self.configs.start())

    def child_changed(self, owner: Key, before: Any, after: Any) -> None:
        if before is None and after is not None and fresh(after):
            return
        self.queue.request(owner)

    def object_changed(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        snap = snapshot(body)
        key = (snap.namespace, snap.uid)
        if event_type == "DELETED":
            self.objects.pop(key, None)
            self.forget(key)
            metrics.forget_finetunejob(snap.namespace, snap.name)
            return
        self.objects[key] = snap
        written = self._written.get(key)
        if written is not None and written[1] == snap.resource_version:
            return  # the echo of our own status write: the reconcile that made it already saw this state
        self.queue.request(key)

    def observe(self, key: Key) -> tuple[Snapshot, Observed] | None:
        snap = self.objects.get(key)
        if snap is None:
            return None
        written = self._written.get(key)
        if written is not None:
            if written[0] == snap.resource_version:
                snap = dataclasses.replace(snap, resource_version=written[1], status=written[2])
            else:
                self._written.pop(key, None)
        try:
            status = FineTuneJobStatus.model_validate(snap.status)
        except ValidationError as exc:
            log.warning("%s/%s: unreadable status, treated as empty: %s", snap.namespace, snap.name, exc)
            status = FineTuneJobStatus()
        observed = Observed(
            namespace=snap.namespace,
            name=snap.name,
            uid=snap.uid,
            generation=snap.generation,
            spec=snap.spec,
            status=status,
            jobs=self.jobs.get(key) + self.jobsets.get(key),
            pods=self.pods.get(key),
            configs=self.configs.get(key),
            deleting=snap.deleting,
            jobset_served=self.jobsets.served,
        )
        return snap, observed

    async def reconcile(self, key: Key) -> float | None:
        seen = self.observe(key)
        if seen is None:
            return None
        snap, observed = seen
        metrics.RECONCILES.labels(FINETUNEJOB_KIND).inc()
        started = time.perf_counter()
        try:
            return await self.apply(snap, observed, plan(observed, _now()))
        except Exception:
            metrics.RECONCILE_ERRORS.labels(FINETUNEJOB_KIND).inc()
            raise
        finally:
            metrics.RECONCILE_DURATION.labels(FINETUNEJOB_KIND).observe(time.perf_counter() - started)

    async def apply(self, snap: Snapshot, observed: Observed, p: Plan) -> float | None:
        """The plan's API calls, each in a worker thread, in an order that is safe to interrupt anywhere:
        children (what a pod needs at creation first, then the rest, each group at once), deletions, the
        status, and last the Events."""
        api = kube.api_client()
        for group in creation_groups(p.create):
            await asyncio.gather(*(self.create_child(api, snap.uid, obj) for obj in group))
        await asyncio.gather(*(self.delete_child(api, snap.namespace, c) for c in p.delete))
        patch = status_patch(observed.status, p.status)
        if patch:
            try:
                new = await self.call(lambda: kube.patch_status(api, snap.ref, patch, snap.resource_version))
            except kube.ApiException as exc:
                if not kube.is_conflict(exc):
                    raise
                metrics.RECONCILE_CONFLICTS.labels(FINETUNEJOB_KIND).inc()
                log.debug("%s/%s: status changed meanwhile; reconciling the newer one", snap.namespace, snap.name)
                return CONFLICT_RETRY_SECONDS
            if observed.status.phase != p.status.phase:
                log.info("%s/%s: %s -> %s", snap.namespace, snap.name, observed.status.phase, p.status.phase)
            meta = new.get("metadata") or {}
            self._written[(snap.namespace, snap.uid)] = (
                snap.resource_version,
                meta.get("resourceVersion", ""),
                new.get("status") or {},
            )
        # After the status: an Event is only said once the transition it reports is recorded.
        await asyncio.gather(*(self.post_event(api, snap, e) for e in p.events))
        if p.delete_self:
            log.info("%s/%s: ttlSecondsAfterFinished has passed; deleting it", snap.namespace, snap.name)
            await self.call(
                lambda: kube.delete(api, API_VERSION, FINETUNEJOB_KIND, snap.namespace, snap.name, uid=snap.uid)
            )
            metrics.forget_finetunejob(snap.namespace, snap.name)
        else:
            metrics.observe_finetunejob(snap.namespace, snap.name, snap.spec, p.status)
        return p.requeue_after

    async def call(self, request: Callable[[], T]) -> T:
        """A blocking API call, in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, request)

    async def create_child(self, api: Any, owner_uid: str, obj: Mapping[str, Any]) -> None:
        key = (owner_uid, obj["kind"], obj["metadata"]["name"])
        now = time.monotonic()
        when = self._created.get(key)
        if when is not None and now - when < CREATED_MEMORY_SECONDS:
            return
        if await self.call(lambda: kube.create_if_absent(api, obj)):
            log.debug("created %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        self._created[key] = now
        if len(self._created) > 10_000:
            self._created = {k: t for k, t in self._created.items() if now - t < CREATED_MEMORY_SECONDS}

    async def delete_child(self, api: Any, namespace: str, child: ChildRef) -> None:
        await self.call(lambda: kube.delete(api, child.api_version, child.kind, namespace, child.name))

    async def post_event(self, api: Any, snap: Snapshot, event: Event) -> None:
        await self.call(lambda: kube.post_event(api, snap.ref, event.type, event.reason, event.message))

    def forget(self, key: Key) -> None:
        self.queue.forget(key)
        self._written.pop(key, None)
        self._created = {k: t for k, t in self._created.items() if k[0] != key[1]}

    async def close(self) -> None:
        for informer in (self.jobs, self.jobsets, self.pods, self.configs):
            informer.stop()
        await self.queue.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


# --- Wiring -------------------------------------------------------------------------------------------------


@kopf.on.startup()
async def start_finetunejob_controller(memo: kopf.Memo, **_: Any) -> None:
    # Startup handlers finish before kopf watches anything: the children are in memory before the first
    # FineTuneJob event asks for a reconcile.
    controller = FineTuneJobController(getattr(memo, "namespaces", None))
    await controller.start()
    memo.finetunejobs = controller


@kopf.on.cleanup()
async def stop_finetunejob_controller(memo: kopf.Memo, **_: Any) -> None:
    controller: FineTuneJobController | None = getattr(memo, "finetunejobs", None)
    if controller is not None:
        await controller.close()


@kopf.on.event(GROUP, VERSION, FINETUNEJOB_PLURAL)
async def finetunejob_changed(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    controller: FineTuneJobController = memo.finetunejobs
    controller.object_changed(event.get("type"), body)
