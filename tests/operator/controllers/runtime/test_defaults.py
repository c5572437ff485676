"""The operator's defaults are read once, at start, from its command line (or the environment the Helm chart
sets), and the plans take them from there: here, the StorageClass of the volumes a spec names none for."""

from __future__ import annotations

from typing import Any

import pytest

from tpuforge import api
from tpuforge.controllers.main import ENV_STORAGE_CLASS, parser
from tpuforge.controllers.serving import plan as serving_plan


def test_the_storage_class_comes_from_the_command_line_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_STORAGE_CLASS, raising=False)
    assert parser().parse_args([]).storage_class == ""
    monkeypatch.setenv(ENV_STORAGE_CLASS, "team-hyperdisk")
    assert parser().parse_args([]).storage_class == "team-hyperdisk"
    assert parser().parse_args(["--storage-class", "mine"]).storage_class == "mine"


def claims(observed: serving_plan.Observed) -> list[dict[str, Any]]:
    target = serving_plan.plan_children(observed).target
    assert target is not None
    return [o for o in target.objects if o["kind"] == "PersistentVolumeClaim"]


def test_serving_claims_take_the_operators_storage_class(operator_defaults: Any) -> None:
    observed = serving_plan.Observed(
        namespace="team-a",
        name="chat",
        uid="u1",
        generation=1,
        # A model disk (a streamed model has no claim, and its XLA cache is node-local).
        spec={"model": {"uri": "gs://b/merged"}, "serviceAccountName": "vllm", "modelStorage": {"medium": "Disk"}},
        status=api.ServingDeploymentStatus(),
    )
    operator_defaults(storage_class="team-hyperdisk")
    assert claims(observed) and all(c["spec"]["storageClassName"] == "team-hyperdisk" for c in claims(observed))
    operator_defaults()
    assert all("storageClassName" not in c["spec"] for c in claims(observed))
