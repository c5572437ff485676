"""The ServingDeployment's rules beyond the CRD schema. Every error names the field and the fix."""

from __future__ import annotations

import posixpath
from typing import Any

from tpuforge.api.base import PodResources
from tpuforge.api.catalog import MODELS, TPU_SLICES
from tpuforge.api.constants import MULTIMODAL_ITEM_TOKENS, MULTIMODAL_MAX_NUM_BATCHED_TOKENS
from tpuforge.api.resources import tpu_server_requests
from tpuforge.api.serving import ServingDeploymentSpec
from tpuforge.api.validation import (
    FieldError,
    SpecError,
    check_resources,
    check_scheduling,
    check_uri,
    is_quantity,
    parse,
    unsupported_stage,
)

# vLLM's largest --max-lora-rank (vllm.config.lora.MaxLoRARanks).
VLLM_MAX_LORA_RANK = 512
# Where the serving pod keeps its adapters (tpuforge.manifests.serving.ADAPTERS_DIR).
ADAPTERS_DIR = "/adapters"


def _check_adapters(errors: list[FieldError], spec: ServingDeploymentSpec, served_name: str | None) -> None:
    seen: dict[str, int] = {}
    for i, a in enumerate(spec.adapters):
        field = f"spec.adapters[{i}]"
        if a.name in seen:
            errors.append(
                FieldError(
                    f"{field}.name", f"{a.name!r} is also spec.adapters[{seen[a.name]}]'s name; give each its own name"
                )
            )
        seen.setdefault(a.name, i)
        if served_name is not None and a.name == served_name:
            errors.append(
                FieldError(
                    f"{field}.name",
                    f"{a.name!r} is the base model's served name (spec.vllm.servedModelName, else the object's name); "
                    "give the adapter another name",
                )
            )
        check_uri(errors, f"{field}.uri", a.uri)
    lora = spec.vllm.lora
    if lora.max_cpu_loras is not None and lora.max_cpu_loras < lora.max_loras:
        errors.append(
            FieldError(
                "spec.vllm.lora.maxCpuLoras",
                f"{lora.max_cpu_loras} is below maxLoras ({lora.max_loras}); vLLM needs maxCpuLoras >= maxLoras",
            )
        )
    if lora.max_lora_rank is not None and lora.max_lora_rank > VLLM_MAX_LORA_RANK:
        errors.append(
            FieldError(
                "spec.vllm.lora.maxLoraRank",
                f"{lora.max_lora_rank} exceeds vLLM's largest rank, {VLLM_MAX_LORA_RANK}; use at most that",
            )
        )


def _check_serving_pods(errors: list[FieldError], spec: ServingDeploymentSpec) -> None:
    """The pods' identity and volumes: what GKE needs for them to start at all."""
    if not spec.service_account_name:
        errors.append(
            FieldError(
                "spec.serviceAccountName",
                "required: the ServiceAccount the serving pods run as, one that may read the model's bucket (on "
                "GKE, allowed through Workload Identity; the namespace's `default` account is not)",
            )
        )
    if spec.model_storage.size is not None and not is_quantity(spec.model_storage.size):
        errors.append(FieldError("spec.modelStorage.size", f"{spec.model_storage.size!r} is not a size; e.g. 80Gi"))
    storage = spec.model_storage
    if spec.xla_cache.access_mode == "ReadWriteMany" and not spec.xla_cache.storage_class_name:
        errors.append(
            FieldError(
                "spec.xlaCache.storageClassName",
                "required with accessMode ReadWriteMany: the default class (Hyperdisk Balanced) attaches to one node "
                "at a time; name a class that many nodes mount (e.g. Filestore's standard-rwx)",
            )
        )
    if storage.medium == "HyperdiskML":
        if not storage.storage_class_name:
            errors.append(
                FieldError(
                    "spec.modelStorage.storageClassName",
                    "required with medium HyperdiskML: a class of type hyperdisk-ml (the chart's storage.hyperdiskML)",
                )
            )
        if not storage.data_source:
            errors.append(
                FieldError(
                    "spec.modelStorage.dataSource",
                    "required with medium HyperdiskML: the GCPDataSource that names the model's gs:// directory "
                    "(docs/platform-team.md, Hyperdisk ML)",
                )
            )
    elif storage.data_source:
        errors.append(FieldError("spec.modelStorage.dataSource", "used with medium HyperdiskML only; remove it"))
    if storage.medium == "Stream":
        _check_stream(errors, spec)
    if spec.replicas <= 1 or storage.medium == "Stream":
        # A streamed model has no volume, and its cache is either the node's or shared: replicas never wait on a
        # disk another node holds.
        return
    # Each replica holds a whole TPU VM, so replicas run on different nodes, and a ReadWriteOnce disk attaches
    # to one node at a time: a second replica would wait for the disk forever (Multi-Attach error).
    if spec.xla_cache.access_mode != "ReadWriteMany":
        errors.append(
            FieldError(
                "spec.xlaCache.accessMode",
                f"{spec.replicas} replicas run on {spec.replicas} TPU VMs and a ReadWriteOnce disk attaches to one; "
                "set ReadWriteMany with a storageClassName that provides it (Filestore), or use replicas: 1",
            )
        )
    if spec.model_storage.medium == "Disk":
        errors.append(
            FieldError(
                "spec.modelStorage.medium",
                f"{spec.replicas} replicas cannot share one model disk (ReadWriteOnce); use Stream (no model volume), "
                "HyperdiskML (read by many nodes) or NodeLocal, or replicas: 1",
            )
        )


def _check_stream(errors: list[FieldError], spec: ServingDeploymentSpec) -> None:
    """A streamed model is read from its gs:// directory: nothing to size or to put on a class."""
    storage = spec.model_storage
    for field, value in (("size", storage.size), ("storageClassName", storage.storage_class_name)):
        if value is not None:
            errors.append(
                FieldError(
                    f"spec.modelStorage.{field}",
                    "used with a model copied to a volume only; a streamed model (medium Stream, the default) "
                    "has no volume: remove it, or set medium Disk, NodeLocal or HyperdiskML to keep a copy",
                )
            )
    uri = spec.model.uri
    if uri is not None and not uri.startswith("gs://"):
        errors.append(
            FieldError(
                "spec.modelStorage.medium",
                f"Stream reads the weights from Cloud Storage and needs a gs:// spec.model.uri (got {uri!r}); "
                "give one, or set medium Disk to copy the model into the pod",
            )
        )


def check_serving(
    spec: ServingDeploymentSpec, model_id: str | None = None, served_name: str | None = None
) -> list[FieldError]:
    """Every semantic problem with a ServingDeployment spec. `model_id` is the resolved catalog id
    (from the referenced FineTuneJob) when the spec does not name one; `served_name` the base model's name in
    requests (adapters may not take it)."""
    errors: list[FieldError] = []
    check_uri(errors, "spec.model.uri", spec.model.uri)
    slc = TPU_SLICES.get(spec.tpu.slice)
    if slc is None:
        errors.append(FieldError("spec.tpu.slice", f"unknown TPU slice; use one of {sorted(TPU_SLICES)}"))
    elif slc.hosts > 1:
        single = [s.id for s in TPU_SLICES.values() if s.hosts == 1]
        errors.append(
            FieldError(
                "spec.tpu.slice",
                f"{slc.id} spans {slc.hosts} hosts and one vLLM server runs on one host; use one of {single}",
            )
        )
    # The model volume is mounted at modelPath: it must be a directory of its own.
    path = posixpath.normpath(spec.vllm.model_path)
    reserved = ("", "dev", "proc", "sys", "etc", ADAPTERS_DIR.strip("/"))
    if not spec.vllm.model_path.startswith("/") or path.split("/")[1] in reserved:
        errors.append(
            FieldError(
                "spec.vllm.modelPath",
                f"{spec.vllm.model_path!r}: use an absolute path outside /dev, /proc, /sys, /etc and {ADAPTERS_DIR} "
                "(e.g. /models/model)",
            )
        )
    _check_adapters(errors, spec, served_name)
    _check_serving_pods(errors, spec)
    mid = spec.model.name or model_id or "gemma4-31b"
    shape = MODELS.get(mid)
    if shape is None:
        errors.append(FieldError("spec.model.name", f"unknown model {mid!r}; use one of {sorted(MODELS)}"))
    elif not shape.supports("serve"):
        errors.append(unsupported_stage("spec.model.name", shape, "serve"))
    tp = spec.vllm.tensor_parallel_size
    if slc is not None and (tp > slc.chips or slc.chips % tp):
        errors.append(
            FieldError(
                "spec.vllm.tensorParallelSize",
                f"tp={tp} must divide the {slc.chips} chips of {slc.id}; use one of "
                f"{[d for d in range(1, slc.chips + 1) if slc.chips % d == 0]}",
            )
        )
    if shape is not None:
        # vLLM shards query heads and replicates KV heads when tp exceeds them.
        kv_ok = all(k % tp == 0 or tp % k == 0 for k in (shape.num_kv_heads, shape.num_global_kv_heads))
        if shape.num_heads % tp or not kv_ok:
            errors.append(
                FieldError(
                    "spec.vllm.tensorParallelSize",
                    f"tp={tp} must divide {shape.id}'s {shape.num_heads} query heads, and its kv heads "
                    f"({shape.num_kv_heads}, {shape.num_global_kv_heads}) must divide tp or be multiples",
                )
            )
    batched = spec.vllm.max_num_batched_tokens
    if shape is not None and shape.multimodal and batched is not None and batched < MULTIMODAL_ITEM_TOKENS:
        errors.append(
            FieldError(
                "spec.vllm.maxNumBatchedTokens",
                f"{batched} is below the {MULTIMODAL_ITEM_TOKENS} tokens of {shape.id}'s largest image or video "
                "(a 32-frame video), which vLLM batches whole for a multimodal model (--disable_chunked_mm_input): "
                f"use at least {MULTIMODAL_ITEM_TOKENS}, or leave it unset ({MULTIMODAL_MAX_NUM_BATCHED_TOKENS})",
            )
        )
    default = tpu_server_requests(PodResources(), shape) if shape and slc else None
    check_resources(errors, "spec.tpu.resources", spec.tpu.resources, slc, default)
    check_scheduling(errors, "spec.tpu.scheduling", spec.tpu.scheduling, slc, spec.tpu.spot, "spec.tpu.slice")
    return errors


def validate_serving(raw: Any, model_id: str | None = None) -> ServingDeploymentSpec:
    spec = parse(ServingDeploymentSpec, raw)
    errors = check_serving(spec, model_id)
    if errors:
        raise SpecError(errors)
    return spec


__all__ = ["ADAPTERS_DIR", "VLLM_MAX_LORA_RANK", "check_serving", "validate_serving"]
