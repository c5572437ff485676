"""docs/api.md generated from the tpuforge.api models, so the reference never drifts from the CRDs."""

from __future__ import annotations

import json
from enum import Enum
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from tpuforge.api import MODELS, TPU_SLICES
from tpuforge.api.admission import ADMISSION_RULES
from tpuforge.kinds import KINDS, Kind, nested_model

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:  # a constrained type: its constraints are in the CRD schema
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " / ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type):
        return _SCALARS.get(annotation, annotation.__name__)
    return str(annotation)


def _default(info: Any) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, BaseModel):
            return "see below"
        return f"`{json.dumps(value)}`"
    if info.default is None:
        return ""
    value = info.default.value if hasattr(info.default, "value") else info.default
    return f"`{json.dumps(value)}`"


def _table(model: type[BaseModel], path: str, out: list[str], seen: set[type[BaseModel]]) -> None:
    out.append(f"\n### `{path}`\n")
    out.append("| field | type | default | description |")
    out.append("|---|---|---|---|")
    nested: list[tuple[type[BaseModel], str]] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        sub = nested_model(info.annotation)
        typ = _type_name(info.annotation)
        desc = (info.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{alias}` | {typ} | {_default(info)} | {desc} |")
        if sub is not None and sub not in seen:
            seen.add(sub)
            nested.append((sub, f"{path}.{alias}"))
    rules = ADMISSION_RULES.get(model, ())
    if rules:
        out.append("\nThe apiserver refuses (CEL rules in the CRD):")
        out.extend(f"- `{path}{rule.field_path}`: {rule.message}" for rule in rules)
    for sub, sub_path in nested:
        _table(sub, sub_path, out, seen)


def _kind_section(kind: Kind, out: list[str]) -> None:
    out.append(f"\n## {kind.kind} (`{kind.plural}`, short name `{kind.short}`)\n")
    out.append(kind.description)
    _table(kind.spec, "spec", out, set())
    _table(kind.status, "status", out, set())


def render() -> str:
    out = [
        "# API reference: tpuforge.dev/v1alpha1",
        "",
        "Generated from `tpuforge.api` by `make crds`; do not edit. The CRDs in `crds/` come from the same models,",
        "so every default below is also the default the apiserver stores.",
    ]
    for kind in KINDS:
        _kind_section(kind, out)
    out.append("\n## TPU slices (`spec.tpu.slice`)\n")
    out.append(
        "| id | GKE accelerator | topology | machine type | chips/host x hosts | default mesh | on-demand $/h "
        "| a training attempt is |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    for s in TPU_SLICES.values():
        runs = f"a JobSet of {s.hosts} pods" if s.hosts > 1 else "a Job"
        out.append(
            f"| `{s.id}` | {s.accelerator} | {s.topology} | {s.machine_type} | {s.chips_per_host} x {s.hosts} | "
            f"fsdp {s.default_fsdp} x tp {s.default_tp} | {s.usd_per_hour:.2f} | {runs} |"
        )
    out.append(
        "\nPrices are on-demand list prices per chip-hour times the slice's chips; the mesh's tp stays within one "
        "host (tp <= chips per host), fsdp spans the hosts."
    )
    out.append("\n## Models (`spec.model.name`)\n")
    out.append(
        "| id | checkpoint | params | layers | embed | heads x dim | kv heads (sliding / global) | global head dim "
        "| experts | vocab | dtype | stages | train slice |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in MODELS.values():
        experts = f"{m.num_experts} (top {m.experts_per_token})" if m.num_experts else "-"
        stages = ", ".join(m.stages) or "none yet (sizing only)"
        out.append(
            f"| `{m.id}` | {m.hf_repo or 'test model'} | {m.text_params / 1e9:.2f}B | {m.num_layers} | {m.embed_dim} | "
            f"{m.num_heads} x {m.head_dim} | {m.num_kv_heads} / {m.num_global_kv_heads} | {m.global_head_dim} | "
            f"{experts} | {m.vocab_size} | {m.dtype} | {stages} | {m.train_slice or '-'} |"
        )
    out.append(
        "\nA model without a stage is rejected there with `spec.model.name` and the reason. The train slice is the "
        "cheapest whose chips hold the model's weights for LoRA training (`tpuforge.api.catalog.training_slices`); "
        "the preflight's compile of a job has the last word. A Qwen3 model has no sliding layers: all of its layers "
        "count as global here."
    )
    families: dict[str, tuple[str, ...]] = {}
    for m in MODELS.values():
        families.setdefault(m.family, m.lora_targets)
    out.append(
        "\nLoRA targets (`spec.lora.targetModules`) by family; the default, Gemma 4's, stands for the model's own:\n"
    )
    out += [f"- {family}: {', '.join(f'`{t}`' for t in targets)}" for family, targets in families.items()]
    return "\n".join(out) + "\n"
