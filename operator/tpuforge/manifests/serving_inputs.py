"""What a ServingDeployment's objects are made from, and what names and labels them: the inputs the controller
resolves (`ServingInputs`), the children's names, the served model's name, labels and object metadata. Shared
by the vLLM server's command (vllm_server) and the objects (serving)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuforge.api.catalog import ModelShape, TpuSlice
from tpuforge.api.constants import API_VERSION, LABEL_COMPONENT, LABEL_SERVING, SERVING_KIND
from tpuforge.api.serving import ServingDeploymentSpec
from tpuforge.api.validation import FieldError
from tpuforge.manifests.common import (
    MAX_NAME,
    Obj,
    Owner,
    child_name,
    label_value,
    metadata,
    standard_labels,
)

APP = "vllm"
COMPONENT = "serving"
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def owner(namespace: str, name: str, uid: str) -> Owner:
    return Owner(API_VERSION, SERVING_KIND, namespace, name, uid)


@dataclass(frozen=True)
class ServingInputs:
    """Everything the objects depend on, resolved by the controller."""

    owner: Owner
    spec: ServingDeploymentSpec
    model_uri: str
    model: ModelShape
    slice: TpuSlice
    # Changes when the same URI holds a new model (a FineTuneJob that ran again): it rolls the pods.
    model_revision: str = ""
    # The largest spec.lora.rank of the FineTuneJobs spec.adapters references (None when none is known).
    adapter_job_rank: int | None = None
    # The operator's default StorageClass for the volumes a spec does not give one (the chart's Hyperdisk class).
    storage_class: str | None = None

    @property
    def name(self) -> str:
        return self.owner.name

    @property
    def namespace(self) -> str:
        return self.owner.namespace


@dataclass(frozen=True)
class ServingNames:
    deployment: str
    service: str
    xla_cache: str
    model: str
    monitor: str


def names(name: str) -> ServingNames:
    """Deterministic child names. The Service takes the plain name so that the endpoint reads naturally."""
    vllm = child_name(name, "vllm")
    return ServingNames(
        deployment=vllm,
        service=name,
        xla_cache=child_name(name, "xla-cache"),
        model=child_name(name, "model"),
        monitor=vllm,
    )


def name_errors(name: str) -> list[FieldError]:
    """The Service takes the object's name, so it must be a DNS-1035 label."""
    if len(name) > MAX_NAME or not _DNS_1035.fullmatch(name):
        return [
            FieldError(
                "metadata.name",
                f"{name!r} names the Service too, so it must be a DNS label: at most {MAX_NAME} lowercase "
                "letters, digits and '-', starting with a letter and ending with a letter or digit",
            )
        ]
    return []


def served_model_name(name: str, spec: ServingDeploymentSpec) -> str:
    return spec.vllm.served_model_name or name


def selector_labels(name: str) -> dict[str, str]:
    """The Deployment's selector: immutable once created, so only labels that never change for a name."""
    return {LABEL_SERVING: label_value(name), LABEL_COMPONENT: COMPONENT}


def labels(o: Owner) -> dict[str, str]:
    return standard_labels(o, LABEL_SERVING, APP, COMPONENT)


def object_metadata(inp: ServingInputs, name: str, owned: bool = True) -> Obj:
    meta = metadata(inp.owner, name, labels(inp.owner))
    if not owned:
        del meta["ownerReferences"]
    return meta
