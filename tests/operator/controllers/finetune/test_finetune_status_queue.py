"""Kueue (spec.queueName), on the simulated cluster of test_finetune_status_plan with Kueue's part played by
hand: its webhook creates every labelled Job or JobSet suspended, with a Workload owned by it (each one checked
against Kueue v0.17.0's published v1beta2 Workload schema); admission reserves quota and clears `suspend`.
While a Job waits, the job is Queued and says why in Kueue's words; its TPU time, cost and ETA stand still;
and no decision fights Kueue's `suspend`."""

from __future__ import annotations

import dataclasses
from typing import Any

from tests.fixtures.finetune import evaluation, multihost, preflight
from tests.fixtures.finetune.queue import NO_QUOTA, condition, workload
from tests.fixtures.finetune.world import NAME, World, raw_spec, train
from tpuforge import api
from tpuforge.api.constants import EXIT_PREEMPTED, JOBSET_KIND, LABEL_KUEUE_QUEUE
from tpuforge.controllers.finetune.children import WorkloadView, workload_view
from tpuforge.controllers.finetune.plan import Observed, Plan, plan, status_patch
from tpuforge.manifests.finetune_common import merge_job_name

QUEUE = "tpu"


class Kueue(World):
    """World, with Kueue's part: each Job or JobSet the plan creates with the queue label comes suspended, with
    a Workload (no conditions yet: Kueue's scheduler has not written to it); `pending`, `admit` and `evict`
    move it as Kueue's scheduler would."""

    def __init__(self, spec: dict[str, Any] | None = None):
        super().__init__(spec or raw_spec(queueName=QUEUE))
        self.workloads: dict[str, dict[str, Any]] = {}  # by the name of the Job or JobSet

    def observed(self) -> Observed:
        views = tuple(workload_view(w) for w in self.workloads.values())
        return dataclasses.replace(super().observed(), workloads=views)

    def step(self, seconds: float = 1.0) -> Plan:
        p = super().step(seconds)
        for obj in p.create:
            name = obj["metadata"]["name"]
            if LABEL_KUEUE_QUEUE in obj["metadata"]["labels"] and name not in self.workloads:
                uid = f"uid-{name}"
                self.jobs[name] = dataclasses.replace(self.jobs[name], uid=uid, suspended=True)
                self.workloads[name] = workload(obj, uid)
        for ref in p.delete:
            self.workloads.pop(ref.name, None)  # garbage-collected with its owner
        return p

    def conditions(self, job: str, *conditions: dict[str, Any]) -> None:
        self.workloads[job]["status"]["conditions"] = list(conditions)

    def pending(self, job: str, reason: str = "Pending", message: str = NO_QUOTA) -> None:
        self.conditions(job, condition("QuotaReserved", "False", reason, message))

    def admit(self, job: str) -> None:
        self.conditions(
            job,
            condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue tpuforge"),
            condition("Admitted", "True", "Admitted", "The workload is admitted"),
        )
        self.jobs[job] = dataclasses.replace(self.jobs[job], suspended=False)

    def evict(self, job: str) -> None:
        """Preempted by a higher-priority workload: suspended again, and back in the queue."""
        message = "Preempted to accommodate a workload (UID: 5e1d) due to prioritization in the ClusterQueue"
        self.conditions(
            job,
            condition("QuotaReserved", "False", "Preempted", message),
            condition("Admitted", "False", "NoReservation", "The workload has no reservation"),
            condition("Evicted", "True", "Preempted", message),
        )
        self.jobs[job] = dataclasses.replace(self.jobs[job], suspended=True)


def queued_condition(w: World) -> api.Condition:
    return w.condition("Queued")


def test_a_training_job_kueue_holds_is_queued_with_kueues_reason_and_costs_nothing() -> None:
    w = Kueue()
    p = w.step()
    assert [o["kind"] for o in p.create][-1] == "Job"
    w.pending(train(0))
    p = w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert p.create == [] and p.delete == []  # the suspended Job is Kueue's to release
    cond = queued_condition(w)
    assert (cond.status, cond.reason) == ("True", "Pending")
    assert cond.message.startswith(f"the training Job {train(0)} waits for Kueue to admit it (LocalQueue tpu)")
    assert NO_QUOTA in cond.message
    assert w.events[-1] == ("Normal", "Queued", "training waits in Kueue queue tpu")
    # Hours in the queue: no TPU time, no cost, no ETA; reconciling again changes nothing.
    w.step(3 * 3600)
    assert w.phase() == api.FineTunePhase.QUEUED and w.status.attempts[0].start_time is None
    assert w.status.cost is not None and (w.status.cost.tpu_hours, w.status.cost.estimated_usd_display) == (0, "$0.00")
    assert w.status.progress is None or w.status.progress.eta_display is None
    again = plan(w.observed(), w.now)
    assert status_patch(w.status, again.status) == {} and again.events == [] and again.create == []
    # Kueue's words change as the queue moves: the condition follows, without a new Event.
    w.pending(train(0), message=NO_QUOTA.replace("4 more", "2 more"))
    w.step()
    assert "2 more needed" in queued_condition(w).message and [e[1] for e in w.events].count("Queued") == 1

    w.admit(train(0))
    w.step()
    assert w.phase() == api.FineTunePhase.PENDING
    assert (queued_condition(w).status, queued_condition(w).reason) == ("False", "Admitted")
    w.pod(train(0), "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    assert w.reasons() == ["Created", "Queued", "Admitted", "Training"]
    w.step(3600)
    # TPU time from the pod's start: the three hours in the queue count for nothing.
    assert w.status.cost is not None and w.status.cost.tpu_hours is not None and 1 <= w.status.cost.tpu_hours < 1.01


def test_a_job_held_by_admission_checks_is_queued_and_one_kueue_has_not_looked_at_yet_not() -> None:
    w = Kueue()
    w.step()
    held = w.workloads.pop(train(0))  # suspended by Kueue's webhook; its Workload is not made yet
    w.step()
    assert w.phase() == api.FineTunePhase.PENDING
    w.workloads[train(0)] = held
    w.conditions(train(0))  # made, not yet looked at: Kueue admits one that fits within moments
    w.step()
    assert w.phase() == api.FineTunePhase.PENDING and "Queued" not in w.reasons()
    w.conditions(
        train(0),
        condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue tpuforge"),
        condition("Admitted", "False", "Pending", "The workload has not all admission checks ready"),
    )
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).reason == "Pending"
    assert "not all admission checks ready" in queued_condition(w).message
    w.conditions(train(0))  # its conditions gone again (requeued): still held, with no reason of its own
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).reason == "WaitingForAdmission"
    assert queued_condition(w).message.endswith("(LocalQueue tpu); nothing runs until then")


def test_the_merge_and_the_evaluation_wait_in_the_queue_too() -> None:
    w = Kueue(dict(evaluation.eval_spec(merged=True), queueName=QUEUE))
    w.step()
    w.admit(train(0))
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    w.pending(merge_job_name(NAME), message="couldn't assign flavors to pod set main: insufficient quota for memory")
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).message.startswith(f"the merge Job {merge_job_name(NAME)} waits for Kueue")
    assert w.status.progress is None or w.status.progress.eta_display is None
    w.admit(merge_job_name(NAME))
    w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    w.job_done(merge_job_name(NAME))
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    w.pending(evaluation.EVAL, reason="Inadmissible", message="LocalQueue tpu is stopped")
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    cond = queued_condition(w)
    assert cond.reason == "Inadmissible" and cond.message.endswith("LocalQueue tpu is stopped; nothing runs until then")
    w.admit(evaluation.EVAL)
    w.step()
    assert w.phase() == api.FineTunePhase.EVALUATING
    evaluation.eval_pod(w, "Succeeded", exit_code=0, message=evaluation.result())
    w.step()
    assert w.phase() == api.FineTunePhase.SUCCEEDED
    assert w.reasons() == [
        "Created",
        "Merging",
        "Queued",
        "Admitted",
        "Evaluating",
        "Queued",
        "Admitted",
        "Evaluated",
        "Succeeded",
    ]
    assert ("Normal", "Admitted", "Kueue admitted the evaluation") in w.events


def test_the_stage_a_job_waits_in_is_stored_and_one_queued_before_it_was_goes_back_by_its_conditions() -> None:
    w = Kueue(dict(evaluation.eval_spec(merged=True), queueName=QUEUE))
    w.step()
    w.pending(train(0))
    w.step()
    assert (w.phase(), w.status.queued_stage) == (api.FineTunePhase.QUEUED, api.FineTunePhase.PENDING)
    w.admit(train(0))
    w.step()
    assert (w.phase(), w.status.queued_stage) == (api.FineTunePhase.PENDING, None)
    w.pod(train(0), "Succeeded", exit_code=0)
    w.step()
    w.pending(merge_job_name(NAME))
    p = w.step()
    assert w.status.queued_stage == api.FineTunePhase.MERGING
    assert status_patch(api.FineTuneJobStatus(), p.status)["queuedStage"] == "Merging"
    # Queued by an operator that did not store the stage: the Merged condition still tells it.
    w.status = w.status.model_copy(update={"queued_stage": None})
    w.admit(merge_job_name(NAME))
    w.step()
    assert (w.phase(), w.status.queued_stage) == (api.FineTunePhase.MERGING, None)
    assert w.events[-1] == ("Normal", "Admitted", "Kueue admitted the merge")
    # Leaving the queue clears the field (a merge patch sets it to null).
    before = w.status.model_copy(update={"queued_stage": api.FineTunePhase.MERGING})
    assert status_patch(before, w.status) == {"queuedStage": None}


def test_the_preflight_waits_in_the_queue_and_its_estimates_show_while_training_waits() -> None:
    w = Kueue(raw_spec(preflight={"enabled": True}, queueName=QUEUE))
    w.step()
    w.pending(preflight.JOB, message="couldn't assign flavors to pod set main: insufficient quota for cpu")
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).message.startswith(f"the preflight Job {preflight.JOB} waits for Kueue")
    w.admit(preflight.JOB)
    w.step()
    assert w.phase() == api.FineTunePhase.PREFLIGHT
    preflight.preflight_pod(w, "Succeeded", exit_code=0, message=preflight.report())
    w.step()
    assert train(0) in w.jobs and w.phase() == api.FineTunePhase.PENDING
    w.pending(train(0))
    w.step(3600)
    assert w.phase() == api.FineTunePhase.QUEUED
    # The run's estimates, marked as such: no countdown, no cost so far.
    assert w.status.progress is not None and w.status.progress.eta_display == "~2h10m (est)"
    assert w.status.cost is not None and w.status.cost.estimated_usd_display == "~$41.20 (est)"
    assert w.status.cost.tpu_hours == 0


class KueueSlice(Kueue, multihost.Slice):
    """Kueue, on a multi-host slice: the attempt is a JobSet, queued whole."""


def test_a_multi_host_jobset_is_queued_whole_and_trains_once_admitted() -> None:
    w = KueueSlice(raw_spec(tpu={"slice": "v5p-16"}, queueName=QUEUE))
    w.step()
    jobset = multihost.train(0)
    assert w.jobs[jobset].kind == JOBSET_KIND and w.jobs[jobset].suspended
    w.pending(jobset)
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).message.startswith(f"the training JobSet {jobset} waits for Kueue")
    w.admit(jobset)
    multihost.running(w, 0)
    assert w.phase() == api.FineTunePhase.TRAINING
    assert w.reasons() == ["Created", "Queued", "Admitted", "Training"]


def test_an_eviction_by_kueue_resumes_as_the_next_attempt_and_removes_the_suspended_job() -> None:
    w = Kueue()
    w.step()
    w.admit(train(0))
    pod = w.pod(train(0), "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    w.evict(train(0))  # Kueue suspends the Job; the Job controller stops its pod (SIGTERM: a checkpoint)
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED and queued_condition(w).reason == "Preempted"
    w.pod(train(0), "Failed", name=pod, exit_code=EXIT_PREEMPTED, message="Preempted: checkpoint at step 40")
    p = w.step()
    # Left alone, Kueue would admit the old Job again and run a second trainer beside the next attempt's.
    assert [r.name for r in p.delete] == [train(0)]
    assert w.status.attempts[0].outcome == "Preempted" and w.status.attempt == 1
    assert w.status.restarts is not None and w.status.restarts.preemptions == 1
    w.pending(train(1))
    w.step()
    assert w.phase() == api.FineTunePhase.QUEUED
    assert queued_condition(w).message.startswith(f"the training Job {train(1)} waits")


def test_suspending_a_queued_job_removes_its_job_and_ends_queued() -> None:
    w = Kueue()
    w.step()
    w.pending(train(0))
    w.step()
    w.spec = {**w.spec, "runPolicy": {"suspend": True}}
    w.generation += 1
    p = w.step()
    assert [r.name for r in p.delete] == [train(0)]
    assert w.phase() == api.FineTunePhase.SUSPENDED
    assert (queued_condition(w).status, queued_condition(w).reason) == ("False", "NotQueued")


def test_a_workload_is_read_by_its_owner_and_kueues_conditions() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "labels": {LABEL_KUEUE_QUEUE: QUEUE}},
        "spec": {"parallelism": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }
    reserved = condition("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue tpuforge")
    admitted = condition("Admitted", "True", "Admitted", "The workload is admitted")
    assert workload_view(workload(job, "uid-j", [reserved, admitted])) == WorkloadView(
        name="job-j-3f2a1", owner_uid="uid-j", queue=QUEUE, admitted=True, reason="", message=""
    )
    view = workload_view(workload(job, "uid-j", [condition("QuotaReserved", "False", "Pending", NO_QUOTA)]))
    assert (view.admitted, view.reason, view.message) == (False, "Pending", NO_QUOTA)
    # Only a Job or JobSet that controls it names its owner.
    other = workload(job, "uid-j")
    other["metadata"]["ownerReferences"][0]["kind"] = "RayJob"
    assert workload_view(other).owner_uid == ""
