"""Everything the merge will do, decided from metadata alone: which base tensors get which LoRA delta,
the output dtype of each tensor, the output shards and their headers, the files copied from the base.
All input checks happen here, before anything is written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tpuforge.api.catalog import model_shape
from tpuforge.api.configs import MergeConfig
from tpuforge.api.constants import COMPLETE_MARKER
from tpuforge_workloads import families, storage
from tpuforge_workloads.families.decoder import Decoder
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.lora_checkpoint import LoraCheckpoint
from tpuforge_workloads.merge.mapping import HfLayout, LoraTarget, parse_base_config, targets_of
from tpuforge_workloads.merge.safetensors_io import (
    API_DTYPES,
    FLOAT_DTYPES,
    INDEX_FILE,
    OutTensor,
    SafetensorsCheckpoint,
    ShardPlan,
    TensorInfo,
    plan_shards,
)
from tpuforge_workloads.model import adapters
from tpuforge_workloads.model.lora import MANIFEST_FILE
from tpuforge_workloads.model.lora import read_manifest as read_lora_manifest

CONFIG_FILE = "config.json"
# Base files never copied: weights (rewritten), other weight formats, and commit bookkeeping.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5", ".onnx")
MIB = 1 << 20


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: its source bytes in the base and, when it has one, the LoRA delta to add."""

    source: TensorInfo
    out: OutTensor
    target: LoraTarget | None

    @property
    def is_byte_copy(self) -> bool:
        return self.target is None and self.out.dtype == self.source.dtype


@dataclass(frozen=True)
class MergePlan:
    config: MergeConfig
    base: SafetensorsCheckpoint
    text: Decoder
    layout: HfLayout
    lora: LoraCheckpoint
    scale: float
    jobs: dict[str, TensorJob]  # by tensor name
    shards: tuple[ShardPlan, ...]
    copied_files: tuple[str, ...]  # base files that travel with the weights (names relative to the base URI)
    base_config_sha256: str  # ties the exported adapter to this base

    @property
    def targets(self) -> list[LoraTarget]:
        return [j.target for j in self.jobs.values() if j.target is not None]

    def provenance(self) -> dict[str, Any]:
        """What the output was made from; goes into the commit manifest."""
        return {
            "kind": "merged",
            "modelName": self.config.model_name,
            "baseModelUri": self.config.base_model_uri,
            "checkpointUri": self.config.checkpoint_uri,
            "step": self.lora.step,
            "rank": self.lora.rank,
            "alpha": self.config.lora.alpha,
            "dtype": self.config.dtype,
            "mergedTensors": len(self.targets),
        }


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _check_uris(cfg: MergeConfig) -> None:
    for field, uri in (("baseModelUri", cfg.base_model_uri), ("checkpointUri", cfg.checkpoint_uri)):
        if _overlaps(cfg.output_uri, uri):
            raise MergeInputError(
                f"outputUri {cfg.output_uri} overlaps {field} {uri}: the merge replaces what is under outputUri; "
                "choose a directory of its own"
            )


def read_base_config(uri: str) -> Decoder:
    """The base's decoder shape from its config.json; a checkpoint of no supported family is rejected."""
    config_uri = storage.join(uri, CONFIG_FILE)
    if not storage.is_file(config_uri):
        raise MergeInputError(f"baseModelUri {uri}: no {CONFIG_FILE}; a HuggingFace checkpoint directory has one")
    try:
        config = json.loads(storage.read_text(config_uri))
    except ValueError as e:
        raise MergeInputError(f"{config_uri}: not JSON: {e}") from e
    if not isinstance(config, dict):
        raise MergeInputError(f"{config_uri}: not a JSON object")
    return parse_base_config(config, config_uri)


def _lora_targets(
    cfg: MergeConfig, lora: LoraCheckpoint, layout: HfLayout, base: dict[str, TensorInfo]
) -> dict[str, LoraTarget]:
    """Base tensor name -> the LoRA delta it gets, after checking that the checkpoint adapts exactly the
    configured modules on every layer that has them."""
    unknown = [m for m in cfg.lora.target_modules if m not in layout.modules]
    if unknown:
        raise MergeInputError(
            f"lora.targetModules: {unknown} are not modules of the base's family ({', '.join(layout.modules)})"
        )
    names = set(base)
    expected = {
        (layer, module)
        for module in cfg.lora.target_modules
        for layer in range(layout.num_layers)
        if layout.has_module(layer, module, names)
    }
    found = set(lora.params)
    if missing := sorted(expected - found):
        shown = ", ".join(f"layer {i} {m}" for i, m in missing[:6])
        raise MergeInputError(
            f"LoRA checkpoint {lora.step_uri} lacks {len(missing)} adapters the config expects ({shown}): the "
            f"checkpoint is incomplete, or lora.targetModules / baseModelUri differ from training's"
        )
    if extra := sorted(found - expected):
        layer, module = extra[0]
        why = (
            f"the base has {layout.num_layers} layers"
            if layer >= layout.num_layers
            else f"lora.targetModules {cfg.lora.target_modules} or the base's layer {layer} has no such weight"
        )
        raise MergeInputError(
            f"LoRA checkpoint {lora.step_uri} has adapters the config does not expect (layer {layer} {module}, "
            f"{len(extra)} in all): {why}; use the base model and lora.targetModules that training used"
        )
    targets: dict[str, LoraTarget] = {}
    for p in lora.params.values():
        for t in targets_of(layout, p.layer, p.module, p.a_shape, p.b_shape):
            info = base[t.tensor]
            if info.shape != (t.out_features, t.in_features):
                raise MergeInputError(
                    f"{info.file}: {t.tensor} is {list(info.shape)} but the layer {p.layer} {p.module} adapter "
                    f"(A {list(p.a_shape)}, B {list(p.b_shape)}) implies {[t.out_features, t.in_features]}: "
                    "the base is not the model the adapter was trained on"
                )
            if info.dtype not in FLOAT_DTYPES:
                raise MergeInputError(f"{info.file}: {t.tensor} has dtype {info.dtype}; a LoRA target must be float")
            targets[t.tensor] = t
    return targets


def _check_training_settings(cfg: MergeConfig) -> None:
    """The adapter settings must be the ones training used, as the trainer recorded them in lora.json (a
    checkpoint without it, e.g. one written by plain Tunix, is checked by its shapes only)."""
    where = storage.join(cfg.checkpoint_uri, MANIFEST_FILE)
    try:
        trained = read_lora_manifest(cfg.checkpoint_uri)
    except ValidationError as e:
        raise MergeInputError(f"{where}: not a LoRA manifest ({e.errors()[0]['msg']})") from e
    if trained is None:
        return
    wanted = {
        "modelName": (cfg.model_name, trained.model_name),
        "lora.rank": (cfg.lora.rank, trained.rank),
        "lora.alpha": (cfg.lora.alpha, trained.alpha),
        "lora.targetModules": (sorted(cfg.lora.target_modules), sorted(trained.target_modules)),
    }
    diffs = [f"{field} is {got} but training used {used}" for field, (got, used) in wanted.items() if got != used]
    if diffs:
        raise MergeInputError(f"{'; '.join(diffs)} (from {where}): set them to the values training used")


def copied_files(uri: str) -> tuple[str, ...]:
    """Top-level base files that travel with the weights: config, tokenizer, generation config, templates."""
    keep = []
    for name in storage.list_files(uri):
        if "/" in name or name.endswith(_WEIGHT_SUFFIXES) or name in (INDEX_FILE, COMPLETE_MARKER):
            continue
        keep.append(name)
    return tuple(sorted(keep))


def make_plan(cfg: MergeConfig) -> MergePlan:
    _check_uris(cfg)
    try:
        shape = model_shape(cfg.model_name)
    except KeyError as e:
        raise MergeInputError(f"modelName: {e.args[0]}") from e
    if shape.family not in families.FAMILIES:
        raise MergeInputError(
            f"modelName {cfg.model_name}: the merge supports the families {', '.join(families.FAMILIES)} only"
        )
    text = read_base_config(cfg.base_model_uri)
    base = SafetensorsCheckpoint.open(cfg.base_model_uri)
    infos = base.by_name()
    layout = HfLayout.detect(infos, cfg.base_model_uri, families.of(text).lora_modules)
    if layout.num_layers != text.num_layers or layout.prefix != text.hf_prefix:
        raise MergeInputError(
            f"baseModelUri {cfg.base_model_uri}: {CONFIG_FILE} describes {text.num_layers} layers under "
            f"{text.hf_prefix!r} but the weights have {layout.num_layers} under {layout.prefix!r}"
        )
    lora = LoraCheckpoint.open(cfg.checkpoint_uri, cfg.step, cfg.select)
    _check_training_settings(cfg)
    if lora.rank != cfg.lora.rank:
        raise MergeInputError(
            f"lora.rank is {cfg.lora.rank} but the adapters in {lora.step_uri} have rank {lora.rank}: set lora.rank "
            "to the rank training used"
        )
    targets = _lora_targets(cfg, lora, layout, infos)
    out_dtype = API_DTYPES[cfg.dtype] if cfg.dtype else None
    jobs = {}
    for t in base.tensors:
        dtype = out_dtype if out_dtype and t.dtype in FLOAT_DTYPES else t.dtype
        jobs[t.name] = TensorJob(t, OutTensor(t.name, dtype, t.shape), targets.get(t.name))
    shards = plan_shards((j.out for j in jobs.values()), cfg.shard_size_mb * MIB)
    return MergePlan(
        config=cfg,
        base=base,
        text=text,
        layout=layout,
        lora=lora,
        scale=cfg.lora.alpha / cfg.lora.rank,
        jobs=jobs,
        shards=tuple(shards),
        copied_files=copied_files(cfg.base_model_uri),
        base_config_sha256=adapters.config_sha256(cfg.base_model_uri),
    )
