"""The informer's store: views grouped by owner, changes reported once, and a new LIST drops what is gone.
(Its LIST and WATCH against a real apiserver run in the integration tests.)"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from tests.fixtures.finetune.queue import NO_QUOTA, condition, workload
from tests.fixtures.finetune.world import raw_spec
from tpuforge import api
from tpuforge.controllers.finetune.children import JobView, config_view, job_view, pod_view, workload_view
from tpuforge.controllers.finetune.controller import FineTuneJobController, fresh, owner_key, workload_key
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.snapshot import snapshot
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_training import train_job


def make(changed: list[str]) -> Informer[str, int]:
    return Informer(
        api_version="v1",
        kind="Pod",
        label_selector="a",
        namespaces=["ns"],
        view=lambda obj: int(obj["v"]),
        owner=lambda obj: obj.get("owner"),
        on_change=lambda owner, before, after: changed.append(owner),
    )


def test_views_are_grouped_by_owner_and_only_changes_are_reported() -> None:
    async def scenario() -> tuple[Any, ...]:
        changed: list[str] = []
        inf = make(changed)
        inf._replace("ns", [("u1", "a", 1, "ns"), ("u2", "a", 2, "ns"), ("u3", "b", 3, "ns")])
        first = (sorted(inf.get("a")), inf.get("b"), sorted(changed))
        changed.clear()
        inf._put("u1", "a", 1, "ns")  # same view: nothing to do
        inf._put("u2", "a", 5, "ns")
        inf._put("u3", "b", None, "ns")  # deleted
        inf._put("u9", None, 1, "ns")  # not a child of anyone
        return first, sorted(inf.get("a")), inf.get("b"), changed, len(inf)

    first, a, b, changed, size = asyncio.run(scenario())
    assert first == ([1, 2], (3,), ["a", "a", "b"])
    assert (a, b, changed, size) == ([1, 5], (), ["a", "b"], 2)


def test_a_listener_hears_every_change_after_the_owner_and_no_echo() -> None:
    async def scenario() -> list[tuple[str, Any, Any]]:
        heard: list[tuple[str, Any, Any]] = []
        inf = make([])
        inf.listen(lambda owner, before, after: heard.append((owner, before, after)))
        inf._put("u1", "a", 1, "ns")
        inf._put("u1", "a", 1, "ns")  # same view: nobody hears it
        inf._put("u1", "a", 2, "ns")
        inf._put("u1", "a", None, "ns")
        return heard

    assert asyncio.run(scenario()) == [("a", None, 1), ("a", 1, 2), ("a", 2, None)]


def test_a_new_list_drops_what_disappeared_meanwhile_and_signals_ready() -> None:
    async def scenario() -> tuple[Any, ...]:
        changed: list[str] = []
        inf = make(changed)
        inf._replace("ns", [("u1", "a", 1, "ns"), ("u2", "b", 2, "ns")])
        ready = inf._ready.is_set()
        changed.clear()
        inf._replace("ns", [("u1", "a", 1, "ns")])  # u2 was deleted while the watch was down
        return ready, inf.get("a"), inf.get("b"), changed

    ready, a, b, changed = asyncio.run(scenario())
    assert ready
    assert (a, b, changed) == ((1,), (), ["b"])


def test_moving_a_child_to_another_owner_updates_both() -> None:
    async def scenario() -> tuple[Any, ...]:
        changed: list[str] = []
        inf = make(changed)
        inf._put("u1", "a", 1, "ns")
        inf._put("u1", "b", 1, "ns")
        return inf.get("a"), inf.get("b"), changed

    assert asyncio.run(scenario()) == ((), (1,), ["a", "a", "b"])


def test_a_child_as_it_was_just_created_asks_for_no_reconcile() -> None:
    new_job = JobView("j-train-0", "trainer", 0, complete=False, failed=False, failure="", deleting=False)
    assert fresh(new_job)
    assert not fresh(JobView("j-train-0", "trainer", 0, complete=True, failed=False, failure="", deleting=False))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "trainer"}]}, "status": {"phase": "Pending"}}
    assert fresh(pod_view(pod))
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    assert not fresh(pod_view({**pod, "status": {"phase": "Pending", "conditions": [unschedulable]}}))
    assert not fresh(pod_view({**pod, "status": {"phase": "Failed"}}))
    assert fresh(config_view({"metadata": {"name": "c"}, "data": {}}))


def test_a_job_kueue_created_suspended_asks_for_a_reconcile() -> None:
    """Its Workload may be in memory before it: the FineTuneJob must look again once the Job is there."""
    queued = JobView("j-train-0", "trainer", 0, complete=False, failed=False, failure="", deleting=False)
    assert not fresh(dataclasses.replace(queued, suspended=True))


def test_a_workload_reaches_the_finetunejob_that_owns_its_job() -> None:
    job = train_job(owner("ns", "sft", "ftj-uid"), api.validate_finetune(raw_spec(queueName="tpu")), 0)
    job["metadata"]["uid"] = "job-uid"
    job["spec"]["suspend"] = True  # as Kueue's webhook leaves it

    async def scenario() -> tuple[list[Any], Any]:
        controller = FineTuneJobController(["ns"])
        requested: list[Any] = []
        controller.harness.queue.request = lambda key, delay=0.0: requested.append(key)  # type: ignore[method-assign]
        controller.jobs._put("job-uid", owner_key(job), job_view(job), "ns")
        mine = workload(job, "job-uid", [condition("QuotaReserved", "False", "Pending", NO_QUOTA)])
        theirs = workload({**job, "metadata": {**job["metadata"], "name": "other"}}, "other-uid")
        controller.workloads._put("w1", workload_key(mine), workload_view(mine), "ns")
        controller.workloads._put("w2", workload_key(theirs), workload_view(theirs), "ns")
        body = {"metadata": {"namespace": "ns", "name": "sft", "uid": "ftj-uid"}, "spec": {}, "status": {}}
        seen = controller.observe(("ns", "ftj-uid"), snapshot(body))
        return requested, seen.workloads

    requested, workloads = asyncio.run(scenario())
    assert requested == [("ns", "ftj-uid"), ("ns", "ftj-uid")]  # the Job's arrival, then its Workload's
    assert [(w.owner_uid, w.reason) for w in workloads] == [("job-uid", "Pending")]
