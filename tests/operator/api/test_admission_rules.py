"""The CRDs' CEL validation rules (tpuforge.api.admission), evaluated with cel-python the way the apiserver
evaluates them: each rule on every object its schema node describes, after the schema's defaults. Every example
passes them; each invalid spec below is refused by exactly one rule, naming the field the operator's own
validation names. tests/operator/test_crd_validation.py applies the same specs to the sandbox's apiserver."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tpuforge import crds
from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, SpecError, check_finetune, check_serving, parse
from tpuforge.api.admission import ADMISSION_RULES
from tpuforge.api.constants import FINETUNEJOB_KIND

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))
DROP = object()  # a change that removes the field


def schema_of(kind: str) -> dict[str, Any]:
    found = next(k for k in crds.KINDS if k.kind == kind)
    schema: dict[str, Any] = crds.crd(found)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def defaulted(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in where a field is absent, as the apiserver stores it."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for name, sub in schema["properties"].items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = defaulted(sub, out[name])
        return out
    if isinstance(value, list) and "items" in schema:
        return [defaulted(schema["items"], v) for v in value]
    return value


def rule_sites(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Each rule with the path of its node: property names, and [] for a list's items."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in schema.get("properties", {}).items():
        yield from rule_sites(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from rule_sites(schema["items"], (*path, "[]"))


def values_at(value: Any, path: tuple[str, ...], where: str = "") -> Iterator[tuple[str, Any]]:
    """The values at `path` that are present, each with its field as the apiserver names it (spec.adapters[1])."""
    if not path:
        yield where, value
    elif path[0] == "[]":
        for i, item in enumerate(value if isinstance(value, list) else []):
            yield from values_at(item, path[1:], f"{where}[{i}]")
    elif isinstance(value, dict) and path[0] in value:
        yield from values_at(value[path[0]], path[1:], f"{where}.{path[0]}" if where else path[0])


@functools.cache
def program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def passes(rule: str, value: Any) -> bool:
    return bool(program(rule).evaluate({"self": celpy.json_to_cel(value)}))


def refusals(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(field, rule) for each rule that refuses `obj`, the field as the apiserver's error names it."""
    schema = schema_of(obj["kind"])
    stored = defaulted(schema, obj)
    return [
        (where + rule.get("fieldPath", ""), rule)
        for path, rule in rule_sites(schema)
        for where, value in values_at(stored, path)
        if not passes(rule["rule"], value)
    ]


def operator_fields(obj: dict[str, Any]) -> list[str]:
    """The fields the operator's validation names for `obj` (empty when it would run it)."""
    try:
        if obj["kind"] == FINETUNEJOB_KIND:
            errors = check_finetune(parse(FineTuneJobSpec, obj["spec"]))
        else:
            spec = parse(ServingDeploymentSpec, obj["spec"])
            errors = check_serving(spec, served_name=spec.vllm.served_model_name or obj["metadata"]["name"])
    except SpecError as e:
        return e.fields
    return [e.field for e in errors]


def example(file: str, name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "examples" / file).read_text())
    found: dict[str, Any] = next(d for d in docs if d and d["metadata"]["name"] == name)
    return found


@dataclass(frozen=True)
class InvalidSpec:
    """An example with `changes` to its spec (dotted paths, list items by index) that one rule refuses."""

    id: str
    file: str
    name: str
    changes: dict[str, Any]
    field: str  # what the apiserver's error names

    def object(self, name: str = "refused") -> dict[str, Any]:
        obj = copy.deepcopy(example(self.file, self.name))
        obj["metadata"] = {"name": name}
        for dotted, value in self.changes.items():
            *parents, last = dotted.split(".")
            node: Any = obj["spec"]
            for key in parents:
                node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
            if value is DROP:
                del node[last]
            elif isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        return obj


FINETUNE = ("finetune.yaml", "gemma4-31b-verilog")
ADAPTER = ("finetune-adapter.yaml", "gemma4-31b-verilog-adapter")
PASS_AT_K = ("finetune-verilog-passk.yaml", "gemma4-31b-verilog-passk")
SERVING = ("serving.yaml", "gemma4-31b-verilog")
ADAPTERS = ("serving-adapters.yaml", "gemma4-31b")

INVALID = [
    InvalidSpec("mesh-size", *FINETUNE, {"tpu.mesh": {"fsdp": 2, "tp": 4}}, "spec.tpu.mesh"),
    InvalidSpec(
        "tp-across-hosts", *FINETUNE, {"tpu.slice": "v5p-16", "tpu.mesh": {"fsdp": 1, "tp": 8}}, "spec.tpu.mesh.tp"
    ),
    InvalidSpec("warmup-as-long-as-training", *FINETUNE, {"training.maxSteps": 100}, "spec.training.warmupSteps"),
    InvalidSpec(
        "output-inside-checkpoints",
        *FINETUNE,
        {"output.uri": "gs://my-runs/gemma4-31b-verilog/checkpoints/merged"},
        "spec.output.uri",
    ),
    InvalidSpec(
        "checkpoints-inside-output",
        *FINETUNE,
        {"checkpoint.uri": "gs://my-runs/gemma4-31b-verilog/merged/checkpoints"},
        "spec.output.uri",
    ),
    InvalidSpec(
        "best-checkpoint-without-eval-data",
        *FINETUNE,
        {"checkpoint.select": "best", "dataset.evalUri": DROP},
        "spec.checkpoint.select",
    ),
    InvalidSpec(
        "early-stopping-without-eval-data",
        *FINETUNE,
        {"training.earlyStopping": {"patience": 3}, "dataset.evalUri": DROP},
        "spec.training.earlyStopping",
    ),
    InvalidSpec("evaluation-without-adapter", *ADAPTER, {"merge.writeAdapter": False}, "spec.merge.writeAdapter"),
    InvalidSpec("evaluation-without-data", *ADAPTER, {"dataset.evalUri": DROP}, "spec.evaluation.datasetUri"),
    InvalidSpec("eval-file-and-eval-fraction", *ADAPTER, {"dataset.evalFraction": 0.1}, "spec.dataset.evalFraction"),
    InvalidSpec(
        "max-loss-without-loss", *ADAPTER, {"evaluation.metrics": ["exactMatch"]}, "spec.evaluation.thresholds.maxLoss"
    ),
    InvalidSpec(
        "min-exact-match-without-exact-match",
        *ADAPTER,
        {"evaluation.metrics": ["loss"]},
        "spec.evaluation.thresholds.minExactMatch",
    ),
    InvalidSpec("evaluation-on-several-hosts", *ADAPTER, {"evaluation.slice": "v6e-16"}, "spec.evaluation.slice"),
    InvalidSpec(
        "pass-at-k-without-code",
        *PASS_AT_K,
        {"evaluation.code": DROP, "evaluation.thresholds.minPassAt": DROP},
        "spec.evaluation.code",
    ),
    InvalidSpec("code-without-pass-at-k", *PASS_AT_K, {"evaluation.metrics": ["loss"]}, "spec.evaluation.metrics"),
    InvalidSpec(
        "pass-at-k-not-measured",
        *PASS_AT_K,
        {"evaluation.thresholds.minPassAt": {"3": 0.5}},
        "spec.evaluation.thresholds.minPassAt",
    ),
    InvalidSpec("code-without-checker", *PASS_AT_K, {"evaluation.code.checker": DROP}, "spec.evaluation.code.checker"),
    InvalidSpec("k-above-samples", *PASS_AT_K, {"evaluation.code.k": [1, 10]}, "spec.evaluation.code.k"),
    InvalidSpec("k-twice", *PASS_AT_K, {"evaluation.code.k": [1, 1]}, "spec.evaluation.code.k"),
    InvalidSpec("model-uri-and-job", *SERVING, {"model.uri": "gs://my-models/gemma-4-31b-it"}, "spec.model"),
    InvalidSpec("model-from-nowhere", *SERVING, {"model.fineTuneJobRef": DROP}, "spec.model"),
    InvalidSpec(
        "replicas-on-one-cache-disk",
        *SERVING,
        {"replicas": 2, "modelStorage": {"medium": "NodeLocal"}},
        "spec.xlaCache.accessMode",
    ),
    InvalidSpec(
        "replicas-on-one-model-disk",
        *SERVING,
        {"replicas": 2, "xlaCache.accessMode": "ReadWriteMany", "xlaCache.storageClassName": "standard-rwx"},
        "spec.modelStorage.medium",
    ),
    InvalidSpec(
        "shared-cache-on-the-default-disk-class",
        *SERVING,
        {"xlaCache.accessMode": "ReadWriteMany"},
        "spec.xlaCache.storageClassName",
    ),
    InvalidSpec(
        "hyperdisk-ml-without-its-class",
        *SERVING,
        {"modelStorage": {"medium": "HyperdiskML", "dataSource": "gemma4-31b-verilog"}},
        "spec.modelStorage.storageClassName",
    ),
    InvalidSpec(
        "hyperdisk-ml-without-a-data-source",
        *SERVING,
        {"modelStorage": {"medium": "HyperdiskML", "storageClassName": "tpuforge-hyperdisk-ml"}},
        "spec.modelStorage.dataSource",
    ),
    InvalidSpec(
        "node-selector-contradicts-the-slice",
        *FINETUNE,
        {"tpu.scheduling": {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2x2"}}},
        "spec.tpu.scheduling.nodeSelector",
    ),
    InvalidSpec(
        "spot-by-node-selector",
        *FINETUNE,
        {"tpu.spot": False, "tpu.scheduling": {"nodeSelector": {"cloud.google.com/gke-spot": "true"}}},
        "spec.tpu.scheduling.nodeSelector",
    ),
    InvalidSpec(
        "reservation-on-spot", *FINETUNE, {"tpu.scheduling": {"reservation": "v5p-reserved"}}, "spec.tpu.scheduling"
    ),
    InvalidSpec(
        "reservation-and-flex-start",
        *SERVING,
        {"tpu.scheduling": {"reservation": "v6e-reserved", "flexStart": True}},
        "spec.tpu.scheduling",
    ),
    InvalidSpec(
        "toleration-exists-with-a-value",
        *FINETUNE,
        {"tpu.scheduling": {"tolerations": [{"key": "dedicated", "operator": "Exists", "value": "ml"}]}},
        "spec.tpu.scheduling.tolerations[0]",
    ),
    InvalidSpec(
        "toleration-equal-without-a-key",
        *SERVING,
        {"tpu.scheduling": {"tolerations": [{"operator": "Equal", "value": "ml"}]}},
        "spec.tpu.scheduling.tolerations[0]",
    ),
    InvalidSpec(
        "toleration-seconds-without-no-execute",
        *SERVING,
        {"tpu.scheduling": {"tolerations": [{"key": "dedicated", "operator": "Exists", "tolerationSeconds": 60}]}},
        "spec.tpu.scheduling.tolerations[0]",
    ),
    InvalidSpec("tp-not-dividing-chips", *SERVING, {"vllm.tensorParallelSize": 3}, "spec.vllm.tensorParallelSize"),
    InvalidSpec("serving-on-several-hosts", *SERVING, {"tpu.slice": "v6e-16"}, "spec.tpu.slice"),
    InvalidSpec(
        "adapter-uri-and-job", *ADAPTERS, {"adapters.1.fineTuneJobRef": {"name": "support-v3"}}, "spec.adapters[1]"
    ),
    InvalidSpec("adapter-name-twice", *ADAPTERS, {"adapters.1.name": "verilog"}, "spec.adapters"),
    InvalidSpec("adapter-named-as-the-base", *ADAPTERS, {"adapters.0.name": "gemma4-31b"}, "spec.adapters"),
    InvalidSpec("cpu-loras-below-max-loras", *ADAPTERS, {"vllm.lora.maxCpuLoras": 2}, "spec.vllm.lora.maxCpuLoras"),
]


def all_rules() -> list[dict[str, Any]]:
    return [rule for kind in crds.KINDS for _, rule in rule_sites(schema_of(kind.kind))]


def test_every_admission_rule_is_in_the_generated_crds_with_a_field_path_the_schema_has() -> None:
    generated = all_rules()
    for model, rules in ADMISSION_RULES.items():
        for rule in rules:
            assert rule.to_schema() in generated, f"{model.__name__}: {rule.rule}"
    for kind in crds.KINDS:
        for path, rule in rule_sites(schema_of(kind.kind)):
            assert rule["message"] and rule["reason"] in ("FieldValueInvalid", "FieldValueRequired"), rule
            node = schema_of(kind.kind)
            for key in [*path, *rule.get("fieldPath", "").split(".")[1:]]:
                node = node["items"] if key == "[]" else node["properties"][key]


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("FineTuneJob", ("spec", "evaluation", "metrics")),
        ("FineTuneJob", ("spec", "evaluation", "code", "k")),
        ("ServingDeployment", ("spec", "adapters")),
    ],
)
def test_the_lists_rules_iterate_are_bounded_for_the_cost_estimate(kind: str, path: tuple[str, ...]) -> None:
    node = schema_of(kind)
    for key in path:
        node = node["properties"][key]
    assert node["type"] == "array" and node["maxItems"] <= 200


@pytest.mark.parametrize("file", EXAMPLES)
def test_every_example_passes_every_rule(file: str) -> None:
    for obj in yaml.safe_load_all((ROOT / "examples" / file).read_text()):
        if obj:
            assert refusals(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_each_invalid_spec_is_refused_by_one_rule_naming_the_field_the_operator_names(case: InvalidSpec) -> None:
    obj = case.object()
    assert [where for where, _ in refusals(obj)] == [case.field]
    assert any(f.startswith(case.field) for f in operator_fields(obj)), operator_fields(obj)


def test_every_rule_refuses_one_of_the_invalid_specs() -> None:
    used = [rule for case in INVALID for _, rule in refusals(case.object())]
    for rule in all_rules():
        assert rule in used, f"no invalid spec for {rule['rule']}"
