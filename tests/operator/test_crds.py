"""The CRDs are generated from the api models, are structural, and match what is committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tpuforge import crds
from tpuforge.api import validate_finetune, validate_serving

ROOT = Path(__file__).resolve().parents[2]


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.get("properties", {}).items():
            out += walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            out += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_committed_crds_match_the_models(kind: crds.Kind) -> None:
    committed = (ROOT / "crds" / crds.filename(kind)).read_text()
    assert committed == crds.render(kind), "crds/ is stale: run `make crds`"


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_schema_is_structural(kind: crds.Kind) -> None:
    schema = crds.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "type" in node, f"{path} has no type"
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path


def test_finetunejob_schema_carries_defaults_enums_and_required() -> None:
    kind = crds.KINDS[0]
    spec = crds.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["required"]) == {"model", "dataset", "training", "checkpoint", "output"}
    training = spec["properties"]["training"]
    assert training["required"] == ["maxSeqLen"]
    assert training["properties"]["lossOn"]["enum"] == ["assistant", "all"]
    assert spec["properties"]["lora"]["properties"]["rank"]["minimum"] == 1
    assert spec["properties"]["lora"]["default"]["rank"] == 64
    assert spec["properties"]["tpu"]["properties"]["slice"]["default"] == "v5p-8"
    assert spec["properties"]["merge"]["properties"]["shardSizeMB"]["default"] == 4096


def test_printer_columns() -> None:
    names = [c["name"] for c in crds.crd(crds.KINDS[0])["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert names == ["Phase", "Progress", "Step", "Loss", "Tok/s", "ETA", "Cost", "Eval", "Slice", "Age"]
    names = [c["name"] for c in crds.crd(crds.KINDS[1])["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert names == ["Phase", "Ready", "Endpoint", "Model", "Adapters", "Slice", "Age"]


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_validate_against_the_generated_schema_and_the_api(example: str) -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / example).read_text()) if d]
    assert docs, example
    for obj in docs:
        kind = next(k for k in crds.KINDS if k.kind == obj["kind"])
        schema = crds.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(schema).validate(obj)  # OpenAPI 3.0 bounds follow draft 4
        if kind.kind == "FineTuneJob":
            validate_finetune(obj["spec"])
        else:
            validate_serving(obj["spec"], "gemma4-tiny" if "demo" in example else None)


def test_every_example_kind_is_covered() -> None:
    assert {
        "finetune.yaml",
        "finetune-adapter.yaml",
        "serving.yaml",
        "serving-adapters.yaml",
        "finetune-demo.yaml",
    } <= set(EXAMPLES)


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crds.main(["--out", str(tmp_path)]) == 0
    assert crds.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / crds.filename(crds.KINDS[0])).write_text("stale")
    assert crds.main(["--out", str(tmp_path), "--check"]) == 1


def test_api_reference_is_current() -> None:
    from tpuforge import apidocs

    text = apidocs.render()
    assert (ROOT / "docs" / "api.md").read_text() == text, "docs/api.md is stale: run `make crds`"
    assert "| `maxSeqLen` | integer | **required** |" in text
    assert "| `v5p-8` | tpu-v5p-slice | 2x2x1 |" in text


def served(kind: crds.Kind) -> dict[str, Any]:
    """The CRD as an apiserver returns it after applying the committed file (YAML, then JSON)."""
    text = (ROOT / "helm" / "tpuforge" / "crds" / crds.filename(kind)).read_text()
    out: dict[str, Any] = yaml.safe_load(text)
    out["spec"]["conversion"] = {"strategy": "None"}  # what the apiserver adds
    return out


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_the_chart_crds_are_the_ones_the_operator_checks_for_at_start(kind: crds.Kind) -> None:
    assert crds.schema_drift(kind, served(kind)) is None


def test_an_older_served_schema_is_named_with_the_fields_it_lacks() -> None:
    kind = next(k for k in crds.KINDS if k.kind == "FineTuneJob")
    old = served(kind)
    old["metadata"]["labels"]["tpuforge.dev/version"] = "0.0.9"
    spec = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    del spec["priorityClassName"]
    spec["training"]["properties"]["maxSteps"]["minimum"] = 1.0  # an integer written as a float is the same
    drift = crds.schema_drift(kind, old)
    assert drift is not None and "from tpuforge 0.0.9" in drift
    assert "spec.properties.priorityClassName (missing from the served schema)" in drift
    assert "maxSteps" not in drift
    assert crds.schema_drift(kind, None) == "CRD finetunejobs.tpuforge.dev is not installed"


@pytest.mark.cluster
def test_the_upgrade_hooks_apply_leaves_the_served_crds_as_the_operator_expects(
    sandbox: Any, api_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tpuforge crds --apply` (the chart's pre-upgrade hook) on a real apiserver: a server-side apply of the
    CRDs already there, after which the schema the apiserver serves is the operator's (its start-up check)."""
    from tpuforge.kube import client as kube_client

    assert crds.main(["--apply", "--kubeconfig", str(sandbox.kubeconfig)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"applied {crds.crd_name(k)}" for k in crds.KINDS]
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for kind in crds.KINDS:
        served = kube_client.request(api_client, "GET", f"{path}/{crds.crd_name(kind)}")
        assert crds.schema_drift(kind, served) is None
        assert crds.FIELD_MANAGER in {m["manager"] for m in served["metadata"]["managedFields"]}
