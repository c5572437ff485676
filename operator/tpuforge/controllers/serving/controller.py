"""ServingDeployment controller: observe -> a pure plan (serving/plan.py) -> apply -> one status write.

It runs in the same harness as the FineTuneJob controller (runtime/controller.py): informers (LIST + WATCH)
keep the ServingDeployments, their children (Deployment, pods, Service, claims, scrape configurations; selected
by label on the server) and the FineTuneJobs in memory, a keyed work queue runs one reconcile per object at a
time (folding repeated requests, retrying failures with backoff), and the API calls go through the async client
on the event loop. A change of an object, of one of its children, or of what decides the model a FineTuneJob it
names gives (`model_view`) asks for its reconcile. kopf watches nothing of this kind: its indices held every
handler back until each object had been indexed, which stalled a restart for minutes at about a thousand.

The reconcile reads memory (`observe`), applies the children the pure `plan.plan_children` asks for
(`apply`, through `children`: an unchanged child costs no call), reads the replicas, lets
`plan.plan_status` derive the status from the Deployment and its pods (`rollout.py`), and patches
it once, on the resourceVersion it was computed from (`write`; a 409 means a newer object is on its way:
the harness reconciles that one).
Children carry owner references, so deleting the object lets the garbage collector remove them; the XLA
cache PVC is owned only when the spec does not retain it. LoRA adapters (spec.adapters) are brought to every
ready replica over HTTP by `adapters` (in a thread: those calls block), without touching the pod
template; while one loads, the reconcile asks to run again soon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tpuforge import api, metrics
from tpuforge.api.constants import SERVING_KIND
from tpuforge.controllers.runtime import defaults
from tpuforge.controllers.runtime.controller import Controller
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.snapshot import (
    JobsByName,
    Snapshot,
    finetunejob_informer,
    job_object,
    model_view,
    name_key,
)
from tpuforge.controllers.serving import adapters as adapters
from tpuforge.controllers.serving import plan as plan
from tpuforge.controllers.serving.children import Children, ChildTerminating
from tpuforge.controllers.serving.rollout import observe_rollout, pod_problem, pod_ready, resolve_model
from tpuforge.kube import client as kube_client
from tpuforge.manifests import serving_inputs, vllm_server

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # namespace, name

__all__ = [
    "ServingDeploymentController",
    "adapter_requeue",
    "model_view",
    "observe_rollout",
    "pod_problem",
    "referenced_jobs",
    "resolve_model",
]


def referenced_jobs(spec: Mapping[str, Any]) -> set[str]:
    """The FineTuneJobs a spec serves, as its model or as adapters, by name."""
    spec = spec or {}
    refs = [((spec.get("model") or {}).get("fineTuneJobRef") or {}).get("name")]
    refs += [(a.get("fineTuneJobRef") or {}).get("name") for a in spec.get("adapters") or []]
    return {ref for ref in refs if ref}


class ServingDeploymentController:
    def __init__(self, finetunejobs: Informer[Any, Snapshot] | None = None, namespaces: Sequence[str] | None = None):
        self.harness: Controller[Key] = Controller(
            SERVING_KIND,
            self.reconcile,
            namespaces=namespaces,
            key=name_key,
            forget=self.forget,
            # The one annotation the reconcile reads: a new value asks for a rollout to the current images.
            annotations=(api.REFRESH_IMAGES_ANNOTATION,),
            on_object=self.references_changed,
            skip_deleting=True,
        )
        self.children = Children(namespaces, self.child_changed, self.request_all)
        self.harness.informers += self.children.informers
        self.jobs = JobsByName()
        self.by_job: dict[Key, set[str]] = {}  # (namespace, job name) -> the deployments that serve it
        self._refs: dict[Key, set[str]] = {}  # deployment -> the jobs it serves
        # The FineTuneJobs come from the FineTuneJob controller's informer when it runs (one watch of the kind
        # for the operator); without it, from an informer of this controller's own.
        if finetunejobs is None:
            self.harness.informers.append(finetunejob_informer(namespaces, self.finetunejob_changed))
        else:
            finetunejobs.listen(self.finetunejob_changed)

    @property
    def servingdeployments(self) -> Informer[Key, Snapshot]:
        """The informer of ServingDeployments."""
        return self.harness.objects

    # --- What asks for a reconcile (event loop thread) ------------------------------------------------

    def references_changed(self, key: Key, before: Snapshot | None, after: Snapshot | None) -> None:
        """Which FineTuneJobs each deployment serves (the harness asks for its reconcile)."""
        refs = referenced_jobs(after.spec) if after is not None else set()
        for job in self._refs.pop(key, set()) - refs:
            self.by_job.get((key[0], job), set()).discard(key[1])
        for job in refs:
            self.by_job.setdefault((key[0], job), set()).add(key[1])
        if refs:
            self._refs[key] = refs

    def child_changed(self, owner: Key, before: Obj | None, after: Obj | None) -> None:
        # A child that just appeared is the one the reconcile created (a pod's arrival does count).
        if before is None and after is not None and after.get("kind"):
            return
        self.harness.queue.request(owner)

    def request_all(self) -> None:
        """A scrape configuration's CRD was installed: every deployment gets its scrape configuration."""
        for key in self.servingdeployments.owners():
            self.harness.queue.request(key)

    def finetunejob_changed(self, _key: Any, before: Snapshot | None, after: Snapshot | None) -> None:
        name = self.jobs.changed(before, after)
        if name is None:
            return
        for sdep in self.by_job.get(name, ()):
            self.harness.queue.request((name[0], sdep))

    def forget(self, key: Key, _snap: Snapshot) -> None:
        """A deleted ServingDeployment: its metric series."""
        metrics.forget_servingdeployment(*key)

    # --- Reconcile --------------------------------------------------------------------------------------

    async def reconcile(self, key: Key, snap: Snapshot) -> float | None:
        return adapter_requeue(await self.run(key, snap))

    async def run(self, key: Key, snap: Snapshot) -> api.ServingDeploymentStatus:
        """Bring one ServingDeployment's children and status to what its spec asks; the status written."""
        o = self.observe(key, snap)
        p = plan.plan_children(o)
        if p.target is not None:
            try:
                deployment = await self.apply(key, p.target)
            except ChildTerminating as e:
                return await self.write(key, snap, o, plan.waiting_for_deletion(o, p, e.kind, e.name))
            p = plan.plan_status(o, p, p.target, await self.replicas(key, o, p.target, deployment))
        return await self.write(key, snap, o, p)

    def observe(self, key: Key, snap: Snapshot) -> plan.Observed:
        """The object, the FineTuneJobs it references and its Deployment, from memory."""
        namespace = snap.namespace
        o = plan.Observed(
            namespace=namespace,
            name=snap.name,
            uid=snap.uid,
            generation=snap.generation,
            spec=snap.spec,
            status=api.ServingDeploymentStatus.model_validate(snap.status),
            refresh_images=snap.annotations.get(api.REFRESH_IMAGES_ANNOTATION),
        )
        try:
            spec = plan.parse_spec(o.spec)
        except api.SpecError:
            return o  # the plan says why
        ref = spec.model.fine_tune_job_ref
        job = job_object(self.jobs.get((namespace, ref.name))) if ref is not None else None
        adapter_jobs = {
            r: job_object(self.jobs.get((namespace, r)))
            for a in spec.adapters
            if a.fine_tune_job_ref is not None and (r := a.fine_tune_job_ref.name)
        }
        existing = self.children.get(key, "Deployment", serving_inputs.names(o.name).deployment)
        return dataclasses.replace(o, job=job, adapter_jobs=adapter_jobs, existing=existing)

    async def apply(self, key: Key, t: plan.Target) -> Obj:
        """The plan's objects; returns the applied Deployment. Where the object has children (or a same-named
        predecessor's are still in memory) in two round trips: its claims, Service and budget together, then
        (once they all exist, none of them on its way out) the Deployment together with the monitors where their
        kind is served. A new object, with no child of its name anywhere, in one: nothing can be terminating
        and the Deployment's pods come two controllers later than the claim they mount. A new object's
        children thus cost one apiserver latency, a changed one's two, never one per child."""
        profile = defaults.current()
        kube_api = self.harness.api
        *first, deployment = t.objects
        monitors = [obj for _group_version, _plural, obj in t.monitors if self.children.served(obj["kind"])]

        async def second() -> Obj:
            applied, _ = await asyncio.gather(
                self.children.apply(kube_api, key, profile.workload(deployment)),
                asyncio.gather(*(self._apply_monitor(key, obj) for obj in monitors)),
            )
            return applied

        first_round = asyncio.gather(*(self.children.apply(kube_api, key, profile.workload(obj)) for obj in first))
        if self.children.none(key):
            applied, _ = await asyncio.gather(second(), first_round)
            return applied
        await first_round
        return await second()

    async def _apply_monitor(self, key: Key, obj: Obj) -> None:
        try:
            await self.children.apply(self.harness.api, key, obj)
        except kube_client.ApiException as exc:
            # A scrape config is optional: its CRD being removed (403 while it terminates, then 404) must not
            # hold up the server. The informer sees the kind go and stops asking.
            terminating = exc.status == 403 and "terminating" in str(exc.body)
            if not (terminating or exc.status == 404):
                raise
            log.info("%s/%s: no %s now: %s", key[0], key[1], obj["kind"], exc.reason)

    async def replicas(self, key: Key, o: plan.Observed, t: plan.Target, deployment: Obj) -> plan.Replicas:
        """The serving pods, and each ready replica's adapters brought to the plan's (over HTTP to the pod, in
        threads: those calls block)."""
        pods = self.children.serving_pods(key, o.uid)
        results: dict[str, adapters.PodResult] = {}
        if vllm_server.lora_enabled(t.spec):
            ready = [
                p
                for p in pods
                if (p.get("status") or {}).get("podIP") and pod_ready(p) and not p["metadata"].get("deletionTimestamp")
            ]
            synced = await asyncio.gather(
                *(
                    asyncio.to_thread(adapters.sync_pod, adapters.PodClient(p["status"]["podIP"]), t.adapters)
                    for p in ready
                )
            )
            results = {p["metadata"]["name"]: r for p, r in zip(ready, synced, strict=True)}
        for result in results.values():
            for adapter, _, seconds in result.loaded:
                metrics.observe_adapter_load(o.namespace, o.name, adapter, seconds)
        return plan.Replicas(deployment, pods, results)

    async def write(self, key: Key, snap: Snapshot, o: plan.Observed, p: plan.Plan) -> api.ServingDeploymentStatus:
        """One status write, on the resourceVersion the decision was computed from (a 409 ends the reconcile:
        the harness looks at the newer object); then the Events (an Event is only said once what it reports is
        recorded); then the metrics."""
        if p.status != o.status:
            await self.harness.patch_status(key, snap, p.status.model_dump(mode="json", by_alias=True))
        await asyncio.gather(
            *(self.harness.api.post_event(snap.ref, type_, reason, message) for type_, reason, message in p.events)
        )
        image = p.status.images.serving if p.status.images else None
        metrics.observe_servingdeployment(
            o.namespace, o.name, o.spec, p.status, image or defaults.current().images.serving
        )
        return p.status


DELETION_POLL_SECONDS = 2.0  # while a child's name is held by an object being deleted
ADAPTER_POLL_SECONDS = 3.0  # while an adapter loads on a ready replica
ADAPTER_RETRY_SECONDS = 15.0  # a failed fetch is tried again (the sidecar waits as long between tries)
# A vLLM process that restarts inside a ready pod may come back before its probes notice: look again anyway.
ADAPTER_RESYNC_SECONDS = 30.0


def adapter_requeue(status: api.ServingDeploymentStatus | None) -> float | None:
    """When to look again without a watch event asking: at a child being deleted (its deletion sends no
    event of ours), at the replicas' adapters."""
    if status is not None and plan.waits_for_deletion(status):
        return DELETION_POLL_SECONDS
    if status is None or not status.adapters:
        return None
    phases = {a.phase for a in status.adapters}
    if api.AdapterPhase.LOADING in phases and (status.ready_replicas or 0) > 0:
        return ADAPTER_POLL_SECONDS
    if api.AdapterPhase.FAILED in phases:
        return ADAPTER_RETRY_SECONDS
    return ADAPTER_RESYNC_SECONDS
