"""The FineTuneJob decisions on a multi-host slice (a JobSet per attempt), on the simulated cluster of
test_finetune_status_plan: one pod per host; a preemption of any host is one preemption of the job, a failure
of any host one failure; status.attempts names every host's pod; a cluster without JobSet gets a condition
that says what to install, and nothing is created."""

from __future__ import annotations

from tests.fixtures.finetune.multihost import HOSTS, Slice, running, train
from tests.fixtures.finetune.world import NAME, raw_spec
from tpuforge import api
from tpuforge.api.constants import (
    EXIT_PREEMPTED,
    JOBSET_API_VERSION,
    JOBSET_KIND,
)
from tpuforge.controllers.finetune.children import JobView, jobset_view
from tpuforge.controllers.finetune.plan import TRAINING, ChildRef
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_training import train_workload


def test_an_attempt_is_a_jobset_and_training_starts_when_every_host_runs() -> None:
    w = Slice()
    p = w.step()
    assert [o["kind"] for o in p.create] == ["Role", "RoleBinding", "ConfigMap", "JobSet"]
    assert w.events[0][1:] == ("Created", "training on v5p-16 (2 hosts)")
    w.host(train(0), 0, "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.PENDING  # host 1 has not started yet
    w.host(train(0), 1, "Running")
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING
    a = w.status.attempts[0]
    assert a.job_name == train(0)
    assert a.pods == [f"{train(0)}-trainer-0-0-x", f"{train(0)}-trainer-0-1-x"]
    assert "gke-v5p-16-0, gke-v5p-16-1" in w.condition(TRAINING).message
    for h in range(HOSTS):
        w.host(train(0), h, "Succeeded", exit_code=0)
    w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    assert w.status.attempts[0].outcome == "Succeeded"


def test_the_attempt_names_its_hosts_pods_in_host_order_whichever_started_first() -> None:
    w = Slice()
    w.step()
    w.host(train(0), 1, "Running")
    w.step()
    w.host(train(0), 0, "Running")
    w.step()
    assert w.status.attempts[0].pods == [f"{train(0)}-trainer-0-0-x", f"{train(0)}-trainer-0-1-x"]


def test_one_host_done_is_not_the_attempt_done() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    w.host(train(0), 1, "Succeeded", exit_code=0)
    w.step()
    assert w.phase() == api.FineTunePhase.TRAINING


def test_a_preempted_host_is_one_preemption_and_the_event_names_the_host_and_node() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByKubelet", "message": "Spot"}
    # Host 0 checkpointed with its peer (exit 83); host 1 is the one whose VM was reclaimed.
    w.host(train(0), 0, "Failed", exit_code=EXIT_PREEMPTED, message="Preempted: checkpoint at step 40")
    w.host(train(0), 1, "Failed", exit_code=EXIT_PREEMPTED, message="Preempted", conditions=[disrupted])
    p = w.step()
    assert w.status.restarts == api.Restarts(failures=0, preemptions=1)
    assert w.status.attempt == 1 and w.status.attempts[0].outcome == "Preempted"
    kind, _, message = next(e for e in w.events if e[1] == "Preempted")
    assert kind == "Warning"
    assert message == "host 1/2 preempted on gke-v5p-16-1"
    cond = next(c for c in w.status.conditions if c.type == TRAINING)
    assert f"host 1 of 2 (pod {train(0)}-trainer-0-1-x on node gke-v5p-16-1)" in cond.message
    assert "attempt 1 resumes" in cond.message
    assert [o["kind"] for o in p.create][-1] == "JobSet"
    assert p.create[-1]["metadata"]["name"] == train(1)


def test_a_host_failing_while_its_peer_is_being_preempted_is_that_preemption() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "x"}
    w.host(train(0), 1, "Running", conditions=[disrupted])
    w.step()
    assert w.status.attempt == 0  # a disruption alone ends nothing: the host may still save its checkpoint
    w.host(train(0), 0, "Failed", exit_code=1, message="connection to the coordinator lost")
    w.step()
    assert w.status.restarts == api.Restarts(failures=0, preemptions=1)
    assert "host 1 of 2" in (w.status.attempts[0].message or "")


def test_the_preempted_host_is_named_even_when_its_peer_checkpointed_first() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByKubelet", "message": "x"}
    w.host(train(0), 1, "Running", conditions=[disrupted])
    w.host(train(0), 0, "Failed", exit_code=EXIT_PREEMPTED, message="Preempted: checkpoint at step 40")
    w.step()
    assert w.status.restarts == api.Restarts(failures=0, preemptions=1)
    assert "host 1/2" in next(m for _, r, m in w.events if r == "Preempted")


def test_a_vanished_host_outweighs_its_peers_failure() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    w.gone(f"{train(0)}-trainer-0-1-x")
    w.host(train(0), 0, "Failed", exit_code=1, message="peer lost")
    w.step()
    assert w.status.restarts == api.Restarts(failures=0, preemptions=1)


def test_a_failed_host_is_one_failure_and_the_running_peer_is_stopped() -> None:
    w = Slice(raw_spec(tpu={"slice": "v5p-16"}, runPolicy={"maxRestarts": 1}))
    w.step()
    running(w, 0)
    w.host(train(0), 1, "Failed", exit_code=1, message="FloatingPointError: loss is NaN")
    p = w.step()
    assert w.status.restarts == api.Restarts(failures=1, preemptions=0)
    assert ChildRef(JOBSET_API_VERSION, JOBSET_KIND, train(0)) in p.delete
    said = w.status.attempts[0].message or ""
    assert "host 1 of 2" in said and "loss is NaN" in said
    # The next attempt waits for host 0 to stop (it checkpoints on SIGTERM), then starts.
    assert not any(o["kind"] == JOBSET_KIND for o in p.create)
    w.host(train(0), 0, "Failed", exit_code=EXIT_PREEMPTED)
    p = w.step()
    assert p.create[-1]["metadata"]["name"] == train(1)
    running(w, 1)
    w.host(train(1), 0, "Failed", exit_code=1, message="again")
    w.step()
    assert w.phase() == api.FineTunePhase.FAILED and "maxRestarts=1" in w.condition("Failed").message


def test_a_vanished_host_pod_is_a_preemption() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    w.gone(f"{train(0)}-trainer-0-1-x")
    w.step()
    assert w.status.restarts == api.Restarts(failures=0, preemptions=1)


def test_a_failed_jobset_without_pods_is_a_failure() -> None:
    w = Slice()
    w.step()
    w.jobset_done(train(0), complete=False)
    w.step()
    assert w.status.restarts == api.Restarts(failures=1, preemptions=0)


def test_suspend_deletes_the_jobset() -> None:
    w = Slice()
    w.step()
    running(w, 0)
    w.spec = {**w.spec, "runPolicy": {"suspend": True}}
    p = w.step()
    assert p.delete == [ChildRef(JOBSET_API_VERSION, JOBSET_KIND, train(0))]
    assert w.phase() == api.FineTunePhase.SUSPENDED


def test_without_jobset_a_multi_host_job_waits_with_the_fix_and_creates_nothing() -> None:
    w = Slice(served=False)
    p = w.step()
    assert p.create == [] and p.requeue_after is not None
    assert w.phase() == api.FineTunePhase.PENDING
    cond = w.condition(TRAINING)
    assert cond.reason == "JobSetNotInstalled"
    assert "install JobSet (https://jobset.sigs.k8s.io/docs/installation/)" in cond.message
    assert w.reasons() == ["NoJobSet"]
    w.step()
    assert w.reasons() == ["NoJobSet"]  # said once
    w.served = True
    p = w.step()
    assert p.create[-1]["kind"] == JOBSET_KIND
    assert w.condition(TRAINING).reason == "Pending"


def test_single_host_jobs_need_no_jobset() -> None:
    w = Slice(raw_spec(), served=False)
    p = w.step()
    assert p.create[-1]["kind"] == "Job"


def test_jobset_view_reads_the_jobset_conditions() -> None:
    js = train_workload(owner("ns", NAME, "uid-1"), api.validate_finetune(raw_spec(tpu={"slice": "v5p-16"})), 0)
    view = jobset_view(js)
    assert view == JobView(train(0), "trainer", 0, False, False, "", False, JOBSET_KIND)
    js["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "x"}]}
    assert jobset_view(js).failed and jobset_view(js).failure == "FailedJobs: x"
    js["status"] = {"terminalState": "Completed"}
    assert jobset_view(js).complete
