"""Which adapter each spec.adapters name of a ServingDeployment serves now (pure): a gs:// URI as given, or a
FineTuneJob's exported adapter once the job succeeded and, where promotion requires it, passed its evaluation;
until then the adapter already served stays, and the reason is kept for the AdaptersPromoted condition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuforge import api
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
            held = (reason, f"adapter {entry.name!r}: {message}; still serving {prev.uri}")
            return DesiredAdapter(entry.name, prev.uri, prev.source, prev.revision or "", held_back=held)
        return DesiredAdapter(entry.name, None, ref.name, held_back=(reason, f"adapter {entry.name!r}: {message}"))

    if job is None:
        return keep("FineTuneJobNotFound", f"FineTuneJob {ref.name!r} does not exist")
    job_model = ((job.get("spec") or {}).get("model") or {}).get("name")
    if job_model and job_model != model_id:
        return DesiredAdapter(
            entry.name,
            None,
            ref.name,
            refused=f"FineTuneJob {ref.name!r} fine-tunes {job_model!r} but this deployment serves {model_id!r}; "
            "serve it from a ServingDeployment of that base, or reference a job of this one",
        )
    rank = int(((job.get("spec") or {}).get("lora") or {}).get("rank") or api.LoraSpec().rank)
    if max_rank is not None and rank > max_rank:
        return DesiredAdapter(
            entry.name,
            None,
            ref.name,
            refused=f"FineTuneJob {ref.name!r} trains LoRA rank {rank}, above spec.vllm.lora.maxLoraRank "
            f"({max_rank}); raise maxLoraRank to at least {rank} (this restarts the pods)",
        )
    status = api.FineTuneJobStatus.model_validate(job.get("status") or {})
    adapter_uri = status.outputs.adapter_uri if status.outputs else None
    if status.phase != api.FineTunePhase.SUCCEEDED:
        return keep("WaitingForJob", f"waiting for FineTuneJob {ref.name!r} (phase {status.phase or 'Pending'})")
    if not adapter_uri:
        return keep(
            "NoAdapter",
            f"FineTuneJob {ref.name!r} wrote no adapter: set its spec.merge.writeAdapter: true and run it again",
        )
    if _promotion_required(spec, job):
        ev = status.evaluation
        if ev is not None and ev.result == "Error":
            return keep(
                "WaitingForEvaluation",
                f"FineTuneJob {ref.name!r}'s evaluation gave no verdict ({ev.message}); raise its "
                "spec.evaluation.rerun to evaluate it again",
            )
        if ev is None or ev.passed is None:
            return keep("WaitingForEvaluation", f"FineTuneJob {ref.name!r} has not been evaluated yet")
        if not ev.passed:
            why = f": {ev.message}" if ev.message else ""
            return keep("EvaluationFailed", f"FineTuneJob {ref.name!r} failed its evaluation{why}")
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
