"""The model families tpuforge runs, in one table: given config.json's model_type, the family's parser and
catalog check, its Tunix model and config, its HF -> Tunix key mapping and expected tensors, and how its
attention is set up. Everything that loads, trains or sizes a model asks this module, never a family's module
by name, so a family is added here (and in tpuforge.api.catalog) and nowhere else.

Both families get the trainer's splash attention with segment ids on TPU (attention.py), and the dense packing
mask elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads import storage
from tpuforge_workloads.model import gemma4, qwen3
from tpuforge_workloads.model.decoder import Decoder, ModelError, read_config


def _gemma4_model() -> Any:
    from tunix.models.gemma4 import model as gm

    return gm.Gemma4


def _qwen3_model() -> Any:
    from tunix.models.qwen3 import model as qm

    return qm.Qwen3


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
    set_remat: Callable[[Any, bool, str], None]  # model, remat on, what it keeps (model/remat.py)
    lora_modules: Mapping[str, tuple[str, tuple[str, ...]]]  # Tunix LoRA module -> (HF block, HF projections)

    def build(self, text: Decoder, seed: int = 0) -> Any:
        """The model with fresh weights (call under nnx.eval_shape for shapes alone)."""
        from flax import nnx

        return self.model_class()(self.tunix_config(text), rngs=nnx.Rngs(params=seed))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "gemma4",
            gemma4.GEMMA4_MODEL_TYPES,
            gemma4.parse_config,
            gemma4.check_against_catalog,
            gemma4.tunix_config,
            _gemma4_model,
            gemma4.key_mapping,
            gemma4.check_tensors,
            gemma4.set_remat,
            gemma4.LORA_MODULES,
        ),
        Family(
            "qwen3",
            qwen3.MODEL_TYPES,
            qwen3.parse_config,
            qwen3.check_against_catalog,
            qwen3.tunix_config,
            _qwen3_model,
            qwen3.key_mapping,
            qwen3.check_tensors,
            qwen3.set_remat,
            qwen3.LORA_MODULES,
        ),
    )
}


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
