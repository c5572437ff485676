"""Which adapter each spec.adapters name of a ServingDeployment serves now (pure): a gs:// URI as given, or a
FineTuneJob's exported adapter once the job succeeded and, where promotion requires it, passed its evaluation;
until then the adapter already served stays, and the reason is kept for the AdaptersPromoted condition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuforge import api
from tpuforge.api import serving_reasons as sr
from tpuforge.api.serving import AdapterStatus

Obj = dict[str, Any]


@dataclass(frozen=True)
class DesiredAdapter:
    """What one spec.adapters entry resolves to now. `uri` None: nothing to serve under this name."""

    name: str
    uri: str | None
    source: str | None = None
    revision: str = ""
    refused: str | None = None  # why it cannot be served here (phase Failed)
    # Why the newest output is not taken (AdaptersPromoted False): (reason, message).
    held_back: tuple[str, str] | None = None


def _promotion_required(spec: api.ServingDeploymentSpec, job: Obj) -> bool:
    if spec.promotion.require_evaluation is not None:
        return spec.promotion.require_evaluation
    return (job.get("spec") or {}).get("evaluation") is not None


def _previous(name: str, previous: Sequence[AdapterStatus]) -> AdapterStatus | None:
    return next((p for p in previous if p.name == name and p.uri), None)


def resolve_adapter(
    spec: api.ServingDeploymentSpec,
    entry: api.AdapterSource,
    model_id: str,
    job: Obj | None,
    previous: Sequence[AdapterStatus] = (),
    max_rank: int | None = None,
) -> DesiredAdapter:
    """The adapter to serve under `entry.name`. A job's output is taken once the job Succeeded and, when
    promotion requires it, its evaluation passed; until then what the status says is served stays. A job of
    another model, or of a rank above `max_rank` (the server's explicit --max-lora-rank), is refused for this
    adapter alone."""
    if entry.uri is not None:
        return DesiredAdapter(entry.name, entry.uri.rstrip("/"))
    ref = entry.fine_tune_job_ref
    assert ref is not None  # the spec allows exactly one source
    prev = _previous(entry.name, previous)

    def keep(reason: str, message: str) -> DesiredAdapter:
        if prev is not None:
            held = (reason, sr.held_back(entry.name, message, prev.uri))
            return DesiredAdapter(entry.name, prev.uri, prev.source, prev.revision or "", held_back=held)
        return DesiredAdapter(entry.name, None, ref.name, held_back=(reason, sr.held_back(entry.name, message, None)))

    if job is None:
        return keep(sr.FINETUNEJOB_NOT_FOUND, sr.adapter_job_missing(ref.name))
    job_model = ((job.get("spec") or {}).get("model") or {}).get("name")
    if job_model and job_model != model_id:
        return DesiredAdapter(
            entry.name,
            None,
            ref.name,
            refused=sr.other_base(ref.name, job_model, model_id),
        )
    rank = int(((job.get("spec") or {}).get("lora") or {}).get("rank") or api.LoraSpec().rank)
    if max_rank is not None and rank > max_rank:
        return DesiredAdapter(
            entry.name,
            None,
            ref.name,
            refused=sr.rank_above_max(ref.name, rank, max_rank),
        )
    status = api.FineTuneJobStatus.model_validate(job.get("status") or {})
    adapter_uri = status.outputs.adapter_uri if status.outputs else None
    if status.phase != api.FineTunePhase.SUCCEEDED:
        return keep(sr.WAITING_FOR_JOB, sr.waiting_for_adapter_job(ref.name, status.phase))
    if not adapter_uri:
        return keep(sr.NO_ADAPTER, sr.no_adapter(ref.name))
    if _promotion_required(spec, job):
        ev = status.evaluation
        if ev is not None and ev.result == "Error":
            return keep(sr.WAITING_FOR_EVALUATION, sr.evaluation_gave_no_verdict(ref.name, ev.message))
        if ev is None or ev.passed is None:
            return keep(sr.WAITING_FOR_EVALUATION, sr.not_evaluated(ref.name))
        if not ev.passed:
            return keep(sr.EVALUATION_FAILED, sr.evaluation_failed(ref.name, ev.message))
    meta = job.get("metadata") or {}
    # The same output URI holds a new adapter after the job runs again: the revision tells them apart.
    revision = f"{meta.get('uid', '')}/{status.completion_time or ''}"
    return DesiredAdapter(entry.name, adapter_uri.rstrip("/"), ref.name, revision)


def resolve_adapters(
    spec: api.ServingDeploymentSpec,
    model_id: str,
    jobs: Mapping[str, Obj | None],
    previous: Sequence[AdapterStatus] = (),
    max_rank: int | None = None,
) -> list[DesiredAdapter]:
    out = []
    for entry in spec.adapters:
        job = jobs.get(entry.fine_tune_job_ref.name) if entry.fine_tune_job_ref else None
        out.append(resolve_adapter(spec, entry, model_id, job, previous, max_rank))
    return out


def max_job_rank(jobs: Mapping[str, Obj | None]) -> int | None:
    """The largest spec.lora.rank of the referenced jobs (the api's default where a job does not say)."""
    ranks = []
    for job in jobs.values():
        if job is not None:
            lora = (job.get("spec") or {}).get("lora") or {}
            ranks.append(int(lora.get("rank") or api.LoraSpec().rank))
    return max(ranks, default=None)
