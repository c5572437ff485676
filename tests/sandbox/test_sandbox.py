"""The sandbox's control plane with tpuforge's CRDs: schema validation happens in the real apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fixtures.cluster import kubectl
from tpuforge.api.constants import FINETUNEJOB_PLURAL, GROUP, SERVING_PLURAL, VERSION
from tpuforge_sandbox import Sandbox

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def minimal_finetunejob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "gemma4-tiny", "uri": "gs://tpuforge/models/gemma4-tiny"},
            "dataset": {"uri": "gs://tpuforge/data/train.jsonl"},
            "training": {"maxSeqLen": 128},
            "checkpoint": {"uri": "gs://tpuforge/runs/x/checkpoints"},
            "output": {"uri": "gs://tpuforge/runs/x/merged"},
            "serviceAccountName": "default",
        },
    }


def test_both_crds_are_established(api_client: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    for plural in (FINETUNEJOB_PLURAL, SERVING_PLURAL):
        crd = ext.read_custom_resource_definition(f"{plural}.{GROUP}")
        conds = {c.type: c.status for c in crd.status.conditions}
        assert conds.get("Established") == "True", conds
        assert conds.get("NamesAccepted") == "True", conds


@pytest.mark.parametrize("example", ["finetune.yaml", "serving.yaml", "finetune-demo.yaml", "serving-demo.yaml"])
def test_examples_apply(sandbox: Sandbox, namespace: str, example: str) -> None:
    path = REPO / "examples" / example
    out = kubectl(sandbox, "apply", "-n", namespace, "-f", str(path))
    assert out.returncode == 0, out.stderr
    for doc in yaml.safe_load_all(path.read_text()):
        got = kubectl(sandbox, "get", "-n", namespace, doc["kind"].lower(), doc["metadata"]["name"], "-o", "yaml")
        assert got.returncode == 0, got.stderr
        assert yaml.safe_load(got.stdout)["spec"], f"{doc['kind']} {doc['metadata']['name']} has no spec"


def test_a_valid_minimal_finetunejob_gets_its_defaults(api_client: client.ApiClient, namespace: str) -> None:
    api = client.CustomObjectsApi(api_client)
    obj = api.create_namespaced_custom_object(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, minimal_finetunejob("ok"))
    assert obj["spec"]["lora"]["rank"] == 64  # structural-schema defaulting in the apiserver


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda s: s.update(lora={"rank": 0}), "spec.lora.rank", "greater than or equal to 1"),
        (lambda s: s["training"].pop("maxSeqLen"), "spec.training.maxSeqLen", "Required value"),
        (lambda s: s["training"].update(epochs="three"), "spec.training.epochs", "must be of type integer"),
        (lambda s: s.update(lora={"rank": "big"}), "spec.lora.rank", "must be of type integer"),
    ],
    ids=["rank-0", "missing-maxSeqLen", "epochs-string", "rank-string"],
)
def test_invalid_finetunejobs_are_rejected_naming_the_field(
    api_client: client.ApiClient, namespace: str, mutate: Any, field: str, words: str
) -> None:
    body = minimal_finetunejob("bad")
    mutate(body["spec"])
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, body
        )
    assert err.value.status == 422
    assert field in err.value.body and words in err.value.body, err.value.body


def test_kubectl_get_finetunejobs_prints_the_printer_columns(
    sandbox: Sandbox, api_client: client.ApiClient, namespace: str
) -> None:
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, minimal_finetunejob("cols")
    )
    crd = yaml.safe_load((REPO / "crds" / f"{GROUP}_{FINETUNEJOB_PLURAL}.yaml").read_text())
    columns = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    out = kubectl(sandbox, "get", "finetunejobs", "-n", namespace)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert header.split() == ["NAME", *columns]
    assert row.split()[0] == "cols"
    short = kubectl(sandbox, "get", "ftj", "-n", namespace, "-o", "name")
    assert short.stdout.strip() == f"finetunejob.{GROUP}/cols"
