"""The controller harness both kinds run in, without a cluster: the echo of its own status write asks for no
reconcile, a 409 ends a reconcile as a conflict (not an error) and looks again soon, a deleted object is
forgotten by the run after it, and an object being deleted is left alone when the kind asks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tpuforge.controllers.runtime.controller import CONFLICT_RETRY_SECONDS, Controller
from tpuforge.controllers.runtime.snapshot import Snapshot, name_key, snapshot
from tpuforge.kube import client as kube_client

KIND = "HarnessTestKind"  # a label of its own: the counters are the process's


def body(rv: str, deleting: bool = False, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "a", "uid": "u1", "generation": 2, "resourceVersion": rv}
    meta["annotations"] = {"kept": "yes", "other": "no", **annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"x": 1}, "status": {"phase": "Running"}}


def count(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"kind": KIND}) or 0.0


class Kind:
    """A kind's side of the harness: what it was asked to reconcile and to forget."""

    def __init__(self, fails: BaseException | None = None, skip_deleting: bool = False):
        self.fails, self.reconciled, self.forgotten, self.requested = fails, [], [], []
        self.harness: Controller[tuple[str, str]] = Controller(
            KIND,
            self.reconcile,
            namespaces=["ns"],
            key=name_key,
            forget=lambda key, snap: self.forgotten.append((key, snap.uid)),
            annotations=("kept",),
            skip_deleting=skip_deleting,
        )
        self.harness.queue.request = lambda key, delay=0.0: self.requested.append(key)  # type: ignore[method-assign]

    async def reconcile(self, key: tuple[str, str], snap: Snapshot) -> float | None:
        self.reconciled.append((key, snap.resource_version, dict(snap.status)))
        if self.fails is not None:
            raise self.fails
        return 5.0

    def put(self, obj: dict[str, Any] | None) -> None:
        view = self.harness.objects._view(obj) if obj is not None else None  # type: ignore[arg-type]
        self.harness.objects._put("u1", ("ns", "a"), view, "ns")


def test_a_snapshot_keeps_only_the_annotations_its_kind_reads() -> None:
    snap = snapshot(body("1"), KIND, ("kept",))
    assert (snap.kind, snap.generation, snap.annotations) == (KIND, 2, {"kept": "yes"})
    assert snap.ref == {
        "apiVersion": "tpuforge.dev/v1alpha1",
        "kind": KIND,
        "metadata": {"namespace": "ns", "name": "a", "uid": "u1"},
    }


def test_the_echo_of_its_own_write_asks_for_nothing_and_the_reconcile_reads_the_write() -> None:
    async def scenario() -> Kind:
        kind = Kind()
        kind.put(body("1"))  # new: a reconcile
        kind.put(body("1", other="changed"))  # an annotation the kind does not read: nothing
        kind.harness.written.record(("ns", "a"), "1", {"metadata": {"resourceVersion": "2"}, "status": {"p": 1}})
        assert await kind.harness.reconcile(("ns", "a")) == 5.0  # reads its write, not the stale status
        kind.put({**body("2"), "status": {"p": 1}})  # the echo: nothing
        kind.put(body("3", kept="new"))  # someone else's change: a reconcile
        return kind

    kind = asyncio.run(scenario())
    assert kind.requested == [("ns", "a")] * 2
    assert kind.reconciled == [(("ns", "a"), "2", {"p": 1})]


def test_a_conflict_is_counted_as_such_and_looked_at_again_soon() -> None:
    conflict = kube_client.ApiException(status=409, reason="Conflict")
    conflict.body = json.dumps({"reason": "Conflict"})
    before = {n: count(n) for n in ("tpuforge_reconcile_total", "tpuforge_reconcile_conflicts_total")}
    errors = count("tpuforge_reconcile_errors_total")

    async def scenario() -> float | None:
        kind = Kind(fails=conflict)
        kind.put(body("1"))
        return await kind.harness.reconcile(("ns", "a"))

    assert asyncio.run(scenario()) == CONFLICT_RETRY_SECONDS
    assert {n: count(n) - v for n, v in before.items()} == {
        "tpuforge_reconcile_total": 1.0,
        "tpuforge_reconcile_conflicts_total": 1.0,
    }
    assert count("tpuforge_reconcile_errors_total") == errors


def test_any_other_failure_is_an_error_and_raised_for_the_queue_to_back_off() -> None:
    errors = count("tpuforge_reconcile_errors_total")

    async def scenario() -> None:
        kind = Kind(fails=kube_client.ApiException(status=500, reason="Internal"))
        kind.put(body("1"))
        await kind.harness.reconcile(("ns", "a"))

    with pytest.raises(kube_client.ApiException):
        asyncio.run(scenario())
    assert count("tpuforge_reconcile_errors_total") == errors + 1


def test_an_object_deleted_before_its_status_write_ends_the_reconcile_quietly() -> None:
    """The object goes between the read and the write (404): no error, no retry; its delete event follows."""

    class Gone:
        async def patch_status(self, ref: Any, patch: Any, resource_version: str) -> dict[str, Any]:
            raise kube_client.ApiException(status=404, reason="Not Found")

    errors = count("tpuforge_reconcile_errors_total")

    async def scenario() -> float | None:
        kind = Kind()

        async def writes(key: tuple[str, str], snap: Snapshot) -> float | None:
            await kind.harness.patch_status(key, snap, {"phase": "Ready"})
            return 5.0

        kind.harness._reconcile = writes
        kind.harness._api = Gone()  # type: ignore[assignment]
        kind.put(body("1"))
        return await kind.harness.reconcile(("ns", "a"))

    assert asyncio.run(scenario()) is None
    assert count("tpuforge_reconcile_errors_total") == errors


def test_a_deleted_object_is_forgotten_by_the_run_after_it_once() -> None:
    async def scenario() -> Kind:
        kind = Kind()
        kind.put(body("1"))
        kind.put(None)  # deleted: one more run asked
        await kind.harness.reconcile(("ns", "a"))
        await kind.harness.reconcile(("ns", "a"))  # a child's late event: nothing more to forget
        return kind

    kind = asyncio.run(scenario())
    assert kind.requested == [("ns", "a")] * 2
    assert (kind.reconciled, kind.forgotten) == ([], [(("ns", "a"), "u1")])


@pytest.mark.parametrize("skip", [True, False])
def test_an_object_being_deleted_is_reconciled_unless_the_kind_leaves_it_to_the_garbage_collector(
    skip: bool,
) -> None:
    async def scenario() -> Kind:
        kind = Kind(skip_deleting=skip)
        kind.put(body("1", deleting=True))
        await kind.harness.reconcile(("ns", "a"))
        return kind

    assert len(asyncio.run(scenario()).reconciled) == (0 if skip else 1)
