"""The ServingDeployment controller's wiring on the runtime, without a cluster: a listener that comes after the
first LIST hears the store, a kind installed later says so, the echo of its own status write asks for no
reconcile, and a child it just created asks for none either. (Against a real apiserver:
tests/operator/controllers/serving/test_servingdeployment.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tpuforge.api import REFRESH_IMAGES_ANNOTATION
from tpuforge.api.constants import SERVING_KIND
from tpuforge.controllers.runtime.informer import Informer
from tpuforge.controllers.runtime.snapshot import Snapshot, snapshot
from tpuforge.controllers.serving.children import child_view, deployment_view
from tpuforge.controllers.serving.controller import ServingDeploymentController


def informer(heard: list[Any], on_served: Any = None) -> Informer[str, int]:
    return Informer(
        api_version="v1",
        kind="Pod",
        label_selector="",
        namespaces=["ns"],
        view=lambda obj: int(obj["v"]),
        owner=lambda obj: obj.get("owner"),
        on_change=lambda *change: heard.append(change),
        on_served=on_served,
    )


def test_a_late_listener_hears_the_store_and_a_kind_served_later_is_announced() -> None:
    async def scenario() -> tuple[Any, ...]:
        served: list[bool] = []
        inf = informer([], on_served=lambda: served.append(True))
        inf._replace("ns", [], False)  # 404: the CRD is not installed
        before = list(served)
        inf._replace("ns", [("u1", "a", 1, "ns")])  # installed since
        late: list[Any] = []
        inf.listen(lambda *change: late.append(change))
        return before, served, late, inf.owners()

    before, served, late, owners = asyncio.run(scenario())
    assert (before, served, late, owners) == ([], [True], [("a", None, 1)], ["a"])


def sdep(rv: str, status: dict[str, Any] | None = None) -> Snapshot:
    meta = {"namespace": "ns", "name": "chat", "uid": "u1", "generation": 1, "resourceVersion": rv}
    body = {"metadata": meta, "spec": {"model": {"uri": "gs://m"}}, "status": status or {}}
    return snapshot(body, SERVING_KIND, (REFRESH_IMAGES_ANNOTATION,))


def new_controller() -> ServingDeploymentController:
    """A controller with an informer of FineTuneJobs of its own, unstarted."""
    ftjs: Informer[Any, Any] = Informer(
        api_version="tpuforge.dev/v1alpha1",
        kind="FineTuneJob",
        label_selector="",
        namespaces=None,
        view=lambda o: o,
        owner=lambda o: None,
        on_change=lambda *_: None,
    )
    return ServingDeploymentController(ftjs)


def test_the_echo_of_its_status_write_and_its_own_new_children_ask_for_no_reconcile() -> None:
    async def scenario() -> tuple[Any, ...]:
        controller = new_controller()
        requested: list[Any] = []
        controller.harness.queue.request = lambda key, delay=0.0: requested.append(key)  # type: ignore[method-assign]
        store = controller.servingdeployments
        store._put("u1", ("ns", "chat"), sdep("1"), "ns")  # new: reconciled
        written = {"metadata": {"resourceVersion": "2"}, "status": {"phase": "Pending"}}
        controller.harness.written.record(("ns", "chat"), "1", written)
        # Until the echo arrives, the reconcile reads what it wrote.
        current = controller.harness.current(("ns", "chat"))
        store._put("u1", ("ns", "chat"), sdep("2", {"phase": "Pending"}), "ns")  # the echo
        service = child_view({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": "ns"}})
        controller.child_changed(("ns", "chat"), None, service)  # created by the reconcile
        controller.child_changed(("ns", "chat"), service, None)  # deleted by someone: made again
        dep = deployment_view({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat-vllm"}})
        controller.child_changed(("ns", "chat"), dep, {**dep, "status": {"readyReplicas": 1}})
        return current, requested

    current, requested = asyncio.run(scenario())
    assert current is not None
    assert (current.status, current.resource_version) == ({"phase": "Pending"}, "2")
    assert requested == [("ns", "chat")] * 3


class RecordingApi:
    """Creates that take a moment, each one's start and end recorded in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.log.append(("start", obj["kind"]))
        await asyncio.sleep(0.01)
        self.log.append(("end", obj["kind"]))
        return obj


def child(kind: str, name: str = "chat") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}}


def test_a_new_objects_children_are_made_in_one_round_a_known_ones_deployment_after_the_rest() -> None:
    async def scenario(known: bool) -> list[tuple[str, str]]:
        controller = new_controller()
        api = RecordingApi()
        controller.harness._api = api  # type: ignore[assignment]
        if known:  # a claim of its name in memory (its own, or a same-named predecessor's)
            controller.children.claims._put("c1", ("ns", "chat"), child_view(child("PersistentVolumeClaim", "x")), "ns")
        target = SimpleNamespace(
            objects=[
                child("PersistentVolumeClaim"),
                child("Service"),
                child("PodDisruptionBudget"),
                child("Deployment"),
            ],
            monitors=[],
        )
        applied = await controller.apply(("ns", "chat"), target)  # type: ignore[arg-type]
        assert applied["kind"] == "Deployment"
        return api.log

    new, known = asyncio.run(scenario(False)), asyncio.run(scenario(True))
    # New: every create starts before the first one ends (one apiserver latency).
    assert [event for event, _ in new] == ["start"] * 4 + ["end"] * 4
    # Known: the Deployment only once the claim, Service and budget exist.
    assert known.index(("start", "Deployment")) > max(
        known.index(("end", k)) for k in ("PersistentVolumeClaim", "Service")
    )
