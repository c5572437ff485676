"""The operator's cluster profile (--cluster-profile): on GKE Autopilot a FineTuneJob or ServingDeployment whose
node selectors name a node pool fails with InvalidSpec naming the field, and creates nothing; the same spec runs
on a Standard cluster. (What the Autopilot profile renders: tests/operator/manifests/test_autopilot.py.)"""

from __future__ import annotations

from typing import Any

from tests.fixtures.finetune.world import World, raw_spec
from tpuforge import api
from tpuforge.api.constants import GKE_NODEPOOL
from tpuforge.api.finetune_reasons import FAILED
from tpuforge.controllers.serving import plan as serving_plan

POOL = {GKE_NODEPOOL: "v5p-pool"}


def test_a_finetune_job_selecting_a_node_pool_fails_on_autopilot_and_creates_nothing(operator_defaults: Any) -> None:
    operator_defaults(cluster_profile="autopilot")
    w = World(raw_spec(merge={"nodeSelector": POOL}))
    p = w.step()
    assert p.create == []
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "InvalidSpec"
    assert f"spec.merge.nodeSelector[{GKE_NODEPOOL}]" in cond.message and "Autopilot" in cond.message


def test_the_same_finetune_job_runs_on_a_standard_cluster(operator_defaults: Any) -> None:
    operator_defaults(cluster_profile="standard")
    w = World(raw_spec(merge={"nodeSelector": POOL}))
    assert w.step().create
    assert w.phase() != api.FineTunePhase.FAILED


def serving(selector: dict[str, str]) -> serving_plan.Observed:
    return serving_plan.Observed(
        namespace="team-a",
        name="chat",
        uid="u1",
        generation=1,
        spec={
            "model": {"uri": "gs://b/merged"},
            "serviceAccountName": "vllm",
            "tpu": {"scheduling": {"nodeSelector": selector}},
        },
        status=api.ServingDeploymentStatus(),
    )


def test_a_serving_deployment_selecting_a_node_pool_fails_on_autopilot(operator_defaults: Any) -> None:
    operator_defaults(cluster_profile="autopilot")
    p = serving_plan.plan_children(serving(POOL))
    assert p.target is None and p.status.phase == api.ServingPhase.FAILED
    ready = next(c for c in p.status.conditions if c.type == "Ready")
    assert ready.reason == "InvalidSpec" and f"spec.tpu.scheduling.nodeSelector[{GKE_NODEPOOL}]" in ready.message
    operator_defaults(cluster_profile="standard")
    assert serving_plan.plan_children(serving(POOL)).target is not None
