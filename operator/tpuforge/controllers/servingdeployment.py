"""ServingDeployment controller: observe -> desired -> apply -> status.

One level-based `reconcile(namespace, name)` does all the work and is safe to run at any time. Watch events
on the object, on its Deployment and pods, and changes of the FineTuneJob it serves (an informer of its own,
cheaper than kopf's watch) ask for it through a keyed work
queue (one run per object at a time, failures retried with backoff). It reads what it needs from the API,
applies the children the pure `tpuforge.manifests.serving` builds, derives the status from the Deployment
and its pods, and patches it on the resourceVersion it read. Children carry owner references, so deleting
the object lets the garbage collector remove them; the XLA cache PVC is owned only when the spec does not
retain it. LoRA adapters (spec.adapters) are brought to every ready replica over HTTP by
`serving_adapters`, without touching the pod template; while one loads, the reconcile asks to run again soon.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge import api, kube, metrics
from tpuforge.api.conditions import ConditionStatus
from tpuforge.api.constants import (
    API_VERSION,
    FINETUNEJOB_KIND,
    GROUP,
    LABEL_COMPONENT,
    LABEL_SERVING,
    SERVING_KIND,
    SERVING_PLURAL,
    VERSION,
)
from tpuforge.controllers import defaults
from tpuforge.controllers import serving_adapters as adapters
from tpuforge.controllers.finetune_snapshot import Snapshot, finetunejob_informer
from tpuforge.controllers.informer import Informer
from tpuforge.controllers.workqueue import KeyedQueue
from tpuforge.manifests import serving as manifests
from tpuforge.manifests.common import LABEL_OWNER_UID

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ANNOTATION_SPEC_HASH = "tpuforge.dev/spec-hash"
DEFAULT_MODEL = "gemma4-31b"
# The StorageClass of the serving volumes a spec names none for; the chart sets it to its Hyperdisk Balanced
# class (TPU v6e VMs attach Hyperdisk only). Unset: the cluster's default class.
ENV_STORAGE_CLASS = "TPUFORGE_STORAGE_CLASS"
CRASH_REASONS = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "InvalidImageName",
)


# --- Resolving the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """What the spec's model resolves to now. `uri` is None while there is nothing to serve yet."""

    uri: str | None
    model_id: str | None
    revision: str = ""
    available: bool = True
    failed: bool = False
    reason: str = "ModelAvailable"
    message: str = ""


def resolve_model(spec: api.ServingDeploymentSpec, job: Obj | None) -> ModelSource:
    """The model to serve, from the spec's URI or from the referenced FineTuneJob (None when absent)."""
    if spec.model.uri is not None:
        return ModelSource(uri=spec.model.uri, model_id=spec.model.name, message=f"serving {spec.model.uri}")
    ref = spec.model.fine_tune_job_ref
    assert ref is not None  # the spec allows exactly one source
    if job is None:
        return ModelSource(
            uri=None,
            model_id=None,
            available=False,
            reason="FineTuneJobNotFound",
            message=f"FineTuneJob {ref.name!r} does not exist yet; waiting for it (spec.model.fineTuneJobRef)",
        )
    model_id = spec.model.name or job.get("spec", {}).get("model", {}).get("name")
    status = api.FineTuneJobStatus.model_validate(job.get("status") or {})
    merged = status.outputs.merged_model_uri if status.outputs else None
    if status.phase == api.FineTunePhase.SUCCEEDED and merged:
        meta = job.get("metadata", {})
        # The same output URI can hold a newer model after the job runs again: the revision tells them apart.
        revision = f"{meta.get('uid', '')}/{status.completion_time or ''}"
        return ModelSource(
            uri=merged,
            model_id=model_id,
            revision=revision,
            message=f"serving FineTuneJob {ref.name!r}'s merged model {merged}",
        )
    if status.phase == api.FineTunePhase.FAILED:
        return ModelSource(
            uri=None,
            model_id=model_id,
            available=False,
            failed=True,
            reason="FineTuneJobFailed",
            message=f"FineTuneJob {ref.name!r} failed, so it has no merged model to serve; fix and rerun it, "
            "or point spec.model.uri at a merged model",
        )
    return ModelSource(
        uri=None,
        model_id=model_id,
        available=False,
        reason="WaitingForModel",
        message=f"waiting for FineTuneJob {ref.name!r} to succeed (phase {status.phase or 'Pending'})",
    )


# --- Deriving status from what runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rollout:
    """What the Deployment and its pods say about serving."""

    phase: api.ServingPhase
    ready_replicas: int
    reason: str
    message: str
    rolled_out: bool
    served_uri: str | None


def _container_problem(pod: str, statuses: list[Obj], init: bool) -> tuple[str, str] | None:
    for cs in statuses:
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        waiting = state.get("waiting") or {}
        term = state.get("terminated") or last.get("terminated") or {}
        failed_exit = term.get("exitCode") not in (None, 0)
        if waiting.get("reason") in CRASH_REASONS or (init and failed_exit and state.get("terminated")):
            why = (term.get("message") or "").strip() or waiting.get("message") or waiting.get("reason") or ""
            code = f" (exit code {term['exitCode']})" if failed_exit else ""
            if init:
                return "ModelFetchFailed", f"pod {pod}: model fetch failed{code}: {why}"
            return "ServerFailing", f"pod {pod}: container {cs.get('name')} is failing{code}: {why}"
    return None


def pod_problem(pod: Obj) -> tuple[str, str] | None:
    """Why a serving pod is not becoming ready, when it says so (reason, message)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "Unschedulable", f"pod {name} is not scheduled: {cond.get('message') or cond.get('reason')}"
    return _container_problem(name, status.get("initContainerStatuses") or [], init=True) or _container_problem(
        name, status.get("containerStatuses") or [], init=False
    )


def _pod_ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def observe_rollout(
    replicas: int, deployment: Obj | None, pods: list[Obj], desired_uri: str, previous_uri: str | None
) -> Rollout:
    """Phase, ready count and served model from the Deployment's status and its pods."""
    dep_status = (deployment or {}).get("status") or {}
    generation = (deployment or {}).get("metadata", {}).get("generation", 0)
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    rolled_out = (
        deployment is not None
        and int(dep_status.get("observedGeneration") or 0) >= generation
        and updated == replicas
        and total == replicas
        and ready >= replicas
    )
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    served = {
        p["metadata"].get("annotations", {}).get(manifests.ANNOTATION_MODEL_URI) for p in live if _pod_ready(p)
    } - {None}
    if rolled_out or not served:
        served_uri: str | None = desired_uri
    elif len(served) == 1:
        served_uri = next(iter(served))
    else:  # old and new pods both ready mid-roll: the clients may get either
        served_uri = previous_uri if previous_uri in served else desired_uri

    problems = [p for p in (pod_problem(pod) for pod in live if not _pod_ready(pod)) if p]
    stalled = next(
        (
            c
            for c in dep_status.get("conditions") or []
            if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        ),
        None,
    )
    P = api.ServingPhase
    if replicas == 0:
        return Rollout(P.PENDING, ready, "ScaledToZero", "spec.replicas is 0", rolled_out, None)
    if ready >= replicas:
        msg = f"{ready}/{replicas} replicas ready"
        if not rolled_out:
            msg += "; rolling out the new template while the old pods serve"
            if problems:
                msg += f" ({problems[0][1]})"
        return Rollout(P.READY, ready, "Ready", msg, rolled_out, served_uri)
    if stalled is not None:
        why = problems[0][1] if problems else stalled.get("message", "")
        return Rollout(
            P.FAILED,
            ready,
            "RolloutStalled",
            f"pods did not become ready within the progress deadline: {why}",
            rolled_out,
            served_uri,
        )
    scheduled = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if problems:
        reason, msg = problems[0]
        phase = P.PENDING if reason == "Unschedulable" and not scheduled else P.LOADING
        return Rollout(phase, ready, reason, f"{ready}/{replicas} replicas ready; {msg}", rolled_out, served_uri)
    if scheduled:
        return Rollout(
            P.LOADING,
            ready,
            "Loading",
            f"{ready}/{replicas} replicas ready; fetching the model and compiling (XLA compilation "
            "takes 8-10 minutes on a cold cache)",
            rolled_out,
            served_uri,
        )
    return Rollout(
        P.PENDING,
        ready,
        "Pending",
        f"waiting for {replicas} pod(s) to be scheduled on a TPU node",
        rolled_out,
        served_uri,
    )


# --- Applying children ----------------------------------------------------------------------------------


def spec_hash(obj: Obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class Children:
    """Reads and writes the children as plain dicts, through tpuforge.kube."""

    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client

    def get(self, obj: Obj) -> Obj | None:
        meta = obj["metadata"]
        return kube.get(self.api_client, obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])

    def apply(self, desired: Obj) -> Obj:
        """Create `desired`, or bring the existing object to it. The desired object's hash, kept in an
        annotation, makes an unchanged object cost one read. Fields the server owns are kept: a Service's
        cluster IP, a PVC's (immutable) spec."""
        h = spec_hash(desired)
        desired = copy.deepcopy(desired)
        desired["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = h
        existing = self.get(desired)
        if existing is not None and existing["metadata"].get("deletionTimestamp"):
            # A same-named predecessor's child on its way out: create ours once it is gone.
            raise RuntimeError(f"{desired['kind']} {desired['metadata']['name']} is being deleted; retrying")
        if existing is None:
            try:
                return kube.create(self.api_client, desired)
            except ApiException as e:
                if not kube.is_already_exists(e):
                    raise
                existing = self.get(desired)
                if existing is None:
                    raise
        meta = existing["metadata"]
        if (meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH) == h:
            return existing
        want = desired["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), **want.get("labels", {})}
        meta["annotations"] = {**(meta.get("annotations") or {}), **want["annotations"]}
        # Ours are replaced (a retained cache PVC drops its owner); anyone else's are kept.
        others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != SERVING_KIND]
        meta["ownerReferences"] = others + want.get("ownerReferences", [])
        kind = desired["kind"]
        if kind == "Service":
            existing["spec"] = {**existing.get("spec", {}), **desired["spec"]}
        elif kind != "PersistentVolumeClaim":
            existing["spec"] = desired["spec"]
        existing.pop("status", None)
        path = kube.resource_path(desired["apiVersion"], kind, meta["namespace"], meta["name"])
        # PUT with the resourceVersion just read: a concurrent writer makes this fail (409) and retry.
        return kube.request(self.api_client, "PUT", path, body=existing)

    def served(self, group_version: str, plural: str) -> bool:
        """Whether the apiserver serves a resource (a monitoring CRD is installed)."""
        try:
            resources = kube.request(self.api_client, "GET", f"/apis/{group_version}").get("resources") or []
        except ApiException as e:
            if kube.is_not_found(e) or e.status == 403:
                return False
            raise
        return any(r.get("name") == plural for r in resources)

    def serving_pods(self, namespace: str, owner_uid: str) -> list[Obj]:
        """This object's pods (not a same-named predecessor's, which may still be going away)."""
        selector = f"{LABEL_OWNER_UID}={owner_uid},{LABEL_COMPONENT}={manifests.COMPONENT}"
        return kube.list_objects(self.api_client, "v1", "Pod", namespace, selector)


# --- Reconcile ------------------------------------------------------------------------------------------


class Conflict(Exception):
    """The object changed after it was read: reconcile the newer one."""


def _current_model(deployment: Obj | None) -> tuple[str | None, str]:
    """The model URI and revision the existing Deployment's pods were built for."""
    ann = ((deployment or {}).get("spec", {}).get("template", {}).get("metadata", {}) or {}).get("annotations") or {}
    return ann.get(manifests.ANNOTATION_MODEL_URI), ann.get(manifests.ANNOTATION_MODEL_REVISION, "")


def reconcile(api_client: client.ApiClient, namespace: str, name: str) -> api.ServingDeploymentStatus | None:
    """Bring one ServingDeployment's children and status to what its spec asks; returns the status written
    (None when the object is gone). Raises Conflict when the object changed meanwhile."""
    body = kube.get(api_client, API_VERSION, SERVING_KIND, namespace, name)
    if body is None:
        # Also after a run that was in flight when the object went: its series must not outlive it.
        metrics.forget_servingdeployment(namespace, name)
        return None
    if body["metadata"].get("deletionTimestamp"):
        return None
    return _reconcile(Children(api_client), body)


def _reconcile(children: Children, body: Obj) -> api.ServingDeploymentStatus:
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation")
    old = api.ServingDeploymentStatus.model_validate(body.get("status") or {})
    status = old.model_copy(deep=True)
    status.observed_generation = generation
    events: list[tuple[str, str, str]] = []

    def finish(phase: api.ServingPhase, reason: str, message: str) -> api.ServingDeploymentStatus:
        status.phase = phase
        ready: ConditionStatus = "True" if phase == api.ServingPhase.READY else "False"
        status.conditions = api.set_condition(status.conditions, "Ready", ready, reason, message, generation)
        if status.phase != old.phase:
            events.append(("Warning" if phase == api.ServingPhase.FAILED else "Normal", phase.value, message))
        if status != old:
            try:
                patch = status.model_dump(mode="json", by_alias=True)
                kube.patch_status(children.api_client, body, patch, resource_version=meta["resourceVersion"])
            except ApiException as e:
                if kube.is_conflict(e):
                    raise Conflict(f"{namespace}/{name}") from e
                raise
        # After the status: an Event is only said once what it reports is recorded.
        for type_, reason_, message_ in events:
            kube.post_event(children.api_client, body, type_, reason_, message_)
        metrics.observe_servingdeployment(namespace, name, body.get("spec") or {}, status)
        return status

    try:
        spec = defaults.current().apply(api.parse(api.ServingDeploymentSpec, body.get("spec") or {}))
    except api.SpecError as e:
        return finish(api.ServingPhase.FAILED, "InvalidSpec", str(e))

    job = None
    if spec.model.fine_tune_job_ref is not None:
        ref = spec.model.fine_tune_job_ref.name
        job = kube.get(children.api_client, API_VERSION, FINETUNEJOB_KIND, namespace, ref)
    adapter_jobs = {
        a.fine_tune_job_ref.name: kube.get(children.api_client, API_VERSION, FINETUNEJOB_KIND, namespace, r)
        for a in spec.adapters
        if a.fine_tune_job_ref is not None and (r := a.fine_tune_job_ref.name)
    }
    source = resolve_model(spec, job)
    served = manifests.served_model_name(name, spec)
    errors = manifests.name_errors(name) + api.check_serving(spec, source.model_id, served)
    if errors:
        return finish(api.ServingPhase.FAILED, "InvalidSpec", str(api.SpecError(errors)))
    status.conditions = api.set_condition(
        status.conditions,
        "ModelAvailable",
        "True" if source.available else "False",
        source.reason,
        source.message,
        generation,
    )

    dep_name = manifests.names(name).deployment
    existing = kube.get(children.api_client, "apps/v1", "Deployment", namespace, dep_name)
    uri, revision = source.uri, source.revision
    if uri is None:
        # Nothing new to serve: keep serving what the Deployment already runs, if anything.
        uri, revision = _current_model(existing)
        if uri is None:
            phase = api.ServingPhase.FAILED if source.failed else api.ServingPhase.WAITING_FOR_MODEL
            status.ready_replicas = 0
            return finish(phase, source.reason, source.message)

    inp = manifests.ServingInputs(
        owner=manifests.owner(namespace, name, meta["uid"]),
        spec=spec,
        model_uri=uri,
        model=api.model_shape(source.model_id or DEFAULT_MODEL),
        slice=api.tpu_slice(spec.tpu.slice),
        model_revision=revision,
        adapter_job_rank=adapters.max_job_rank(adapter_jobs),
        storage_class=os.environ.get(ENV_STORAGE_CLASS) or None,
    )
    children.apply(manifests.xla_cache_pvc(inp))
    model_claim = manifests.model_pvc(inp)
    if model_claim is not None:
        children.apply(model_claim)
    children.apply(manifests.service(inp))
    deployment = children.apply(manifests.deployment(inp))
    for monitor in manifests.MONITOR_KINDS:
        if children.served(f"{monitor.group}/{monitor.version}", monitor.plural):
            children.apply(monitor.build(inp))
    if existing is not None and _current_model(existing) != (uri, revision):
        events.append(("Normal", "RollingModel", f"rolling the Deployment {dep_name} to model {uri}"))

    pods = children.serving_pods(namespace, meta["uid"])
    rollout = observe_rollout(spec.replicas, deployment, pods, uri, old.model_uri)
    status.ready_replicas = rollout.ready_replicas
    status.endpoint = manifests.endpoint(name, namespace)
    status.model_uri = rollout.served_uri
    status.conditions = api.set_condition(
        status.conditions,
        "RolledOut",
        "True" if rollout.rolled_out else "False",
        "RolledOut" if rollout.rolled_out else "RollingOut",
        "every replica runs the current template" if rollout.rolled_out else "a rollout is in progress",
        generation,
    )
    _sync_adapters(status, old, spec, inp, pods, adapter_jobs, events)
    return finish(rollout.phase, rollout.reason, rollout.message)


ADAPTER_CONDITIONS = ("AdaptersReady", "AdaptersPromoted")


def _sync_adapters(
    status: api.ServingDeploymentStatus,
    old: api.ServingDeploymentStatus,
    spec: api.ServingDeploymentSpec,
    inp: manifests.ServingInputs,
    pods: list[Obj],
    jobs: Mapping[str, Obj | None],
    events: list[tuple[str, str, str]],
) -> None:
    """Bring every ready replica's adapters to the spec, then say per adapter what serves it."""
    meta, generation = inp.owner, status.observed_generation
    explicit_rank = spec.vllm.lora.max_lora_rank
    desired = adapters.resolve_adapters(
        spec, inp.model.id, jobs, old.adapters, manifests.vllm_lora_rank(explicit_rank) if explicit_rank else None
    )
    results: dict[str, adapters.PodResult] = {}
    if manifests.lora_enabled(spec):
        for pod in pods:
            ip = (pod.get("status") or {}).get("podIP")
            if ip and _pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
                results[pod["metadata"]["name"]] = adapters.sync_pod(adapters.PodClient(ip), desired)
    for result in results.values():
        for adapter, _, seconds in result.loaded:
            metrics.observe_adapter_load(meta.namespace, meta.name, adapter, seconds)
    status.adapters = adapters.summarise(desired, results, len(results))
    status.adapters_ready = adapters.adapters_ready(status.adapters) if spec.adapters else None
    for reason, text in adapters.adapter_events(old.adapters, status.adapters, list(results.values())):
        events.append(("Warning" if reason == adapters.EVENT_FAILED else "Normal", reason, text))
    if not spec.adapters:
        status.conditions = [c for c in status.conditions if c.type not in ADAPTER_CONDITIONS]
        return
    failed = [a for a in status.adapters if a.phase == api.AdapterPhase.FAILED]
    loading = [a for a in status.adapters if a.phase == api.AdapterPhase.LOADING]
    unsupported = next((r.lora_unsupported for r in results.values() if r.lora_unsupported), None)
    if unsupported is not None:
        why = adapters.unsupported_message(spec.vllm.image, unsupported)
        ready: tuple[ConditionStatus, str, str] = ("False", adapters.RUNTIME_LORA_UNSUPPORTED, why)
    elif failed:
        ready = ("False", "AdapterFailed", f"{failed[0].name}: {failed[0].message}")
    elif loading:
        ready = ("False", "AdaptersLoading", f"{loading[0].name}: {loading[0].message}")
    else:
        ready = ("True", "AdaptersReady", f"{status.adapters_ready} adapters ready on every ready replica")
    status.conditions = api.set_condition(status.conditions, "AdaptersReady", *ready, generation)
    held = [d.held_back for d in desired if d.held_back is not None]
    promoted: tuple[ConditionStatus, str, str] = (
        ("False", held[0][0], "; ".join(m for _, m in held))
        if held
        else ("True", "Promoted", "every adapter serves its newest output that may take traffic")
    )
    status.conditions = api.set_condition(status.conditions, "AdaptersPromoted", *promoted, generation)


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
            status = reconcile(kube.api_client(), *key)
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


ADAPTER_POLL_SECONDS = 3.0  # while an adapter loads on a ready replica
ADAPTER_RETRY_SECONDS = 15.0  # a failed fetch is tried again (the sidecar waits as long between tries)
# A vLLM process that restarts inside a ready pod may come back before its probes notice: look again anyway.
ADAPTER_RESYNC_SECONDS = 30.0


def adapter_requeue(status: api.ServingDeploymentStatus | None) -> float | None:
    """When to look at the replicas' adapters again without a watch event asking."""
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
