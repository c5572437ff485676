"""Each object keeps the default images it was first given (status.images): an operator upgrade with new
defaults restarts no model server and changes no stage of a fine-tune under way; a ServingDeployment takes the
new ones when asked (annotation tpuforge.dev/refresh-images), and images a spec names always win."""

from __future__ import annotations

from typing import Any

from tests.fixtures.finetune.world import World, train
from tpuforge import api
from tpuforge.api.images import ImageDefaults
from tpuforge.controllers.serving import plan as serving_plan
from tpuforge.manifests.finetune_common import merge_job_name
from tpuforge.manifests.serving import FETCH_CONTAINER, VLLM_CONTAINER

OLD = ImageDefaults(registry="europe-docker.pkg.dev/ml/tpuforge", tag="0.1.0")
NEW = ImageDefaults(registry="europe-docker.pkg.dev/ml/tpuforge", tag="0.2.0")


def containers(obj: dict[str, Any]) -> dict[str, str]:
    pod = obj["spec"]["template"]["spec"]
    return {c["name"]: c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}


def test_a_finetune_under_way_keeps_its_images_through_an_operator_upgrade(operator_defaults: Any) -> None:
    operator_defaults(images=OLD)
    w = World()
    w.step()
    assert w.status.images is not None and w.status.images.merger == OLD.merger
    operator_defaults(images=NEW)  # the chart upgraded mid-training
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    merge = w.objects[("Job", merge_job_name(w.observed().name))]
    assert set(containers(merge).values()) == {OLD.merger}  # the next stage runs the code that trained
    assert w.status.images.trainer == OLD.trainer


def test_a_finetune_that_names_an_image_runs_it(operator_defaults: Any) -> None:
    operator_defaults(images=OLD)
    w = World()
    w.spec = {**w.spec, "images": {"merger": "me/merger:7"}}
    w.step()
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    assert set(containers(w.objects[("Job", merge_job_name(w.observed().name))]).values()) == {"me/merger:7"}


def observed(
    status: api.ServingDeploymentStatus, existing: dict[str, Any] | None = None, refresh: str | None = None
) -> serving_plan.Observed:
    return serving_plan.Observed(
        namespace="team-a",
        name="chat",
        uid="u1",
        generation=1,
        spec={"model": {"uri": "gs://b/merged"}, "serviceAccountName": "vllm"},
        status=status,
        existing=existing,
        refresh_images=refresh,
    )


def deployment_of(p: serving_plan.Plan) -> dict[str, Any]:
    assert p.target is not None
    return next(o for o in p.target.objects if o["kind"] == "Deployment")


def test_a_server_keeps_its_images_through_an_upgrade_until_a_rollout_is_asked_for(operator_defaults: Any) -> None:
    operator_defaults(images=OLD)
    first = serving_plan.plan_children(observed(api.ServingDeploymentStatus()))
    running = deployment_of(first)
    assert containers(running)[VLLM_CONTAINER] == OLD.serving
    assert first.status.images is not None and first.status.images.serving == OLD.serving

    operator_defaults(images=NEW)
    after = serving_plan.plan_children(observed(first.status, running))
    assert deployment_of(after) == running  # the same template: no pod restarts
    assert after.status.images == first.status.images

    rolled = serving_plan.plan_children(observed(after.status, running, refresh="2026-12-06"))
    images = containers(deployment_of(rolled))
    assert (images[VLLM_CONTAINER], images[FETCH_CONTAINER]) == (NEW.serving, NEW.model_fetch)
    assert rolled.status.images is not None and rolled.status.images.refresh == "2026-12-06"
    # Asked once: the next reconcile keeps what that rollout resolved, whatever the operator's defaults.
    operator_defaults(images=OLD)
    again = serving_plan.plan_children(observed(rolled.status, deployment_of(rolled), refresh="2026-12-06"))
    assert containers(deployment_of(again))[VLLM_CONTAINER] == NEW.serving


def test_a_server_from_before_images_were_recorded_keeps_what_its_pods_run(operator_defaults: Any) -> None:
    operator_defaults(images=OLD)
    running = deployment_of(serving_plan.plan_children(observed(api.ServingDeploymentStatus())))
    operator_defaults(images=NEW)
    p = serving_plan.plan_children(observed(api.ServingDeploymentStatus(), running))
    assert deployment_of(p) == running
    assert p.status.images is not None and p.status.images.serving == OLD.serving
