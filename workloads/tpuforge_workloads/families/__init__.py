"""The model families tpuforge runs, one folder each (as Tunix keeps a folder per model), and this registry: given
config.json's model_type, the family's parser and catalog check, its Tunix model and config, its HF -> Tunix key
mapping and expected tensors, its LoRA modules' HF tensors and how its attention is set up. Everything that
loads, trains, sizes or merges a model asks this module, never a family's module by name, so a family is added
as a folder here (config.py, model.py, attention.py, merge.py, tiny.py) with a row below, and in
tpuforge.api.catalog, and nowhere else.

Shared by every family: the decoder protocol (decoder.py), splash attention with segment ids on TPU and the
dense packing mask elsewhere (attention.py), and rematerialisation (remat.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads import storage
from tpuforge_workloads.families import head
from tpuforge_workloads.families.decoder import CombinedQkv, Decoder, ModelError, read_config
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import merge as gemma4_merge
from tpuforge_workloads.families.gemma4 import model as gemma4_model
from tpuforge_workloads.families.head import Head
from tpuforge_workloads.families.qwen3 import config as qwen3_config
from tpuforge_workloads.families.qwen3 import merge as qwen3_merge
from tpuforge_workloads.families.qwen3 import model as qwen3_model


def _gemma4_attention() -> tuple[type, type]:
    from tpuforge_workloads.families.gemma4 import attention

    return attention.segment_attention()


def _qwen3_attention() -> tuple[type, type]:
    from tpuforge_workloads.families.qwen3 import attention

    return attention.segment_attention()


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    parse_config: Callable[[Mapping[str, Any], str], Any]
    check_against_catalog: Callable[[Any, ModelShape, str], None]
    tunix_config: Callable[[Any], Any]
    model_class: Callable[[], Any]  # the Tunix model class (imported when asked)
    key_mapping: Callable[[Any], dict[str, Any]]  # HF name pattern -> (Tunix name, (permute, reshape))
    check_tensors: Callable[[Iterable[str], Any, str], None]
    set_remat: Callable[[Any, bool, str], None]  # model, remat on, what it keeps (remat.py)
    lora_modules: Mapping[str, tuple[str, tuple[str, ...]]]  # Tunix LoRA module -> (HF block, HF projections)
    hf_prefixes: tuple[str, ...]  # where the decoder's tensors may be in an HF checkpoint
    segment_attention: Callable[[], tuple[type, type]]  # (Tunix's attention module, ours taking segment ids)
    combined_qkv: CombinedQkv | None = None  # a key mapping that leaves each layer's q, k(, v) to combine
    output_head: Callable[[Any], Head | None] = lambda model: None  # the loss computes its logits (head.py)

    def build(self, text: Decoder, seed: int = 0) -> Any:
        """The model with fresh weights (call under nnx.eval_shape for shapes alone)."""
        from flax import nnx

        return self.model_class()(self.tunix_config(text), rngs=nnx.Rngs(params=seed))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "gemma4",
            gemma4_config.GEMMA4_MODEL_TYPES,
            gemma4_config.parse_config,
            gemma4_config.check_against_catalog,
            gemma4_model.tunix_config,
            gemma4_model.model_class,
            gemma4_model.key_mapping,
            gemma4_model.check_tensors,
            gemma4_model.set_remat,
            gemma4_merge.LORA_MODULES,
            gemma4_config.HF_PREFIXES,
            _gemma4_attention,
            gemma4_model.COMBINED_QKV,
            head.gemma4,
        ),
        Family(
            "qwen3",
            qwen3_config.MODEL_TYPES,
            qwen3_config.parse_config,
            qwen3_config.check_against_catalog,
            qwen3_model.tunix_config,
            qwen3_model.model_class,
            qwen3_model.key_mapping,
            qwen3_model.check_tensors,
            qwen3_model.set_remat,
            qwen3_merge.LORA_MODULES,
            (qwen3_config.HF_PREFIX,),
            _qwen3_attention,
        ),
    )
}

# Where a decoder's tensors may be in an HF checkpoint, over every family (the merge detects the layout by them).
HF_PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(p for f in FAMILIES.values() for p in f.hf_prefixes))


def of(text: Decoder) -> Family:
    return FAMILIES[text.family]


def of_model(model: Any) -> Family:
    """The family of a built Tunix model."""
    for f in FAMILIES.values():
        if isinstance(model, f.model_class()):
            return f
    raise TypeError(f"{type(model).__name__} is not the model of a supported family ({', '.join(FAMILIES)})")


def parse_config(raw: Mapping[str, Any], where: str = "config.json") -> Any:
    """The decoder's shape from config.json, by its model_type's family."""
    model_type = raw.get("model_type")
    for f in FAMILIES.values():
        if model_type in f.model_types:
            return f.parse_config(raw, where)
    known = [t for f in FAMILIES.values() for t in f.model_types]
    raise ModelError(f"{where}: model_type {model_type!r} is not a supported family; supported: {', '.join(known)}")


def read_decoder(model_uri: str) -> Any:
    """The decoder's shape from the config.json at `model_uri`."""
    return parse_config(read_config(model_uri), storage.join(model_uri, "config.json"))


def check_against_catalog(text: Decoder, shape: ModelShape, where: str) -> None:
    if text.family != shape.family:
        raise ModelError(
            f"{where} is a {text.family} model but catalog model {shape.id!r} is {shape.family}; set model.name to "
            "the model at model.uri"
        )
    of(text).check_against_catalog(text, shape, where)
