"""The preflight's Job: a misfit or a refused config ends it at once through its podFailurePolicy (no second
pod), a disrupted pod is not counted against backoffLimit, and the objects are valid Kubernetes objects."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.fixtures.finetune.world import raw_spec
from tpuforge import api
from tpuforge.api.constants import EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT
from tpuforge.manifests import preflight as mp
from tpuforge.manifests.finetune_common import owner

OWNER = owner("team-a", "gemma-verilog", "uid-1")


def preflight_objects(**preflight: Any) -> list[dict[str, Any]]:
    return mp.preflight_objects(OWNER, api.validate_finetune(raw_spec(preflight={"enabled": True, **preflight})))


def test_a_misfit_or_a_refused_config_fails_the_job_at_once_and_a_disruption_is_not_counted() -> None:
    job = preflight_objects()[-1]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # what podFailurePolicy requires
    assert [c["name"] for c in pod["containers"]] == [mp.PREFLIGHT_CONTAINER]
    assert job["spec"]["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": mp.PREFLIGHT_CONTAINER,
                "operator": "In",
                "values": [EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT],
            },
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    assert job["spec"]["backoffLimit"] == mp.PREFLIGHT_BACKOFF_LIMIT


@pytest.mark.parametrize("version", ["1.35.0", kubernetes_validate.latest_version()])
def test_the_preflight_objects_validate_against_the_kubernetes_schema(version: str) -> None:
    for obj in preflight_objects(nodeSelector={"pool": "cpu"}):
        kubernetes_validate.validate(obj, version, strict=True)
