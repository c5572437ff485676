"""What a ServingDeployment serves and how far it is, as pure functions: the model its spec resolves to (a
gs:// URI, or a FineTuneJob's merged model), and what its Deployment and pods say about serving it (phase,
ready replicas, the model the ready pods serve, why a pod does not become ready)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tpuforge import api
from tpuforge.api import serving_reasons as sr
from tpuforge.api.job_models import job_model
from tpuforge.manifests import serving as manifests

Obj = dict[str, Any]


@dataclass(frozen=True)
class ModelSource:
    """What the spec's model resolves to now. `uri` is None while there is nothing to serve yet."""

    uri: str | None
    model_id: str | None
    revision: str = ""
    available: bool = True
    failed: bool = False
    reason: str = sr.MODEL_AVAILABLE_REASON
    message: str = ""


def resolve_model(spec: api.ServingDeploymentSpec, job: Obj | None) -> ModelSource:
    """The model to serve, from the spec's URI or from the referenced FineTuneJob (None when absent)."""
    if spec.model.uri is not None:
        return ModelSource(uri=spec.model.uri, model_id=spec.model.name, message=sr.serving_uri(spec.model.uri))
    ref = spec.model.fine_tune_job_ref
    assert ref is not None  # the spec allows exactly one source
    if job is None:
        return ModelSource(
            uri=None,
            model_id=None,
            available=False,
            reason=sr.FINETUNEJOB_NOT_FOUND,
            message=sr.job_not_found(ref.name),
        )
    found = job_model(job)
    model_id = spec.model.name or found.name
    if found.uri is not None:
        return ModelSource(
            uri=found.uri,
            model_id=model_id,
            revision=found.revision,
            message=sr.serving_merged(ref.name, found.uri),
        )
    if found.failed:
        return ModelSource(
            uri=None,
            model_id=model_id,
            available=False,
            failed=True,
            reason=sr.FINETUNEJOB_FAILED,
            message=sr.job_failed(ref.name),
        )
    return ModelSource(
        uri=None,
        model_id=model_id,
        available=False,
        reason=sr.WAITING_FOR_MODEL,
        message=sr.waiting_for_job_model(ref.name, found.phase),
    )


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
        if waiting.get("reason") in sr.CRASH_REASONS or (init and failed_exit and state.get("terminated")):
            why = (term.get("message") or "").strip() or waiting.get("message") or waiting.get("reason") or ""
            code = sr.exit_code(term["exitCode"]) if failed_exit else ""
            if init:
                return sr.MODEL_FETCH_FAILED, sr.model_fetch_failed(pod, code, why)
            return sr.SERVER_FAILING, sr.server_failing(pod, cs.get("name"), code, why)
    return None


def pod_problem(pod: Obj) -> tuple[str, str] | None:
    """Why a serving pod is not becoming ready, when it says so (reason, message)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return sr.UNSCHEDULABLE, sr.unscheduled(name, cond.get("message") or cond.get("reason"))
    return _container_problem(name, status.get("initContainerStatuses") or [], init=True) or _container_problem(
        name, status.get("containerStatuses") or [], init=False
    )


def pod_ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def observe_rollout(
    replicas: int, deployment: Obj | None, pods: list[Obj], desired_uri: str, previous_uri: str | None
) -> Rollout:
    """Phase, ready count and served model from the Deployment's status and its pods. While a Recreate
    rollout has taken the old pods down, the message says that nothing serves, and why."""
    out = _observe(replicas, deployment, pods, desired_uri, previous_uri)
    dep = deployment or {}
    annotations = dep.get("metadata", {}).get("annotations") or {}
    rollout = int(annotations.get("deployment.kubernetes.io/revision", "1")) > 1
    recreate = ((dep.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate"
    waiting = out.phase in (api.ServingPhase.PENDING, api.ServingPhase.LOADING) and out.reason != sr.SCALED_TO_ZERO
    if recreate and rollout and waiting and not out.rolled_out:
        return replace(out, message=out.message + sr.RECREATING)
    return out


def _observe(
    replicas: int, deployment: Obj | None, pods: list[Obj], desired_uri: str, previous_uri: str | None
) -> Rollout:
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
        p["metadata"].get("annotations", {}).get(manifests.ANNOTATION_MODEL_URI) for p in live if pod_ready(p)
    } - {None}
    if rolled_out or not served:
        served_uri: str | None = desired_uri
    elif len(served) == 1:
        served_uri = next(iter(served))
    else:  # old and new pods both ready mid-roll: the clients may get either
        served_uri = previous_uri if previous_uri in served else desired_uri

    problems = [p for p in (pod_problem(pod) for pod in live if not pod_ready(pod)) if p]
    stalled = next(
        (
            c
            for c in dep_status.get("conditions") or []
            if c.get("type") == "Progressing" and c.get("reason") == sr.PROGRESS_DEADLINE_EXCEEDED
        ),
        None,
    )
    P = api.ServingPhase
    if replicas == 0:
        return Rollout(P.PENDING, ready, sr.SCALED_TO_ZERO, sr.SCALED_TO_ZERO_MESSAGE, rolled_out, None)
    if ready >= replicas:
        if rolled_out:
            msg = sr.replicas_ready(ready, replicas)
        else:
            msg = sr.rolling_out_while_serving(ready, replicas, problems[0][1] if problems else None)
        return Rollout(P.READY, ready, sr.READY_REASON, msg, rolled_out, served_uri)
    if stalled is not None:
        why = problems[0][1] if problems else stalled.get("message", "")
        return Rollout(
            P.FAILED,
            ready,
            sr.ROLLOUT_STALLED,
            sr.rollout_stalled(why),
            rolled_out,
            served_uri,
        )
    scheduled = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if problems:
        reason, msg = problems[0]
        phase = P.PENDING if reason == sr.UNSCHEDULABLE and not scheduled else P.LOADING
        return Rollout(phase, ready, reason, sr.not_ready(ready, replicas, msg), rolled_out, served_uri)
    if scheduled:
        return Rollout(
            P.LOADING,
            ready,
            sr.LOADING,
            sr.loading(ready, replicas),
            rolled_out,
            served_uri,
        )
    return Rollout(
        P.PENDING,
        ready,
        sr.PENDING,
        sr.pending(replicas),
        rolled_out,
        served_uri,
    )


def running_images(deployment: Obj | None) -> api.ResolvedImages | None:
    """The images the existing Deployment's pods run (None: no Deployment, or not one of ours): for an object
    from before status.images was recorded, what its pods keep across an operator upgrade."""
    pod = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec") or {}
    found = {c.get("name"): c.get("image") for c in [*pod.get("initContainers", []), *pod.get("containers", [])]}
    if not found.get(manifests.VLLM_CONTAINER):
        return None
    return api.ResolvedImages(
        serving=found[manifests.VLLM_CONTAINER],
        model_fetch=found.get(manifests.FETCH_CONTAINER),
        adapters=found.get(manifests.ADAPTERS_CONTAINER),
    )


def current_model(deployment: Obj | None) -> tuple[str | None, str]:
    """The model URI and revision the existing Deployment's pods were built for."""
    ann = ((deployment or {}).get("spec", {}).get("template", {}).get("metadata", {}) or {}).get("annotations") or {}
    return ann.get(manifests.ANNOTATION_MODEL_URI), ann.get(manifests.ANNOTATION_MODEL_REVISION, "")
