"""ServingDeployment controller: observe -> a pure plan (serving_plan) -> apply -> one status write.

One level-based `reconcile(namespace, name)` does all the work and is safe to run at any time. Watch events
on the object, on its Deployment and pods, and changes of the FineTuneJob it serves (an informer of its own,
cheaper than kopf's watch) ask for it through a keyed work queue (one run per object at a time, failures
retried with backoff). It reads what it needs from the API (`observe`), applies the children the pure
`serving_plan.plan_children` asks for (`apply`, through `serving_children`), reads the replicas back, lets
`serving_plan.plan_status` derive the status from the Deployment and its pods (`serving_rollout`), and patches
it once, on the resourceVersion it read (`write`). Children carry owner references, so deleting
the object lets the garbage collector remove them; the XLA cache PVC is owned only when the spec does not
retain it. LoRA adapters (spec.adapters) are brought to every ready replica over HTTP by
`serving_adapters`, without touching the pod template; while one loads, the reconcile asks to run again soon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge import api, metrics
from tpuforge.api.constants import (
    API_VERSION,
    FINETUNEJOB_KIND,
    GROUP,
    LABEL_SERVING,
    SERVING_KIND,
    SERVING_PLURAL,
    VERSION,
)
from tpuforge.controllers.finetune.snapshot import Snapshot, finetunejob_informer
from tpuforge.controllers.runtime import defaults
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.workqueue import KeyedQueue
from tpuforge.controllers.serving import adapters as adapters
from tpuforge.controllers.serving import plan as plan
from tpuforge.controllers.serving.children import Children, ChildTerminating
from tpuforge.controllers.serving.rollout import observe_rollout, pod_problem, pod_ready, resolve_model
from tpuforge.kube import client as kube_client
from tpuforge.kube import events as kube_events
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests import serving_inputs, vllm_server
from tpuforge.manifests.common import LABEL_OWNER_UID

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# The StorageClass of the serving volumes a spec names none for; the chart sets it to its Hyperdisk Balanced
# class (TPU v6e VMs attach Hyperdisk only). Unset: the cluster's default class.
ENV_STORAGE_CLASS = "TPUFORGE_STORAGE_CLASS"

__all__ = [
    "ServingDeploymentController",
    "adapter_requeue",
    "model_view",
    "observe_rollout",
    "pod_problem",
    "reconcile",
    "resolve_model",
    "servingdeployments_by_job",
]


# --- Reconcile ------------------------------------------------------------------------------------------


class Conflict(Exception):
    """The object changed after it was read: reconcile the newer one."""


def reconcile(api_client: client.ApiClient, namespace: str, name: str) -> api.ServingDeploymentStatus | None:
    """Bring one ServingDeployment's children and status to what its spec asks; returns the status written
    (None when the object is gone). Raises Conflict when the object changed meanwhile."""
    body = kube_objects.get(api_client, API_VERSION, SERVING_KIND, namespace, name)
    if body is None:
        # Also after a run that was in flight when the object went: its series must not outlive it.
        metrics.forget_servingdeployment(namespace, name)
        return None
    if body["metadata"].get("deletionTimestamp"):
        return None
    children = Children(api_client)
    o = observe(children, body)
    p = plan.plan_children(o)
    if p.target is not None:
        try:
            deployment = apply(children, p.target)
        except ChildTerminating as e:
            return write(children, body, o, plan.waiting_for_deletion(o, p, e.kind, e.name))
        p = plan.plan_status(o, p, p.target, replicas(children, o, p.target, deployment))
    return write(children, body, o, p)


def observe(children: Children, body: Obj) -> plan.Observed:
    """The object, the FineTuneJobs it references and its Deployment as they are now."""
    meta = body["metadata"]
    namespace, api_client = meta["namespace"], children.api_client
    o = plan.Observed(
        namespace=namespace,
        name=meta["name"],
        uid=meta["uid"],
        generation=meta.get("generation"),
        spec=body.get("spec") or {},
        status=api.ServingDeploymentStatus.model_validate(body.get("status") or {}),
    )
    try:
        spec = plan.parse_spec(o.spec)
    except api.SpecError:
        return o  # the plan says why
    ref = spec.model.fine_tune_job_ref
    job = kube_objects.get(api_client, API_VERSION, FINETUNEJOB_KIND, namespace, ref.name) if ref is not None else None
    adapter_jobs = {
        a.fine_tune_job_ref.name: kube_objects.get(api_client, API_VERSION, FINETUNEJOB_KIND, namespace, r)
        for a in spec.adapters
        if a.fine_tune_job_ref is not None and (r := a.fine_tune_job_ref.name)
    }
    existing = kube_objects.get(api_client, "apps/v1", "Deployment", namespace, serving_inputs.names(o.name).deployment)
    storage_class = os.environ.get(ENV_STORAGE_CLASS) or None
    return dataclasses.replace(o, job=job, adapter_jobs=adapter_jobs, existing=existing, storage_class=storage_class)


def apply(children: Children, t: plan.Target) -> Obj:
    """The plan's objects, in order; monitors where their kind is served. Returns the applied Deployment."""
    applied = [children.apply(obj) for obj in t.objects]
    for group_version, plural, obj in t.monitors:
        if children.served(group_version, plural):
            children.apply(obj)
    return applied[-1]


def replicas(children: Children, o: plan.Observed, t: plan.Target, deployment: Obj) -> plan.Replicas:
    """The serving pods, and each ready replica's adapters brought to the plan's (over HTTP to the pod)."""
    pods = children.serving_pods(o.namespace, o.uid)
    results: dict[str, adapters.PodResult] = {}
    if vllm_server.lora_enabled(t.spec):
        for pod in pods:
            ip = (pod.get("status") or {}).get("podIP")
            if ip and pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
                results[pod["metadata"]["name"]] = adapters.sync_pod(adapters.PodClient(ip), t.adapters)
    for result in results.values():
        for adapter, _, seconds in result.loaded:
            metrics.observe_adapter_load(o.namespace, o.name, adapter, seconds)
    return plan.Replicas(deployment, pods, results)


def write(children: Children, body: Obj, o: plan.Observed, p: plan.Plan) -> api.ServingDeploymentStatus:
    """One status write, on the resourceVersion read; then the Events (an Event is only said once what it
    reports is recorded); then the metrics."""
    if p.status != o.status:
        try:
            patch = p.status.model_dump(mode="json", by_alias=True)
            resource_version = body["metadata"]["resourceVersion"]
            kube_objects.patch_status(children.api_client, body, patch, resource_version=resource_version)
        except ApiException as e:
            if kube_client.is_conflict(e):
                raise Conflict(f"{o.namespace}/{o.name}") from e
            raise
    for type_, reason, message in p.events:
        kube_events.post_event(children.api_client, body, type_, reason, message)
    metrics.observe_servingdeployment(o.namespace, o.name, o.spec, p.status, defaults.current().images.serving)
    return p.status


# --- Wiring -------------------------------------------------------------------------------------------------

Key = tuple[str, str]  # namespace, name
WORKERS = 8  # reconciles applying at once; each holds one worker thread while it talks to the apiserver
CONFLICT_RETRY_SECONDS = 1.0  # if the newer object's watch event is lost, look again anyway
CHILD = {LABEL_SERVING: kopf.PRESENT, LABEL_OWNER_UID: kopf.PRESENT}


class ServingDeploymentController:
    """Watch events ask for reconciles by (namespace, name); the queue runs one at a time per object, folds
    repeated requests together and retries failures with backoff."""

    def __init__(
        self,
        by_job: Mapping[Key, Iterable[str]],
        finetunejobs: Informer[Any, Snapshot] | None = None,
        namespaces: Sequence[str] | None = None,
    ) -> None:
        self.queue: KeyedQueue[Key] = KeyedQueue(self.reconcile, WORKERS, name="servingdeployment")
        self.executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="servingdeployment")
        self._by_job = by_job
        # A change of what decides a model to serve asks for the reconcile of the ServingDeployments that
        # reference the job. The FineTuneJobs come from the FineTuneJob controller's informer when it runs
        # (one watch of the kind for the operator); without it, from an informer of this controller's own.
        self._own: Informer[Any, Snapshot] | None = None
        if finetunejobs is None:
            finetunejobs = self._own = finetunejob_informer(namespaces, self.finetunejob_changed)
        else:
            finetunejobs.listen(self.finetunejob_changed)

    async def start(self) -> None:
        if self._own is not None:
            await self._own.start()

    def finetunejob_changed(self, _key: Any, before: Snapshot | None, after: Snapshot | None) -> None:
        job = after or before
        if job is None or (before is not None and after is not None and model_view(before) == model_view(after)):
            return
        for sdep in self._by_job.get((job.namespace, job.name), ()):
            self.queue.request((job.namespace, sdep))

    async def reconcile(self, key: Key) -> float | None:
        metrics.RECONCILES.labels(SERVING_KIND).inc()
        started = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, self.apply, key)
        except Exception:
            metrics.RECONCILE_ERRORS.labels(SERVING_KIND).inc()
            raise
        finally:
            metrics.RECONCILE_DURATION.labels(SERVING_KIND).observe(time.perf_counter() - started)

    def apply(self, key: Key) -> float | None:
        try:
            status = reconcile(kube_client.api_client(), *key)
        except Conflict:
            metrics.RECONCILE_CONFLICTS.labels(SERVING_KIND).inc()
            log.debug("%s/%s: changed meanwhile; reconciling the newer one", *key)
            return CONFLICT_RETRY_SECONDS
        return adapter_requeue(status)

    async def close(self) -> None:
        if self._own is not None:
            self._own.stop()
        await self.queue.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


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


def model_view(job: Snapshot) -> tuple[str, ...]:
    """What `resolve_model` and `serving_adapters.resolve_adapter` read of a FineTuneJob."""
    status, spec = job.status, job.spec
    outputs, evaluation = status.get("outputs") or {}, status.get("evaluation") or {}
    return (
        job.uid,
        str(status.get("phase") or ""),
        str(outputs.get("mergedModelUri") or ""),
        str(outputs.get("adapterUri") or ""),
        str(evaluation.get("passed")),
        str(status.get("completionTime") or ""),
        str((spec.get("model") or {}).get("name") or ""),
        str((spec.get("lora") or {}).get("rank") or ""),
        str(spec.get("evaluation") is not None),
    )


@kopf.index(GROUP, VERSION, SERVING_PLURAL)
def servingdeployments_by_job(
    namespace: str | None, name: str, spec: Mapping[str, Any], **_: Any
) -> dict[Key, str] | None:
    """The ServingDeployments that serve each FineTuneJob, as their model or as an adapter, so that a job's
    events reach them. (kopf keeps one value per key and object: a job referenced twice maps once.)"""
    spec = spec or {}
    refs = [((spec.get("model") or {}).get("fineTuneJobRef") or {}).get("name")]
    refs += [(a.get("fineTuneJobRef") or {}).get("name") for a in spec.get("adapters") or []]
    keys = {(namespace or "", ref) for ref in refs if ref}
    return dict.fromkeys(keys, name) or None


@kopf.on.startup()
async def start_servingdeployment_controller(memo: kopf.Memo, **kwargs: Any) -> None:
    # kopf passes every index to every handler as a keyword argument named after its function; it stays live.
    by_job: kopf.Index[Key, str] = kwargs["servingdeployments_by_job"]
    # The FineTuneJob controller's startup handler is registered first (its module is imported first): when it
    # runs, its informer of FineTuneJobs serves both controllers.
    finetunejobs = getattr(memo, "finetunejobs", None)
    controller = ServingDeploymentController(
        by_job, finetunejobs.finetunejobs if finetunejobs else None, getattr(memo, "namespaces", None)
    )
    memo.servingdeployments = controller
    await controller.start()


@kopf.on.cleanup()
async def stop_servingdeployment_controller(memo: kopf.Memo, **_: Any) -> None:
    controller: ServingDeploymentController | None = getattr(memo, "servingdeployments", None)
    if controller is not None:
        await controller.close()


@kopf.on.event(GROUP, VERSION, SERVING_PLURAL)
async def servingdeployment_changed(
    event: Mapping[str, Any], namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    controller: ServingDeploymentController = memo.servingdeployments
    key = (namespace or "", name)
    if event.get("type") == "DELETED":
        metrics.forget_servingdeployment(*key)
    # Deleted too: that run finds it gone and drops its series, after any run still in flight.
    controller.queue.request(key)


@kopf.on.event("apps", "v1", "deployments", labels=CHILD)
@kopf.on.event("v1", "pods", labels=CHILD)
async def servingdeployment_child_changed(
    namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    # The label holds the owner's name: names are DNS labels (they name the Service), never shortened.
    memo.servingdeployments.queue.request((namespace or "", labels[LABEL_SERVING]))
