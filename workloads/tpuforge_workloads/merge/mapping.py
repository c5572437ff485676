"""Which HuggingFace tensor each Qwix LoRA adapter of a Tunix model changes, and how (the table of each
family's modules is its `lora_modules` in the registry, tpuforge_workloads/families: Gemma 4's in
families/gemma4/merge.py with their factor layouts, Qwen3's HF's own names with the same layouts as Gemma 4's
q_einsum, attn_vec_einsum and MLP projections).

Qwix gives every adapted weight two factors, A and B, whose layouts follow the weight's einsum
('BTD,NDH->BTNH' becomes 'BTD,Dr,rNH->BTNH'): A holds the contracted input axes then the rank, B the
rank then the output axes. Every target here is a HuggingFace Linear weight W of shape (out, in) whose
input axes are Tunix's contracted axes and whose output axes are B's (flattened in the same order), so
each adapter reduces to the PEFT form: lora_A = A as (in, r) transposed, lora_B = B as (r, out)
transposed, and the merged weight is W + (alpha / rank) * lora_B @ lora_A. That form serves both the
merge and the PEFT adapter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuforge_workloads import families
from tpuforge_workloads.families.decoder import Decoder, ModelError
from tpuforge_workloads.merge.errors import MergeInputError


def parse_base_config(config: Mapping[str, Any], config_uri: str) -> Decoder:
    """The base's decoder shape; a checkpoint of no supported family (or an unsupported variant) is rejected."""
    try:
        return families.parse_config(config, config_uri)  # type: ignore[no-any-return]
    except ModelError as e:
        archs = config.get("architectures")
        named = ", ".join(str(a) for a in archs) if isinstance(archs, list) and archs else "no architectures"
        raise MergeInputError(f"{e} [{named}]: point baseModelUri at the checkpoint the adapter was trained on") from e


@dataclass(frozen=True)
class HfLayout:
    """Where the text decoder's tensors are in a base checkpoint."""

    prefix: str
    num_layers: int
    modules: Mapping[str, tuple[str, tuple[str, ...]]]  # the family's lora_modules

    @classmethod
    def detect(cls, names: Collection[str], uri: str, modules: Mapping[str, tuple[str, tuple[str, ...]]]) -> HfLayout:
        for prefix in families.HF_PREFIXES:
            pattern = re.compile(re.escape(prefix) + r"layers\.(\d+)\.")
            layers = {int(m.group(1)) for n in names if (m := pattern.match(n))}
            if layers:
                if layers != set(range(len(layers))):
                    missing = sorted(set(range(max(layers) + 1)) - layers)
                    raise MergeInputError(f"{uri}: decoder layers {missing[:5]} have no tensors: incomplete checkpoint")
                return cls(prefix, len(layers), modules)
        raise MergeInputError(
            f"{uri}: no tensors named model.layers.N.* or model.language_model.layers.N.*: not a decoder checkpoint"
        )

    def tensor(self, layer: int, block: str, proj: str) -> str:
        return f"{self.prefix}layers.{layer}.{block}.{proj}.weight"

    def module_tensors(self, layer: int, module: str) -> list[str]:
        block, projs = self.modules[module]
        return [self.tensor(layer, block, p) for p in projs]

    def has_module(self, layer: int, module: str, names: Collection[str]) -> bool:
        """Whether the base has the weights a Tunix module stands for in this layer: k_einsum stands for a
        k_proj without a v_proj (keys = values), kv_einsum for both."""
        v_proj = self.tensor(layer, "self_attn", "v_proj")
        if module == "k_einsum" and v_proj in names:
            return False
        return all(t in names for t in self.module_tensors(layer, module))


@dataclass(frozen=True)
class LoraTarget:
    """One HF weight that an adapter changes; `part` picks keys (0) or values (1) out of kv_einsum's B."""

    tensor: str
    layer: int
    module: str
    part: int | None
    out_features: int
    in_features: int


def targets_of(
    layout: HfLayout, layer: int, module: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> list[LoraTarget]:
    if module not in layout.modules:
        raise MergeInputError(f"LoRA on layer {layer} module {module}: not one of {', '.join(layout.modules)}")
    rank = a_shape[-1]
    if b_shape[0] != rank:
        raise MergeInputError(f"layer {layer} {module}: LoRA A {a_shape} and B {b_shape} disagree on the rank")
    in_features = math.prod(a_shape[:-1])
    tensors = layout.module_tensors(layer, module)
    if len(tensors) == 2:
        if len(b_shape) < 2 or b_shape[1] != 2:
            raise MergeInputError(f"layer {layer} {module}: LoRA B {b_shape} does not stack keys and values")
        out_features = math.prod(b_shape[2:])
        return [LoraTarget(t, layer, module, i, out_features, in_features) for i, t in enumerate(tensors)]
    return [LoraTarget(tensors[0], layer, module, None, math.prod(b_shape[1:]), in_features)]


def peft_factors(target: LoraTarget, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lora_A (rank, in), lora_B (out, rank)) in float32, with W += (alpha / rank) * lora_B @ lora_A."""
    rank = a.shape[-1]
    if target.part is not None:
        b = b[:, target.part]
    lora_a = np.ascontiguousarray(a.reshape(-1, rank).T, dtype=np.float32)
    lora_b = np.ascontiguousarray(b.reshape(rank, -1).T, dtype=np.float32)
    return lora_a, lora_b
