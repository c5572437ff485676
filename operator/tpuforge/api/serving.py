"""ServingDeployment: spec and status."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from tpuforge.api.base import ApiModel, FineTuneJobRef, PodResources, StatusModel
from tpuforge.api.conditions import Condition
from tpuforge.api.constants import DEFAULT_MERGER_IMAGE, DEFAULT_VLLM_IMAGE, MULTIMODAL_MAX_NUM_BATCHED_TOKENS
from tpuforge.api.images import (
    MAX_PULL_SECRETS,
    PULL_SECRETS_HELP,
    REFRESH_IMAGES_ANNOTATION,
    ResolvedImages,
    SecretName,
)
from tpuforge.api.scheduling import PodScheduling


class ServingModel(ApiModel):
    uri: str | None = Field(default=None, description="gs:// directory of a merged model (with _COMPLETE).")
    fine_tune_job_ref: FineTuneJobRef | None = Field(
        default=None, description="Serve the merged model of this FineTuneJob once it has Succeeded."
    )
    name: str | None = Field(
        default=None,
        description="Model catalog id for validation; defaults to the FineTuneJob's, else gemma4-31b.",
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ServingModel:
        if (self.uri is None) == (self.fine_tune_job_ref is None):
            raise ValueError("set exactly one of spec.model.uri and spec.model.fineTuneJobRef")
        return self


class AdapterSource(ApiModel):
    """One LoRA adapter served next to the base model, under its own name."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$",
        max_length=63,
        description="The name clients put in requests (the `model` field); lowercase letters, digits, -, . and _.",
    )
    fine_tune_job_ref: FineTuneJobRef | None = Field(
        default=None,
        description="Serve this FineTuneJob's adapter (status.outputs.adapterUri) once it has Succeeded and, "
        "when spec.promotion asks, passed its evaluation.",
    )
    uri: str | None = Field(default=None, description="gs:// directory of a committed PEFT adapter (with _COMPLETE).")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> AdapterSource:
        if (self.uri is None) == (self.fine_tune_job_ref is None):
            raise ValueError(f"adapter {self.name!r}: set exactly one of uri and fineTuneJobRef")
        return self


class PromotionSpec(ApiModel):
    require_evaluation: bool | None = Field(
        default=None,
        description="Take a FineTuneJob's new adapter only when its evaluation passed. Default: true for jobs "
        "with spec.evaluation, false for jobs without one.",
    )


class ServingTpu(ApiModel):
    slice: str = Field(default="v6e-8", description="TPU slice catalog id.")
    spot: bool = Field(default=False, description="Schedule on Spot capacity.")
    resources: PodResources = Field(
        default_factory=PodResources,
        description="CPU and memory the vLLM container requests; unset: 8 CPUs and memory for the model's weights "
        "plus the runtime.",
    )
    spot_grace_seconds: int | None = Field(
        default=None,
        ge=1,
        le=120,
        description="On Spot, the vLLM pods' terminationGracePeriodSeconds: what a reclaim gives non-system pods "
        "(15 s on GKE, up to 120 s where the node pools lengthen their Spot shutdown); unset: the operator's "
        "default (Helm value tpu.spotGraceSeconds, 15).",
    )
    run_as_root: bool | None = Field(
        default=None,
        description="Run the vLLM container as root, still without privileges or capabilities (GKE's TPU device "
        "files are root's unless the node hands them to the pod's user); false: uid 65532; unset: the operator's "
        "default (Helm value tpu.runAsRoot, true unless set).",
    )
    scheduling: PodScheduling = Field(
        default_factory=PodScheduling,
        description="Where the vLLM pods may run beyond the slice: a reservation, flex-start, a dedicated pool's "
        "node labels and tolerations, pod annotations, a PriorityClass (docs/platform-team.md).",
    )


class LoraServingSpec(ApiModel):
    """vLLM's multi-LoRA settings. They are fixed flags of the server: changing one restarts the pods, while
    adding, replacing or removing an adapter does not."""

    max_loras: int = Field(default=4, ge=1, description="vLLM --max-loras: adapters in one batch.")
    max_lora_rank: int | None = Field(
        default=None,
        ge=1,
        description="vLLM --max-lora-rank; defaults to the largest referenced job's rank (64 when only URIs).",
    )
    max_cpu_loras: int | None = Field(
        default=None, ge=1, description="vLLM --max-cpu-loras: adapters cached in host memory (>= maxLoras)."
    )


class VllmSpec(ApiModel):
    image: str | None = Field(
        default=None,
        description="vLLM-TPU image; unset: the operator's (<registry>/serving:<tag>, which is "
        f"{DEFAULT_VLLM_IMAGE} re-published; {DEFAULT_VLLM_IMAGE} itself with no registry).",
    )
    tensor_parallel_size: int = Field(default=8, ge=1, description="vLLM --tensor-parallel-size.")
    max_model_len: int = Field(default=16384, ge=1, description="vLLM --max-model-len.")
    kv_cache_dtype: str = Field(default="auto", description="vLLM --kv-cache-dtype (auto, fp8, ...).")
    max_num_seqs: int | None = Field(default=None, ge=1, description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="vLLM --max-num-batched-tokens. Unset: vLLM's default, except for a multimodal model "
        f"(gemma4-31b), whose server must batch a whole video: {MULTIMODAL_MAX_NUM_BATCHED_TOKENS}.",
    )
    served_model_name: str | None = Field(
        default=None, description="Name clients put in requests; defaults to the ServingDeployment's name."
    )
    model_path: str = Field(
        default="/models/model",
        description="Where the init container puts the model inside the pod (modelStorage media that copy it; a "
        "streamed model is read from its gs:// URI).",
    )
    lora: LoraServingSpec = Field(
        default_factory=LoraServingSpec, description="Multi-LoRA settings, used when spec.adapters is not empty."
    )
    extra_args: list[str] = Field(default_factory=list, description="Appended last to `vllm serve`.")


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany"]
STORAGE_CLASS_HELP = (
    "StorageClass of the volume; default: the operator's --storage-class (the chart's Hyperdisk Balanced class, "
    "which TPU v6e VMs can attach), else the cluster's default class."
)


class XlaCacheSpec(ApiModel):
    """vLLM's XLA compilation cache. With a streamed model (modelStorage.medium Stream) a ReadWriteOnce cache is
    an emptyDir on the node (sizeLimit `size`), since a disk attached to one node would pin the pods to it and
    stop a rolling update; a ReadWriteMany cache stays a claim every replica shares."""

    size: str = Field(default="20Gi", description="Size of the XLA compilation cache.")
    storage_class_name: str | None = Field(default=None, description=STORAGE_CLASS_HELP)
    access_mode: AccessMode = Field(
        default="ReadWriteOnce",
        description="ReadWriteOnce (a disk: one node at a time, so pods are replaced, not surged; with a streamed "
        "model, an emptyDir on the node instead) or ReadWriteMany (a class that many nodes mount, such as "
        "Filestore: needed for replicas > 1 with a model copied to a volume; storageClassName is then required, "
        "since the default Hyperdisk Balanced class cannot be shared).",
    )
    retain_on_delete: bool = Field(
        default=True, description="Keep the cache PVC when the ServingDeployment is deleted."
    )


ModelMedium = Literal["Stream", "Disk", "NodeLocal", "HyperdiskML"]


class ModelStorageSpec(ApiModel):
    """Where the serving pod reads the model from: straight from Cloud Storage, or a copy on a volume."""

    medium: ModelMedium = Field(
        default="Stream",
        description="Stream (the default): vLLM reads the weights from the model's gs:// directory as it starts "
        "(`--load-format runai_streamer`), with no model volume, so pods are not pinned to a disk's zone and "
        "are replaced by a rolling update that keeps the endpoint up; the model must hold safetensors weights "
        "(every merged model does; the pod's check refuses one without). Disk: a ReadWriteOnce "
        "PersistentVolumeClaim of the ServingDeployment, kept across pod restarts (a restart does not download "
        "the model again; pods are replaced with Recreate). NodeLocal: an emptyDir on the node's disk with an "
        "ephemeral-storage request of `size` (for node pools with a boot disk or local SSD large enough). "
        "HyperdiskML: a ReadOnlyMany Hyperdisk ML volume that GKE's Volume Populator fills from Cloud Storage "
        "(dataSource), read by every replica at once: no fetch in the pod, and replicas > 1 need no copy per node.",
    )
    size: str | None = Field(
        default=None,
        description="Volume size (not with Stream); default: the model's checkpoint bytes plus 25%, in GiB.",
    )
    storage_class_name: str | None = Field(
        default=None,
        description=f"{STORAGE_CLASS_HELP} Not with Stream. Required with HyperdiskML: a class of type hyperdisk-ml "
        "(the chart's storage.hyperdiskML class).",
    )
    data_source: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="HyperdiskML only (and required there): the GCPDataSource (datalayer.gke.io) in this namespace "
        "that names the model's gs:// directory; the claim is populated from it once, when it is created.",
    )


# More adapters than one server keeps in host memory; the bound keeps the apiserver's cost estimate of the rules
# that compare adapters pairwise low (tpuforge.api.admission).
MAX_ADAPTERS = 64


class ServingImagesSpec(ApiModel):
    """The images of the serving pod's tpuforge containers (the vLLM server's is spec.vllm.image)."""

    model_fetch: str | None = Field(
        default=None,
        description="Image of the init container that copies the model into the pod; unset: the operator's "
        f"merger image (<registry>/merger:<tag>, {DEFAULT_MERGER_IMAGE} with no registry).",
    )
    adapters: str | None = Field(
        default=None,
        description="Image of the sidecar that fetches LoRA adapters (with spec.adapters); unset: the operator's "
        f"merger image (<registry>/merger:<tag>, {DEFAULT_MERGER_IMAGE} with no registry).",
    )
    pull_secrets: list[SecretName] = Field(
        default_factory=list, max_length=MAX_PULL_SECRETS, description=PULL_SECRETS_HELP
    )


class DisruptionSpec(ApiModel):
    """Voluntary evictions (node upgrades, drains, the cluster autoscaler's scale-down) of the vLLM pods."""

    min_available: int | None = Field(
        default=None,
        ge=0,
        description="Pods that must stay up through an eviction. Unset: at most one pod is down at a time "
        "(maxUnavailable 1), so a single replica may be evicted and its endpoint is down until it is back on a "
        "node; 1 with one replica blocks drains and node upgrades until the pod is deleted by hand (GKE forces "
        "an upgrade's drain after one hour).",
    )


class ServingDeploymentSpec(ApiModel):
    model: ServingModel = Field(
        description="What to serve: a merged model URI or a FineTuneJob's output; with adapters, their base model."
    )
    adapters: list[AdapterSource] = Field(
        default_factory=list,
        max_length=MAX_ADAPTERS,
        description="LoRA adapters served next to the base, each under its own name; loaded and unloaded at "
        "runtime (no pod restart).",
    )
    promotion: PromotionSpec = Field(
        default_factory=PromotionSpec, description="When a FineTuneJob's new adapter may take traffic."
    )
    tpu: ServingTpu = Field(default_factory=ServingTpu, description="Where the server runs.")
    vllm: VllmSpec = Field(default_factory=VllmSpec, description="The vLLM server.")
    images: ServingImagesSpec = Field(
        default_factory=ServingImagesSpec,
        description="The model-fetch and adapters containers' images, and image pull Secrets.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        description="vLLM server replicas (one slice each). The scale subresource: a HorizontalPodAutoscaler "
        "targets the ServingDeployment (kind ServingDeployment, apiVersion tpuforge.dev/v1alpha1) and writes "
        "this field, which the operator carries to the Deployment; more than one needs a streamed model (the "
        "default) or storage many nodes read (docs/platform-team.md, Scaling).",
    )
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec,
        description="The PodDisruptionBudget of the vLLM pods: how many may be evicted at once by node upgrades "
        "and drains.",
    )
    xla_cache: XlaCacheSpec = Field(
        default_factory=XlaCacheSpec,
        description="XLA compilation cache (VLLM_XLA_CACHE_PATH): a claim kept across pods, except for a streamed "
        "model with accessMode ReadWriteOnce, where it is the node's disk (kept across container restarts only).",
    )
    model_storage: ModelStorageSpec = Field(
        default_factory=ModelStorageSpec,
        description="Where the pod reads the model from: streamed from GCS (the default), or a copy on a volume.",
    )
    service_account_name: str | None = Field(
        default=None,
        description="Required: the ServiceAccount of the serving pods, bound (Workload Identity) to an identity "
        "that may read the model's bucket. `default` cannot, on GKE.",
    )


class ServingPhase(StrEnum):
    PENDING = "Pending"
    WAITING_FOR_MODEL = "WaitingForModel"
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"


class AdapterPhase(StrEnum):
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"


class AdapterStatus(StatusModel):
    name: str
    uri: str | None = Field(default=None, description="The adapter being served under this name.")
    source: str | None = Field(default=None, description="The FineTuneJob it came from, when it did.")
    revision: str | None = Field(default=None, description="Which output of that job (uid/completion time).")
    step: int | None = Field(default=None, description="The training step the adapter was exported at.")
    loaded_replicas: int = Field(default=0, description="Ready replicas that serve it.")
    phase: AdapterPhase = AdapterPhase.LOADING
    message: str | None = None


class ServingDeploymentStatus(StatusModel):
    phase: ServingPhase | None = None
    replicas: int | None = Field(default=None, description="vLLM pods (the scale subresource's status).")
    selector: str | None = Field(
        default=None, description="The label selector of the vLLM pods (the scale subresource's, for an HPA)."
    )
    ready_replicas: int | None = None
    endpoint: str | None = None
    model_uri: str | None = None
    adapters: list[AdapterStatus] = Field(default_factory=list, description="Each spec.adapters entry, in order.")
    adapters_ready: str | None = Field(
        default=None, description="Adapters Ready on every ready replica / adapters in the spec, e.g. 2/2."
    )
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    images: ResolvedImages | None = Field(
        default=None,
        description="The default images these pods run where the spec names none, kept through operator upgrades; "
        f"a new value of annotation {REFRESH_IMAGES_ANNOTATION} takes the operator's current ones (a rollout).",
    )
