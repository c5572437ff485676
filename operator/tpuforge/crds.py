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
            "name": crd_name(kind),
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


# --- The CRDs on a cluster ---------------------------------------------------------------------------------

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "tpuforge-crds"
_MAX_PATHS = 6


def crd_name(kind: Kind) -> str:
    return f"{kind.plural}.{c.GROUP}"


def _differences(served: Any, built: Any, path: str, out: list[str]) -> None:
    if isinstance(served, dict) and isinstance(built, dict):
        for key in sorted(served.keys() | built.keys()):
            if key not in built:
                out.append(f"{path}.{key} (only in the served schema)")
            elif key not in served:
                out.append(f"{path}.{key} (missing from the served schema)")
            else:
                _differences(served[key], built[key], f"{path}.{key}", out)
    elif served != built:  # 1 == 1.0: the apiserver may write a float default as an integer
        out.append(path)


def schema_drift(kind: Kind, served: dict[str, Any] | None) -> str | None:
    """Why the served CRD of `kind` (as the apiserver returns it; None: not installed) is not the one this
    operator was built with, naming the first schema paths that differ; None when it is."""
    if served is None:
        return f"CRD {crd_name(kind)} is not installed"
    version = next((v for v in served.get("spec", {}).get("versions", []) if v.get("name") == c.VERSION), None)
    if version is None:
        return f"CRD {crd_name(kind)} serves no version {c.VERSION}"
    built = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: list[str] = []
    _differences(version.get("schema", {}).get("openAPIV3Schema", {}), built, "openAPIV3Schema", found)
    if not found:
        return None
    shown = ", ".join(found[:_MAX_PATHS]) + (f" and {len(found) - _MAX_PATHS} more" if len(found) > _MAX_PATHS else "")
    was = (served.get("metadata", {}).get("labels") or {}).get("tpuforge.dev/version", "an unknown version")
    return f"CRD {crd_name(kind)} (from tpuforge {was}) differs from tpuforge {c.PROJECT_VERSION}'s: {shown}"


DRIFT_FIX = (
    "the apiserver would prune or refuse fields this operator writes: upgrade the CRDs with the operator "
    "(`helm upgrade` applies them in its pre-upgrade hook; by hand: `tpuforge crds --apply`, or "
    "`kubectl apply --server-side -f helm/tpuforge/crds/` from the chart of this operator's version)"
)


def render(kind: Kind) -> str:
    header = "# Generated from tpuforge.api by `tpuforge crds`; do not edit.\n"
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=110)


def filename(kind: Kind) -> str:
    return f"{c.GROUP}_{kind.plural}.yaml"


def apply_crds(kubeconfig: str | None, context: str | None) -> int:
    """Server-side apply of both CRDs (created if absent, brought to this version's schema if not), then wait
    until the apiserver serves them as applied."""
    from tpuforge.kube import client as kube_client  # only here: writing files needs no Kubernetes client

    kube_client.configure(kubeconfig, context)
    api = kube_client.api_client()
    path = CRD_PATH
    for kind in KINDS:
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        kube_client.request(
            api, "PATCH", f"{path}/{crd_name(kind)}", body=crd(kind), content_type=APPLY_PATCH, query=query
        )
        print(f"applied {crd_name(kind)}")
    for kind in KINDS:
        drift = schema_drift(kind, kube_client.request(api, "GET", f"{path}/{crd_name(kind)}"))
        if drift is not None:
            print(f"applied, but the apiserver serves another schema: {drift}", file=sys.stderr)
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tpuforge crds", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("crds"), help="directory to write (default: crds)")
    ap.add_argument("--docs", type=Path, default=None, help="also write the API reference (docs/api.md)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the files differ from the models")
    ap.add_argument(
        "--apply",
        action="store_true",
        help="apply the CRDs to the cluster (server-side apply; the chart's pre-upgrade hook runs this) instead of "
        "writing files",
    )
    ap.add_argument("--kubeconfig", default=None, help="with --apply: kubeconfig (default: in-cluster, then ~/.kube)")
    ap.add_argument("--context", default=None, help="with --apply: kubeconfig context")
    args = ap.parse_args(argv)
    if args.apply:
        return apply_crds(args.kubeconfig, args.context)
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
