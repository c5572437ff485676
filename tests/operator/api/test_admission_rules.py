"""The CRDs' CEL validation rules (tpuforge.api.admission), evaluated with cel-python the way the apiserver
evaluates them: each rule on every object its schema node describes, after the schema's defaults. Every example
passes them; each invalid spec below is refused by exactly one rule, naming the field the operator's own
validation names. tests/operator/test_crd_validation.py applies the same specs to the sandbox's apiserver."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.fixtures.admission import (
    EXAMPLES,
    INVALID,
    ROOT,
    InvalidSpec,
    refusals,
    rule_sites,
    schema_of,
)
from tpuforge import crds
from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, SpecError, check_finetune, check_serving, parse
from tpuforge.api.admission import ADMISSION_RULES
from tpuforge.api.constants import FINETUNEJOB_KIND


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
