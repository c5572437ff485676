"""The ServingDeployment decisions, pure: from what was observed to the children to apply, then, from what the
applied Deployment, its pods and their adapters say, the status and the Events. The controller
(controller.py) does the reads and writes around them:

    observe -> plan_children (the objects; or a final status: invalid spec, nothing to serve yet)
            -> apply them -> observe the replicas (and bring their adapters to the spec)
            -> plan_status (status, adapter conditions, Events) -> one status write, then the Events
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpuforge import api
from tpuforge.api import serving_reasons as sr
from tpuforge.api.conditions import ConditionStatus
from tpuforge.controllers.runtime import defaults
from tpuforge.controllers.serving import adapters as adapters
from tpuforge.controllers.serving.rollout import (
    ModelSource,
    current_model,
    observe_rollout,
    resolve_model,
    running_images,
)
from tpuforge.manifests import serving as manifests
from tpuforge.manifests import serving_inputs, vllm_server

Obj = dict[str, Any]

DEFAULT_MODEL = "gemma4-31b"


@dataclass(frozen=True)
class Observed:
    """What the reconcile read before writing anything."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]  # as stored
    status: api.ServingDeploymentStatus
    job: Obj | None = None  # the FineTuneJob of spec.model.fineTuneJobRef
    adapter_jobs: Mapping[str, Obj | None] = field(default_factory=dict)  # by name, for spec.adapters
    existing: Obj | None = None  # the Deployment as it was
    refresh_images: str | None = None  # annotation tpuforge.dev/refresh-images


@dataclass(frozen=True)
class Replicas:
    """What runs, read after the children were applied: the Deployment, its pods, and each ready replica's
    adapters after they were brought to the spec."""

    deployment: Obj
    pods: list[Obj]
    adapters: Mapping[str, adapters.PodResult] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """What the children are built from, and the adapters each ready replica should serve."""

    spec: api.ServingDeploymentSpec
    inputs: serving_inputs.ServingInputs
    adapters: list[adapters.DesiredAdapter]
    # The objects to apply, in order; the Deployment last. Monitors: (group/version, plural, object), applied
    # where the cluster serves their kind.
    objects: list[Obj]
    monitors: list[tuple[str, str, Obj]]


@dataclass
class Plan:
    status: api.ServingDeploymentStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # type, reason, message
    target: Target | None = None  # None once the status is final: nothing to apply


def parse_spec(spec: Mapping[str, Any], images: api.ResolvedImages | None = None) -> api.ServingDeploymentSpec:
    """The spec with the operator's defaults (its default images `images`, where given); raises api.SpecError."""
    return defaults.current().apply(api.parse(api.ServingDeploymentSpec, spec or {}), images)


def pinned_images(o: Observed) -> api.ResolvedImages:
    """The object's default images: those recorded in its status, or (an object from before they were) those its
    pods run; the operator's current ones when it has neither, or when annotation tpuforge.dev/refresh-images
    has a new value (the user asks for a rollout). So an operator upgrade restarts no server."""
    recorded = o.status.images
    if recorded is not None and recorded.refresh != o.refresh_images:
        recorded = None
    elif recorded is None:
        running = running_images(o.existing)
        recorded = running.model_copy(update={"refresh": o.refresh_images}) if running is not None else None
    return defaults.current().pinned(api.ServingDeploymentSpec, recorded, o.refresh_images)


def finish(p: Plan, old: api.ServingDeploymentStatus, phase: api.ServingPhase, reason: str, message: str) -> Plan:
    """The phase and the Ready condition that says why; an Event when the phase changed."""
    p.status.phase = phase
    ready: ConditionStatus = "True" if phase == api.ServingPhase.READY else "False"
    generation = p.status.observed_generation
    p.status.conditions = api.set_condition(p.status.conditions, sr.READY, ready, reason, message, generation)
    if phase != old.phase:
        p.events.append(("Warning" if phase == api.ServingPhase.FAILED else "Normal", phase.value, message))
    p.target = None
    return p


def waiting_for_deletion(o: Observed, p: Plan, kind: str, name: str) -> Plan:
    """A child's name is still held by an object being deleted (a same-named predecessor's): Pending, and
    the Ready condition says what it waits for."""
    message = sr.waiting_for_deletion(kind, name)
    return finish(p, o.status, api.ServingPhase.PENDING, sr.WAITING_FOR_DELETION, message)


def waits_for_deletion(status: api.ServingDeploymentStatus) -> bool:
    ready = next((c for c in status.conditions if c.type == sr.READY), None)
    return ready is not None and ready.reason == sr.WAITING_FOR_DELETION


def plan_children(o: Observed) -> Plan:
    """The children the spec asks for; or, when there is nothing to apply, the final status saying why."""
    status = o.status.model_copy(deep=True)
    status.observed_generation = o.generation
    status.selector = manifests.selector(o.name)
    p = Plan(status)
    try:
        status.images = pinned_images(o)
        spec = parse_spec(o.spec, status.images)
    except api.SpecError as e:
        return finish(p, o.status, api.ServingPhase.FAILED, sr.INVALID_SPEC, str(e))
    source = resolve_model(spec, o.job)
    errors = serving_inputs.name_errors(o.name) + api.check_serving(
        spec, source.model_id, serving_inputs.served_model_name(o.name, spec)
    )
    errors += defaults.current().profile_errors(spec)
    if errors:
        return finish(p, o.status, api.ServingPhase.FAILED, sr.INVALID_SPEC, str(api.SpecError(errors)))
    model_status: ConditionStatus = "True" if source.available else "False"
    status.conditions = api.set_condition(
        status.conditions, sr.MODEL_AVAILABLE, model_status, source.reason, source.message, o.generation
    )
    uri, revision = source.uri, source.revision
    if uri is None:
        # Nothing new to serve: keep serving what the Deployment already runs, if anything.
        uri, revision = current_model(o.existing)
        if uri is None:
            status.ready_replicas = 0
            phase = api.ServingPhase.FAILED if source.failed else api.ServingPhase.WAITING_FOR_MODEL
            return finish(p, o.status, phase, source.reason, source.message)
    inp = _inputs(o, spec, source, uri, revision)
    if o.existing is not None and current_model(o.existing) != (uri, revision):
        dep_name = serving_inputs.names(o.name).deployment
        p.events.append(("Normal", sr.ROLLING_MODEL, sr.rolling_model(dep_name, uri)))
    explicit_rank = spec.vllm.lora.max_lora_rank
    p.target = Target(
        spec=spec,
        inputs=inp,
        adapters=adapters.resolve_adapters(
            spec,
            inp.model.id,
            o.adapter_jobs,
            o.status.adapters,
            vllm_server.vllm_lora_rank(explicit_rank) if explicit_rank else None,
        ),
        objects=[
            *(claim for claim in (manifests.xla_cache_pvc(inp), manifests.model_pvc(inp)) if claim is not None),
            manifests.service(inp),
            manifests.disruption_budget(inp),
            manifests.deployment(inp),
        ],
        monitors=[(f"{m.group}/{m.version}", m.plural, m.build(inp)) for m in manifests.MONITOR_KINDS],
    )
    return p


def _inputs(
    o: Observed, spec: api.ServingDeploymentSpec, source: ModelSource, uri: str, revision: str
) -> serving_inputs.ServingInputs:
    return serving_inputs.ServingInputs(
        owner=serving_inputs.owner(o.namespace, o.name, o.uid),
        spec=spec,
        model_uri=uri,
        model=api.model_shape(source.model_id or DEFAULT_MODEL),
        slice=api.tpu_slice(spec.tpu.slice),
        model_revision=revision,
        adapter_job_rank=adapters.max_job_rank(o.adapter_jobs),
        storage_class=defaults.current().storage_class,
    )


def plan_status(o: Observed, p: Plan, t: Target, r: Replicas) -> Plan:
    """The status from what runs: the rollout, the adapters on the ready replicas, the phase."""
    status, generation = p.status, p.status.observed_generation
    rollout = observe_rollout(t.spec.replicas, r.deployment, r.pods, t.inputs.model_uri, o.status.model_uri)
    status.ready_replicas = rollout.ready_replicas
    status.replicas = (r.deployment.get("status") or {}).get("replicas") or 0
    status.endpoint = manifests.endpoint(o.name, o.namespace)
    status.model_uri = rollout.served_uri
    status.conditions = api.set_condition(
        status.conditions,
        sr.ROLLED_OUT,
        "True" if rollout.rolled_out else "False",
        sr.ROLLED_OUT_REASON if rollout.rolled_out else sr.ROLLING_OUT,
        sr.ROLLED_OUT_MESSAGE if rollout.rolled_out else sr.ROLLING_OUT_MESSAGE,
        generation,
    )
    adapter_status(o, p, t, r)
    return finish(p, o.status, rollout.phase, rollout.reason, rollout.message)


def adapter_status(o: Observed, p: Plan, t: Target, r: Replicas) -> None:
    """Per adapter, what serves it; the AdaptersReady and AdaptersPromoted conditions; Events for loads,
    replacements, removals and new failures."""
    status, generation = p.status, p.status.observed_generation
    status.adapters = adapters.summarise(t.adapters, r.adapters, len(r.adapters))
    status.adapters_ready = adapters.adapters_ready(status.adapters) if t.spec.adapters else None
    for reason, text in adapters.adapter_events(o.status.adapters, status.adapters, list(r.adapters.values())):
        p.events.append(("Warning" if reason == sr.ADAPTER_FAILED else "Normal", reason, text))
    if not t.spec.adapters:
        status.conditions = [c for c in status.conditions if c.type not in sr.ADAPTER_CONDITIONS]
        return
    failed = [a for a in status.adapters if a.phase == api.AdapterPhase.FAILED]
    loading = [a for a in status.adapters if a.phase == api.AdapterPhase.LOADING]
    unsupported = next((x.lora_unsupported for x in r.adapters.values() if x.lora_unsupported), None)
    if unsupported is not None:
        why = sr.unsupported_message(t.spec.vllm.image, unsupported)
        ready: tuple[ConditionStatus, str, str] = ("False", sr.RUNTIME_LORA_UNSUPPORTED, why)
    elif failed:
        ready = ("False", sr.ADAPTER_FAILED, sr.adapter_said(failed[0].name, failed[0].message))
    elif loading:
        ready = ("False", sr.ADAPTERS_LOADING, sr.adapter_said(loading[0].name, loading[0].message))
    else:
        ready = ("True", sr.ADAPTERS_READY_REASON, sr.adapters_ready(status.adapters_ready))
    status.conditions = api.set_condition(status.conditions, sr.ADAPTERS_READY, *ready, generation)
    held = [d.held_back for d in t.adapters if d.held_back is not None]
    promoted: tuple[ConditionStatus, str, str] = (
        ("False", held[0][0], "; ".join(m for _, m in held)) if held else ("True", sr.PROMOTED, sr.PROMOTED_MESSAGE)
    )
    status.conditions = api.set_condition(status.conditions, sr.ADAPTERS_PROMOTED, *promoted, generation)
