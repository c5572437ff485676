"""CustomResourceDefinitions generated from the tpuforge.api models, the single source of truth.

Pydantic's JSON Schema is turned into a Kubernetes structural OpenAPI v3 schema: references inlined, optional
fields made plain (absent means unset), OpenAPI 3.0 spellings of exclusive bounds, and no
`additionalProperties: false` beside `properties` (forbidden by the apiserver, which prunes unknown fields).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tpuforge import apidocs
from tpuforge.api import constants as c
from tpuforge.api.admission import ADMISSION_RULES
from tpuforge.kinds import KINDS, Kind, nested_model

_DROP_KEYS = {"title", "discriminator"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            if rest.get("default", "absent") is None:
                rest.pop("default")
            return _structural({**options[0], **rest}, defs)
        raise ValueError(f"cannot express anyOf with several types in a structural schema: {node}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS or key == "$defs":
            continue
        # A null default is no default (the apiserver refuses one the schema does not allow).
        if key == "default" and value is None:
            continue
        if key == "properties":
            out[key] = {name: _structural(v, defs) for name, v in value.items()}
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value, defs)
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        else:
            out[key] = _structural(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _model_nodes(model: type[BaseModel], schema: dict[str, Any]) -> Iterator[tuple[type[BaseModel], dict[str, Any]]]:
    """`model` with its node in `schema`, then every model nested in it with its node (a list's: its items')."""
    yield model, schema
    props = schema.get("properties", {})
    for name, info in model.model_fields.items():
        sub = props.get(info.alias or name)
        nested = nested_model(info.annotation)
        if sub is not None and nested is not None:
            yield from _model_nodes(nested, sub.get("items", sub) if sub.get("type") == "array" else sub)


def _factory_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Pydantic leaves `default_factory` values out of the JSON Schema; put them in, so the apiserver stores
    every default and `kubectl get -o yaml` shows the job exactly as it will run."""
    for each, node in _model_nodes(model, schema):
        props = node.get("properties", {})
        for name, info in each.model_fields.items():
            sub = props.get(info.alias or name)
            if sub is not None and info.default_factory is not None and "default" not in sub:
                value = info.default_factory()  # type: ignore[call-arg]
                sub["default"] = value.to_wire() if isinstance(value, BaseModel) else value  # type: ignore[attr-defined]


def _admission_rules(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Each model's CEL rules (tpuforge.api.admission) on its node, where the apiserver checks them."""
    for each, node in _model_nodes(model, schema):
        rules = ADMISSION_RULES.get(each)
        if rules:
            node["x-kubernetes-validations"] = [r.to_schema() for r in rules]


def _without_defaults(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_defaults(n) for n in node]
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    return node


def openapi_schema(model: type[BaseModel], defaults: bool = True) -> dict[str, Any]:
    """The structural schema of `model`, with its admission rules; without defaults for status, which only its
    writers fill in."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    if not defaults:
        return dict(_without_defaults(schema))
    _factory_defaults(model, schema)
    _admission_rules(model, schema)
    return schema


def crd(kind: Kind) -> dict[str, Any]:
    columns = []
    for name, typ, path, desc in kind.columns:
        col: dict[str, Any] = {"name": name, "type": typ, "jsonPath": path}
        if desc:
            col["description"] = desc
        columns.append(col)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{c.GROUP}",
            "labels": {c.LABEL_PART_OF: "tpuforge", "tpuforge.dev/version": c.PROJECT_VERSION},
        },
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": [kind.short],
                "categories": [c.CATEGORY],
            },
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, **({"scale": kind.scale} if kind.scale else {})},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": kind.description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": openapi_schema(kind.spec),
                                "status": openapi_schema(kind.status, defaults=False),
                            },
                        }
                    },
                }
            ],
        },
    }


def render(kind: Kind) -> str:
    header = "# Generated from tpuforge.api by `tpuforge crds`; do not edit.\n"
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=110)


def filename(kind: Kind) -> str:
    return f"{c.GROUP}_{kind.plural}.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tpuforge crds", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("crds"), help="directory to write (default: crds)")
    ap.add_argument("--docs", type=Path, default=None, help="also write the API reference (docs/api.md)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the files differ from the models")
    args = ap.parse_args(argv)
    outputs = [(args.out / filename(kind), render(kind)) for kind in KINDS]
    if args.docs is not None:
        outputs.append((args.docs, apidocs.render()))
    stale = []
    for path, text in outputs:
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(f"stale generated files (run `make crds`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
