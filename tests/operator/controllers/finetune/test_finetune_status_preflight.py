"""The preflight's decisions, on the simulated cluster of the planner tests: the CPU Job before the first
attempt, its report in the status, the training that follows at once when the step fits, the job that fails
without a TPU when it does not, and the Job's own failures."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.fixtures.finetune.preflight import JOB, preflight_pod, report
from tests.fixtures.finetune.world import NAME, World, raw_spec, train
from tpuforge import api
from tpuforge.api.constants import CONFIG_FILE, TPU_RESOURCE
from tpuforge.controllers.finetune.plan import FAILED, plan, status_patch
from tpuforge.manifests import preflight as mp
from tpuforge.manifests.finetune_common import owner

PREFLIGHT = "Preflight"


def preflight_world() -> World:
    return World(raw_spec(preflight={"enabled": True}))


def test_the_preflight_runs_first_on_a_cpu_node_and_training_follows_when_it_fits() -> None:
    w = preflight_world()
    p = w.step()
    kinds = [o["kind"] for o in p.create]
    assert kinds == ["Role", "RoleBinding", "ConfigMap", "Job"]
    job = p.create[-1]
    assert job["metadata"]["name"] == JOB
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:3] == ["python", "-m", "tpuforge_workloads.preflight"]
    assert "--slice" in container["command"] and "v5p-8" in container["command"]
    # A CPU node: no TPU resource, no TPU node selector or toleration.
    assert TPU_RESOURCE not in json.dumps(container["resources"])
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert w.phase() == api.FineTunePhase.PREFLIGHT and w.status.attempt is None
    assert w.condition(PREFLIGHT).status == "False" and w.condition(PREFLIGHT).reason == "Compiling"
    assert w.events == [("Normal", "Preflight", "compiling the step for v5p-8 on CPU")]

    preflight_pod(w, "Running")
    w.step()
    assert "is compiling the train step on node" in w.condition(PREFLIGHT).message

    preflight_pod(w, "Succeeded", exit_code=0, message=report())
    p = w.step()
    assert w.status.preflight is not None
    pf = w.status.preflight.to_wire()
    assert pf["fits"] is True and pf["topology"] == "v5p:2x2x1" and pf["hbmPerChipGiB"] == 31.2
    assert pf["hbmCapacityGiB"] == 95.0 and pf["tflopsPerStep"] == 1234.0
    assert pf["estimatedTokensPerSecond"] == 2900 and pf["estimatedSeconds"] == 7800.0
    assert pf["estimatedUSD"] == 41.2 and pf["compileSeconds"] == 95.3
    assert pf["message"] == "fits: 31.2 of 95 GiB per chip; ~2,900 tok/s at 8% MFU"
    cond = w.condition(PREFLIGHT)
    assert cond.status == "True" and cond.reason == "Fits" and "v5p:2x2x1 in 95 s" in cond.message
    assert ("Normal", "Preflight", "fits 31.2/95 GiB/chip; ~2,900 tok/s") in w.events
    # The first attempt starts in the same reconcile.
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Job"] == [train(0)]
    assert w.phase() == api.FineTunePhase.PENDING and w.status.attempt == 0
    # Before a trainer runs, the ETA and Cost columns show the preflight's estimates, marked as such.
    assert w.status.progress is not None and w.status.progress.eta_display == "~2h10m (est)"
    assert w.status.cost is not None and w.status.cost.estimated_usd_display == "~$41.20 (est)"

    w.pod(train(0), "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    assert w.status.progress.eta_display is None  # the trainer's own ETA takes over once it reports
    assert w.status.cost.estimated_usd_display is not None and "est" not in w.status.cost.estimated_usd_display


def test_a_passed_preflight_is_not_run_again_after_a_restart() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Succeeded", exit_code=0, message=report())
    w.step()
    # A new operator process: the status it reads is all it knows; the preflight's Job and pod are gone.
    w.jobs.pop(JOB)
    w.pods.clear()
    p = plan(w.observed(), w.now)
    assert not any(o["metadata"]["name"].startswith(JOB) for o in p.create)
    assert p.status.attempt == 0 and p.status.preflight == w.status.preflight


def trainer_remat(created: list[dict[str, Any]], attempt: int = 0) -> object:
    """The remat of the trainer's config in the attempt's ConfigMap among `created`."""
    cm = next(o for o in created if o["kind"] == "ConfigMap" and o["metadata"]["name"] == train(attempt))
    return json.loads(cm["data"][CONFIG_FILE])["training"]["remat"]


@pytest.mark.parametrize(
    ("written", "chosen", "runs"),
    [(None, False, False), (None, True, True), (True, False, True), (False, True, False)],
)
def test_the_attempt_trains_with_the_preflight_s_remat_where_the_spec_leaves_it_unset(
    written: bool | None, chosen: bool, runs: bool
) -> None:
    training: dict[str, Any] = {"maxSeqLen": 3072, "maxSteps": 1000, "warmupSteps": 10}
    if written is not None:
        training["remat"] = written
    w = World(raw_spec(preflight={"enabled": True}, training=training))
    w.step()
    preflight_pod(w, "Succeeded", exit_code=0, message=report(remat=chosen))
    p = w.step()
    assert w.status.preflight is not None and w.status.preflight.remat is chosen
    assert trainer_remat(p.create) is runs
    said = [text for _, reason, text in w.events if reason == "Preflight" and text.startswith("fits")]
    # The Event says "remat off" where the attempts train without it (the speed gives way in its line).
    assert said == ["fits 31.2/95 GiB/chip; " + ("~2,900 tok/s" if runs else "remat off")]


def test_without_a_preflight_an_unset_remat_trains_with_remat_on() -> None:
    w = World(raw_spec())
    assert trainer_remat(w.step().create) is True


def test_a_job_that_does_not_fit_fails_with_the_fixes_and_uses_no_tpu() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Failed", exit_code=3, message=report(fits=False))
    p = w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    assert not any(o["kind"] == "Job" for o in p.create) and train(0) not in w.jobs
    cond = w.condition(FAILED)
    assert cond.reason == "DoesNotFit"
    assert "does not fit the chips: at least 120.5 of 95 GiB per chip" in cond.message
    assert "to fit: turn on spec.training.remat; or use a larger slice" in cond.message
    assert w.status.preflight is not None and w.status.preflight.fits is False
    assert w.status.preflight.fixes == ["turn on spec.training.remat", "use a larger slice (spec.tpu.slice)"]
    assert w.events[-1] == ("Warning", "Failed", "does not fit 120.5/95 GiB/chip")
    assert w.status.attempts == [] and w.status.progress is None


# What the Job controller writes when the preflight Job's podFailurePolicy ends it at the pod's exit code.
POLICY_FAILURE = (
    f"PodFailurePolicy: Container preflight for pod team-a/{JOB}-pod failed with exit code {{code}} matching "
    "FailJob rule at index 0"
)


def failed_by_policy(w: World, exit_code: int) -> None:
    w.jobs[JOB] = replace(w.jobs[JOB], failed=True, failure=POLICY_FAILURE.format(code=exit_code))


def test_a_misfit_that_fails_the_job_through_its_pod_failure_policy_still_fails_does_not_fit() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Failed", exit_code=3, message=report(fits=False))
    failed_by_policy(w, 3)  # the Job fails with the pod, at once: no second pod
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "DoesNotFit" and "to fit: turn on spec.training.remat" in cond.message
    assert w.condition(PREFLIGHT).reason == "DoesNotFit"
    assert w.status.preflight is not None and w.status.preflight.fits is False
    assert train(0) not in w.jobs


def test_a_refused_config_that_fails_the_job_through_its_pod_failure_policy_fails_invalid_config() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Failed", exit_code=2, message="Bad config: model.uri: no config.json")
    failed_by_policy(w, 2)
    w.step()
    cond = w.condition(FAILED)
    assert cond.reason == "InvalidConfig" and "no config.json" in cond.message


def test_a_disrupted_preflight_pod_is_replaced_by_the_job_and_does_not_fail_the_job() -> None:
    w = preflight_world()
    w.step()
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    preflight_pod(w, "Failed", name=f"{JOB}-a", exit_code=143, conditions=[disrupted])
    w.step()
    assert w.phase() == api.FineTunePhase.PREFLIGHT  # the Job's policy ignores it and starts another pod
    preflight_pod(w, "Succeeded", name=f"{JOB}-b", exit_code=0, message=report())
    w.step()
    assert w.condition(PREFLIGHT).reason == "Fits" and w.status.attempt == 0


def test_an_infrastructure_failure_is_retried_by_the_job_then_fails_the_job_saying_why() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Failed", exit_code=1, message="OSError: gs://b/models/gemma4-31b/config.json: 503")
    w.step()
    assert w.phase() == api.FineTunePhase.PREFLIGHT  # the Job controller starts another pod
    w.job_done(JOB, complete=False)
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "PreflightFailed"
    assert f"the preflight Job {JOB} failed after 3 tries" in cond.message and "503" in cond.message
    assert "spec.preflight.enabled: false" in cond.message
    assert train(0) not in w.jobs


def test_a_config_the_preflight_refuses_fails_at_once() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Failed", exit_code=2, message="Bad config: model.uri: no config.json")
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "InvalidConfig" and "no config.json" in cond.message


def test_an_unreadable_report_fails_the_job_saying_so() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Succeeded", exit_code=0, message="compiled!")
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED
    cond = w.condition(FAILED)
    assert cond.reason == "PreflightFailed" and "not JSON" in cond.message


def test_suspending_during_the_preflight_stops_it_and_resuming_runs_it_again() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Running")
    w.step()
    w.spec["runPolicy"] = {"suspend": True}
    w.generation += 1
    p = w.step()
    assert [r.name for r in p.delete] == [JOB]
    assert w.phase() == api.FineTunePhase.SUSPENDED
    w.pods.clear()
    w.spec["runPolicy"] = {"suspend": False}
    w.generation += 1
    p = w.step()
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Job"] == [JOB]
    assert w.phase() == api.FineTunePhase.PREFLIGHT and w.status.attempt is None


def test_switching_the_preflight_off_while_it_runs_stops_it_and_starts_training() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Running")
    w.step()
    w.spec["preflight"] = {"enabled": False}
    w.generation += 1
    p = w.step()
    assert [r.name for r in p.delete] == [JOB]
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Job"] == [train(0)]
    assert w.phase() == api.FineTunePhase.PENDING
    assert w.condition(PREFLIGHT).reason == "Skipped"


def test_the_preflight_config_is_the_first_attempts_without_the_job_reference() -> None:
    spec = api.validate_finetune(raw_spec(preflight={"enabled": True, "nodeSelector": {"pool": "cpu"}}))
    o = owner("team-a", NAME, "uid-1")
    cm, job = mp.preflight_objects(o, spec)[-2:]
    cfg = json.loads(cm["data"]["config.json"])
    assert cfg["modelUri"] == "gs://b/models/gemma4-31b" and cfg["training"]["maxSeqLen"] == 3072
    assert cfg.get("job") is None and cfg["mesh"] == {"fsdp": 1, "tp": 4}
    # The compile cache the trainer reads: the preflight stores the step it compiled there.
    assert cfg["compileCacheUri"] == "gs://b/jobs/gemma-verilog/checkpoints/compile-cache"
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # By default the preflight compiles small decoders and extrapolates; wholeStep compiles the run's step.
    assert "--whole" not in pod["containers"][0]["command"]
    whole = api.validate_finetune(raw_spec(preflight={"enabled": True, "wholeStep": True}))
    command = mp.preflight_objects(o, whole)[-1]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "tpuforge_workloads.preflight"] and "--whole" in command


def test_reconciling_a_running_preflight_again_changes_nothing() -> None:
    w = preflight_world()
    w.step()
    preflight_pod(w, "Running")
    w.step()
    before = w.status.model_copy(deep=True)
    p = plan(w.observed(), w.now)
    assert p.create == [] and p.delete == [] and p.events == []
    assert status_patch(before, p.status) == {}
