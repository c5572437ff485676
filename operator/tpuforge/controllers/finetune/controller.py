"""FineTuneJob controller: observe -> desired -> apply -> status, in the harness both kinds share
(runtime/controller.py: the objects' informer, the work queue, the reconcile's metrics, the 409, the echo of
its own status writes, start and close).

Informers (LIST + WATCH, selected by label on the server for the children) keep the FineTuneJobs and their
children (Jobs, JobSets, pods, training ConfigMaps) in memory, the children grouped by the owner's uid, and
Kueue's Workloads (which carry none of our labels) grouped by the Job or JobSet that owns each. Any change to
an object, to a child or to a child's Workload asks for a reconcile of the owner. kopf does not watch
FineTuneJobs: its per-event bookkeeping (a deep copy of each object for the diff base, handler progress, a task
per object) cost more CPU than the reconciles themselves.

The reconcile reads memory (no API reads), lets the pure `plan.plan` (finetune/plan.py) decide, and applies the plan:
create missing children, delete the ones to stop, patch the status on the resourceVersion it was computed
from (a 409 means a newer object is on its way: the harness reconciles that one), then post the Events. The
children's informers finish their first LIST before the FineTuneJobs' informer starts, so an operator that
restarts sees every child before it decides anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from tpuforge import metrics
from tpuforge.api import FineTuneJobStatus, set_condition
from tpuforge.api import finetune_reasons as c
from tpuforge.api.constants import (
    API_VERSION,
    FINETUNEJOB_KIND,
    JOBSET_API_VERSION,
    JOBSET_KIND,
    KUEUE_API_VERSION,
    KUEUE_WORKLOAD_KIND,
    LABEL_COMPONENT,
    LABEL_FINETUNEJOB,
    LABEL_JOBSET_NAME,
)
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.children import (
    ConfigView,
    JobView,
    PodView,
    WorkloadView,
    clip,
    config_view,
    job_view,
    jobset_view,
    pod_view,
    workload_owner_uid,
    workload_view,
)
from tpuforge.controllers.finetune.plan import ChildRef, Event, Observed, Plan, plan, status_patch
from tpuforge.controllers.runtime import defaults
from tpuforge.controllers.runtime.controller import Controller
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.snapshot import JobsByName, Snapshot, job_object, object_key
from tpuforge.kube import async_client as kube_async
from tpuforge.kube import client as kube_client
from tpuforge.manifests.common import LABEL_OWNER_UID
from tpuforge.manifests.finetune_common import COMPONENT_TRAINER

log = logging.getLogger(__name__)

Key = tuple[str, str]  # namespace, owner uid
Obj = dict[str, Any]
# What a pod needs to exist when it is created (else the Job controller backs off for seconds), and the Role
# its RoleBinding names: the apiserver reads that Role to check that the operator holds what it grants (the
# escalation check; only cluster admins skip it), and refuses a binding created beside its Role with 404.
POD_PREREQUISITES = ("ServiceAccount", "ConfigMap", "Role")
# A webhook that did not answer (a firewall, its controller restarting): try the create again after 5 s, then
# twice as long each time it still does not answer, up to every 30 s (a restarting controller is back in seconds,
# a firewall rule takes minutes).
WEBHOOK_RETRY_FIRST_SECONDS = 5.0
WEBHOOK_RETRY_SECONDS = 30.0
# A child created moments ago may not be in its informer yet: skip creating it again for this long.
CREATED_MEMORY_SECONDS = 30.0
CHILD_SELECTOR = f"{LABEL_FINETUNEJOB},{LABEL_OWNER_UID}"


class WebhookUnreachable(Exception):
    """Creating a child failed because the apiserver could not call an admission webhook."""

    def __init__(self, obj: Mapping[str, Any], webhook: str, why: str):
        self.kind, self.name, self.webhook, self.why = obj["kind"], obj["metadata"]["name"], webhook, why
        super().__init__(c.webhook_unreachable(self.kind, self.name, webhook, why))


# --- The controller ---------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def creation_groups(objs: list[Obj]) -> list[list[Obj]]:
    """What a pod needs at creation (and the Roles), then everything else; each group can be created at once."""
    first = [o for o in objs if o["kind"] in POD_PREREQUISITES]
    rest = [o for o in objs if o["kind"] not in POD_PREREQUISITES]
    return [g for g in (first, rest) if g]


def fresh(view: JobView | PodView | ConfigView) -> bool:
    """A child as it looks just after its creation changes no decision: the reconcile that created the Job
    or ConfigMap (or the Job whose controller made the pod) already counted on it. The next change of it
    does count. A Job created suspended (Kueue's) counts: its Workload may be in memory before it is."""
    if isinstance(view, JobView):
        return not (view.finished or view.deleting or view.suspended)
    if isinstance(view, PodView):
        return view.phase == "Pending" and not (view.unschedulable or view.deleting or view.start_time)
    return True


def owner_key(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    uid = (meta.get("labels") or {}).get(LABEL_OWNER_UID)
    return (meta.get("namespace", ""), uid) if uid else None


def workload_key(obj: Mapping[str, Any]) -> Key | None:
    """(namespace, uid of the Job or JobSet it queues): how Workloads are grouped."""
    uid = workload_owner_uid(obj)
    return ((obj.get("metadata") or {}).get("namespace", ""), uid) if uid else None


class FineTuneJobController:
    def __init__(self, namespaces: Sequence[str] | None = None):
        self.harness: Controller[Key] = Controller(
            FINETUNEJOB_KIND, self.reconcile, namespaces=namespaces, key=object_key, forget=self.forget
        )

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
        # Kueue's Workloads, by the Job or JobSet each queues (where Kueue is not installed: empty, unserved).
        self.workloads: Informer[Key, WorkloadView] = Informer(
            api_version=KUEUE_API_VERSION,
            kind=KUEUE_WORKLOAD_KIND,
            label_selector="",
            namespaces=namespaces,
            view=workload_view,
            owner=workload_key,
            on_change=self.workload_changed,
        )
        self.harness.informers += [self.jobs, self.jobsets, self.pods, self.configs, self.workloads]
        self._created: dict[tuple[str, str, str], float] = {}  # (owner uid, kind, name) -> when
        self._webhook_tries: dict[Key, int] = {}  # creates refused in a row for want of a webhook's answer
        self.by_name = JobsByName()  # what others start from
        # (namespace, job name) -> the jobs that wait for its merged model (spec.model.fineTuneJobRef).
        self.waiting: dict[Key, set[Key]] = {}
        self.finetunejobs.listen(self.finetunejob_changed)

    @property
    def finetunejobs(self) -> Informer[Key, Snapshot]:
        """The informer of FineTuneJobs (the ServingDeployment controller listens to it too)."""
        return self.harness.objects

    def child_changed(self, owner: Key, before: Any, after: Any) -> None:
        if before is None and after is not None and fresh(after):
            return
        self.harness.queue.request(owner)

    def workload_changed(self, job: Key, before: WorkloadView | None, after: WorkloadView | None) -> None:
        """A Workload belongs to the FineTuneJob that owns its Job or JobSet, once that is in memory (if it is
        not yet, the Job's own arrival asks for the reconcile: see `fresh`)."""
        job_uid = job[1]
        owner = self.jobs.owner_of(job_uid) or self.jobsets.owner_of(job_uid)
        if owner is not None:
            self.harness.queue.request(owner)

    def finetunejob_changed(self, _key: Key, before: Snapshot | None, after: Snapshot | None) -> None:
        """Keep the jobs by name, and wake the jobs that wait for this one's model."""
        name = self.by_name.changed(before, after)
        if name is None:
            return
        for waiter in self.waiting.pop(name, set()):
            self.harness.queue.request(waiter)

    def model_job(self, key: Key, snap: Snapshot) -> Obj | None:
        """The FineTuneJob spec.model.fineTuneJobRef names, until status.model keeps what it resolved to; a
        job that looks it up is woken by its next change."""
        ref = (snap.spec.get("model") or {}).get("fineTuneJobRef") or {}
        kept = (snap.status.get("model") or {}).get("fineTuneJob")
        if not ref.get("name") or kept == ref["name"]:
            return None
        name = (snap.namespace, ref["name"])
        self.waiting.setdefault(name, set()).add(key)
        return job_object(self.by_name.get(name))

    def observe(self, key: Key, snap: Snapshot) -> Observed:
        """The object (`snap`, as the harness has it) and its children, from memory."""
        try:
            status = FineTuneJobStatus.model_validate(snap.status)
        except ValidationError as exc:
            log.warning("%s/%s: unreadable status, treated as empty: %s", snap.namespace, snap.name, exc)
            status = FineTuneJobStatus()
        jobs = self.jobs.get(key) + self.jobsets.get(key)
        return Observed(
            namespace=snap.namespace,
            name=snap.name,
            uid=snap.uid,
            generation=snap.generation,
            spec=snap.spec,
            status=status,
            jobs=jobs,
            pods=self.pods.get(key),
            configs=self.configs.get(key),
            workloads=tuple(w for j in jobs for w in self.workloads.get((snap.namespace, j.uid))),
            deleting=snap.deleting,
            jobset_served=self.jobsets.served,
            model_job=self.model_job(key, snap),
        )

    async def reconcile(self, key: Key, snap: Snapshot) -> float | None:
        observed = self.observe(key, snap)
        return await self.apply(key, snap, observed, plan(observed, _now()))

    async def apply(self, key: Key, snap: Snapshot, observed: Observed, p: Plan) -> float | None:
        """The plan's API calls, on the event loop, in an order that is safe to interrupt anywhere:
        children (what a pod needs at creation first, then the rest, each group at once), deletions, the
        status (a 409 ends the reconcile: the harness looks at the newer object), and last the Events."""
        kube_api = self.harness.api
        try:
            for group in creation_groups([defaults.current().workload(obj) for obj in p.create]):
                await asyncio.gather(*(self.create_child(kube_api, snap.uid, obj) for obj in group))
        except WebhookUnreachable as exc:
            await self.webhook_unreachable(key, snap, observed, exc)
            tries = self._webhook_tries[key] = self._webhook_tries.get(key, 0) + 1
            return webhook_retry_seconds(tries)
        self._webhook_tries.pop(key, None)
        if p.create:
            webhooks_answer(observed.status, p.status)
        await asyncio.gather(*(self.delete_child(kube_api, snap.namespace, ref) for ref in p.delete))
        patch = status_patch(observed.status, p.status)
        if patch:
            await self.harness.patch_status(key, snap, patch)
            if observed.status.phase != p.status.phase:
                log.info("%s/%s: %s -> %s", snap.namespace, snap.name, observed.status.phase, p.status.phase)
        # After the status: an Event is only said once the transition it reports is recorded.
        await asyncio.gather(*(self.post_event(kube_api, snap, e) for e in p.events))
        if p.delete_self:
            log.info("%s/%s: ttlSecondsAfterFinished has passed; deleting it", snap.namespace, snap.name)
            await kube_api.delete(API_VERSION, FINETUNEJOB_KIND, snap.namespace, snap.name, uid=snap.uid)
            metrics.forget_finetunejob(snap.namespace, snap.name)
        else:
            metrics.observe_finetunejob(snap.namespace, snap.name, snap.spec, p.status)
        return p.requeue_after

    async def create_child(self, kube_api: kube_async.AsyncApi, owner_uid: str, obj: Mapping[str, Any]) -> None:
        key = (owner_uid, obj["kind"], obj["metadata"]["name"])
        now = time.monotonic()
        when = self._created.get(key)
        if when is not None and now - when < CREATED_MEMORY_SECONDS:
            return
        try:
            created = await kube_api.create_if_absent(obj)
        except kube_client.ApiException as exc:
            webhook = kube_client.unreachable_webhook(exc)
            if webhook is None:
                raise
            raise WebhookUnreachable(obj, *webhook) from exc
        if created:
            log.debug("created %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        self._created[key] = now
        if len(self._created) > 10_000:
            self._created = {k: t for k, t in self._created.items() if now - t < CREATED_MEMORY_SECONDS}

    async def webhook_unreachable(self, key: Key, snap: Snapshot, observed: Observed, exc: WebhookUnreachable) -> None:
        """Only this is written (the plan assumed its children exist): the WebhooksReachable condition naming the
        webhook and the fix, and a Warning when that is news."""
        log.warning("%s/%s: %s", snap.namespace, snap.name, exc)
        message = clip(str(exc))
        before = next((x for x in observed.status.conditions if x.type == c.WEBHOOKS_REACHABLE), None)
        generation = observed.generation
        conditions = set_condition(
            observed.status.conditions, c.WEBHOOKS_REACHABLE, "False", c.WEBHOOK_UNREACHABLE, message, generation
        )
        patch = {"conditions": [x.model_dump(mode="json", by_alias=True, exclude_none=True) for x in conditions]}
        try:
            await self.harness.patch_status(key, snap, patch)
        except kube_client.ApiException as write:
            if not kube_client.is_conflict(write):
                raise
            return  # a newer object is on its way; its reconcile says it again
        if before is None or before.status != "False" or before.message != message:
            await self.harness.api.post_event(snap.ref, "Warning", ev.WEBHOOK_DOWN, ev.webhook_down(exc.webhook))

    async def delete_child(self, kube_api: kube_async.AsyncApi, namespace: str, child: ChildRef) -> None:
        await kube_api.delete(child.api_version, child.kind, namespace, child.name)

    async def post_event(self, kube_api: kube_async.AsyncApi, snap: Snapshot, event: Event) -> None:
        await kube_api.post_event(snap.ref, event.type, event.reason, event.message)

    def forget(self, key: Key, snap: Snapshot) -> None:
        """A deleted FineTuneJob: its metric series, the children this controller remembers creating, and its
        wait for another job's model."""
        metrics.forget_finetunejob(snap.namespace, snap.name)
        self._created = {k: t for k, t in self._created.items() if k[0] != key[1]}
        self._webhook_tries.pop(key, None)
        for waiters in self.waiting.values():
            waiters.discard(key)


def webhook_retry_seconds(tries: int) -> float:
    """When to try a create again after `tries` refusals in a row for want of a webhook's answer."""
    return min(WEBHOOK_RETRY_SECONDS, WEBHOOK_RETRY_FIRST_SECONDS * 2.0 ** (tries - 1))


def webhooks_answer(before: FineTuneJobStatus, status: FineTuneJobStatus) -> None:
    """The plan's children were created: a WebhooksReachable False from an earlier try turns True."""
    if any(x.type == c.WEBHOOKS_REACHABLE and x.status == "False" for x in before.conditions):
        status.conditions = set_condition(
            status.conditions,
            c.WEBHOOKS_REACHABLE,
            "True",
            c.WEBHOOKS_ANSWER,
            c.WEBHOOKS_ANSWER_MESSAGE,
            status.observed_generation,
        )
