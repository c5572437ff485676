"""What a FineTuneJob offers as a model to others: a ServingDeployment serves it, another FineTuneJob starts
from it (spec.model.fineTuneJobRef on either). Read from the job object alone, so both controllers decide alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuforge.api.finetune_status import FineTuneJobStatus, FineTunePhase


@dataclass(frozen=True)
class JobModel:
    """A FineTuneJob's model: its catalog id (spec.model.name), its phase, and its merged model, which is
    `uri` only once the job has Succeeded with one."""

    name: str | None
    phase: FineTunePhase | None
    uri: str | None
    revision: str  # tells apart two models at one output URI (the job run again)

    @property
    def failed(self) -> bool:
        return self.phase == FineTunePhase.FAILED


def job_model(job: Mapping[str, Any]) -> JobModel:
    """The model of `job` (a FineTuneJob object: metadata, spec, status), as far as it is ready."""
    name = ((job.get("spec") or {}).get("model") or {}).get("name")
    status = FineTuneJobStatus.model_validate(job.get("status") or {})
    merged = status.outputs.merged_model_uri if status.outputs else None
    ready = status.phase == FineTunePhase.SUCCEEDED and merged
    # The same output URI can hold a newer model after the job runs again: the revision tells them apart.
    revision = f"{(job.get('metadata') or {}).get('uid', '')}/{status.completion_time or ''}"
    return JobModel(name=name, phase=status.phase, uri=merged if ready else None, revision=revision)
