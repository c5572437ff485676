"""The two kinds as the generated files present them: names, printer columns, description and the models of
their spec and status. `crds` turns them into CustomResourceDefinitions, `apidocs` into docs/api.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tpuforge.api import (
    FineTuneJobSpec,
    FineTuneJobStatus,
    ServingDeploymentSpec,
    ServingDeploymentStatus,
)
from tpuforge.api import constants as c


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    short: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[tuple[str, str, str, str], ...]  # name, type, jsonPath, description
    description: str
    # The scale subresource (spec, status replicas and status selector paths), for kinds an HPA may scale.
    scale: dict[str, str] | None = None


KINDS = (
    Kind(
        c.FINETUNEJOB_KIND,
        c.FINETUNEJOB_PLURAL,
        c.FINETUNEJOB_SHORT,
        FineTuneJobSpec,
        FineTuneJobStatus,
        (
            (
                "Phase",
                "string",
                ".status.phase",
                "Preflight, Pending, Queued (in Kueue), Training, Merging, Evaluating, Succeeded, Failed or Suspended",
            ),
            ("Progress", "string", ".status.progress.percentDisplay", "Percent of training steps done"),
            ("Step", "integer", ".status.progress.step", "Last optimizer step reported by the trainer"),
            ("Loss", "string", ".status.progress.lossDisplay", "Training loss at the last report"),
            (
                "Tok/s",
                "integer",
                ".status.progress.tokensPerSecond",
                "Training throughput over the last 30 s or 20 steps",
            ),
            (
                "ETA",
                "string",
                ".status.progress.etaDisplay",
                "Time until training ends, at that rate; before training, the preflight's estimate (~... (est))",
            ),
            (
                "Cost",
                "string",
                ".status.cost.estimatedUSDDisplay",
                "Estimated TPU cost so far (list price); before training, the preflight's estimate of the run",
            ),
            (
                "Eval",
                "string",
                ".status.evaluation.resultDisplay",
                "Passed or Failed (with pass@1 when code was run), when the job has an evaluation",
            ),
            ("Slice", "string", ".spec.tpu.slice", "TPU slice"),
            ("Age", "date", ".metadata.creationTimestamp", ""),
        ),
        "A LoRA fine-tuning run on a TPU slice, followed by a merge into HuggingFace safetensors.",
    ),
    Kind(
        c.SERVING_KIND,
        c.SERVING_PLURAL,
        c.SERVING_SHORT,
        ServingDeploymentSpec,
        ServingDeploymentStatus,
        (
            ("Phase", "string", ".status.phase", "Pending, WaitingForModel, Loading, Ready or Failed"),
            ("Ready", "integer", ".status.readyReplicas", "Replicas answering /health"),
            ("Endpoint", "string", ".status.endpoint", "OpenAI-compatible base URL inside the cluster"),
            ("Model", "string", ".status.modelUri", "The model being served"),
            ("Adapters", "string", ".status.adaptersReady", "Adapters ready on every replica / in the spec"),
            ("Slice", "string", ".spec.tpu.slice", "TPU slice"),
            ("Age", "date", ".metadata.creationTimestamp", ""),
        ),
        "A vLLM server on a TPU slice, serving a merged model from GCS or from a FineTuneJob.",
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    ),
)


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = nested_model(arg)
        if found is not None:
            return found
    return None
