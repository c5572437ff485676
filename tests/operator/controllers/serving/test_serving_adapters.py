"""ServingDeployment adapters, the pure parts: which output each name serves (promotion), what one replica
needs done, the status and Events that follow, and the requeue that keeps loading adapters moving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tpuforge import api
from tpuforge.api import serving_reasons as sr
from tpuforge.api.constants import DEFAULT_VLLM_IMAGE
from tpuforge.api.serving import AdapterPhase, AdapterStatus
from tpuforge.controllers.runtime.snapshot import snapshot
from tpuforge.controllers.serving import adapters as sa
from tpuforge.controllers.serving.controller import adapter_requeue, model_view, referenced_jobs

BASE = "gs://models/gemma4-31b"
OLD = "gs://runs/old/adapter"
NEW = "gs://runs/new/adapter"


def spec(*adapters: dict[str, Any], **extra: Any) -> api.ServingDeploymentSpec:
    return api.validate_serving(
        {"model": {"uri": BASE}, "serviceAccountName": "vllm", "adapters": list(adapters), **extra}, "gemma4-31b"
    )


def job(
    phase: str = "Succeeded",
    adapter: str | None = NEW,
    passed: bool | None = None,
    evaluation: bool = True,
    model: str = "gemma4-31b",
    rank: int = 16,
    message: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "completionTime": "2026-12-03T08:00:00Z"}
    if adapter:
        status["outputs"] = {"adapterUri": adapter}
    if passed is not None:
        status["evaluation"] = {"passed": passed, "message": message}
    body: dict[str, Any] = {
        "metadata": {"name": "ft", "uid": "u1"},
        "spec": {"model": {"name": model}, "lora": {"rank": rank}},
        "status": status,
    }
    if evaluation:
        body["spec"]["evaluation"] = {"thresholds": {"maxLoss": 1.0}}
    return body


REF = {"name": "support", "fineTuneJobRef": {"name": "ft"}}
SERVED_OLD = AdapterStatus(name="support", uri=OLD, source="ft", revision="u0/t0", phase=AdapterPhase.READY)


def resolve(j: dict[str, Any] | None, previous: list[AdapterStatus] | None = None, **kw: Any) -> sa.DesiredAdapter:
    s = spec(REF, **kw)
    return sa.resolve_adapters(s, "gemma4-31b", {"ft": j}, previous or [])[0]


def test_a_uri_adapter_is_served_as_given() -> None:
    (d,) = sa.resolve_adapters(spec({"name": "a", "uri": NEW + "/"}), "gemma4-31b", {})
    assert (d.uri, d.source, d.refused, d.held_back) == (NEW, None, None, None)


def test_a_job_whose_evaluation_passed_is_promoted_with_its_revision() -> None:
    d = resolve(job(passed=True))
    assert (d.uri, d.source, d.revision, d.held_back) == (NEW, "ft", "u1/2026-12-03T08:00:00Z", None)


def test_a_failed_evaluation_keeps_the_previous_adapter_and_says_why() -> None:
    d = resolve(job(passed=False, message="loss 2.1 > maxLoss 1.0"), [SERVED_OLD])
    assert (d.uri, d.revision) == (OLD, "u0/t0")
    assert d.held_back is not None and d.held_back[0] == "EvaluationFailed"
    assert "loss 2.1 > maxLoss 1.0" in d.held_back[1] and OLD in d.held_back[1]


def test_a_failed_evaluation_with_nothing_served_before_serves_nothing() -> None:
    d = resolve(job(passed=False))
    assert d.uri is None and d.held_back is not None and d.held_back[0] == "EvaluationFailed"
    (st,) = sa.summarise([d], {}, 1)
    assert st.phase == AdapterPhase.FAILED and "failed its evaluation" in (st.message or "")


@pytest.mark.parametrize(
    ("j", "reason"),
    [
        (None, "FineTuneJobNotFound"),
        (job(phase="Training", adapter=None), "WaitingForJob"),
        (job(phase="Evaluating"), "WaitingForJob"),
        (job(passed=None), "WaitingForEvaluation"),
        (job(adapter=None, passed=True), "NoAdapter"),
    ],
)
def test_until_a_new_output_may_take_traffic_the_served_one_stays(j: dict[str, Any] | None, reason: str) -> None:
    d = resolve(j, [SERVED_OLD])
    assert d.uri == OLD and d.held_back is not None and d.held_back[0] == reason


def test_an_evaluation_without_a_verdict_holds_the_adapter_back_and_says_how_to_run_it_again() -> None:
    j = job()
    j["status"]["evaluation"] = {"result": "Error", "message": "EvaluationResultMissing: the pod is gone"}
    d = resolve(j, [SERVED_OLD])
    assert d.uri == OLD and d.held_back is not None and d.held_back[0] == "WaitingForEvaluation"
    assert "the pod is gone" in d.held_back[1] and "spec.evaluation.rerun" in d.held_back[1]


def test_promotion_defaults_follow_the_job_and_the_spec_overrides() -> None:
    # No evaluation on the job: promoted when it succeeds.
    assert resolve(job(evaluation=False)).uri == NEW
    # The spec may demand an evaluation the job never ran, or waive one it did.
    assert resolve(job(evaluation=False), promotion={"requireEvaluation": True}).uri is None
    assert resolve(job(passed=False), promotion={"requireEvaluation": False}).uri == NEW


def test_a_job_of_another_model_or_a_larger_rank_is_refused_for_that_adapter_only() -> None:
    s = spec(REF, {"name": "plain", "uri": OLD})
    other, plain = sa.resolve_adapters(s, "gemma4-31b", {"ft": job(model="gemma4-e4b", passed=True)})
    assert other.uri is None and other.refused is not None and "fine-tunes 'gemma4-e4b'" in other.refused
    assert plain.uri == OLD and plain.refused is None
    (big,) = sa.resolve_adapters(spec(REF), "gemma4-31b", {"ft": job(passed=True, rank=32)}, max_rank=16)
    assert big.refused is not None and "raise maxLoraRank to at least 32" in big.refused
    assert sa.max_job_rank({"ft": job(rank=32), "gone": None}) == 32


def desired(name: str = "a", uri: str = NEW, revision: str = "") -> sa.DesiredAdapter:
    return sa.DesiredAdapter(name, uri, revision=revision)


def ready(uri: str = NEW, path: str = "/adapters/a/abc", copies: tuple[str, ...] = ("abc",)) -> dict[str, Any]:
    return {"uri": uri, "revision": "", "phase": "Ready", "path": path, "step": 7, "seconds": 0.5, "copies": copies}


def test_plan_fetches_then_loads_then_serves() -> None:
    p = sa.plan_pod([desired()], {}, {})
    assert p.actions == [sa.Fetch("a", NEW, "")] and p.states["a"].phase == AdapterPhase.LOADING
    p = sa.plan_pod([desired()], {"a": {**ready(), "phase": "Fetching", "path": None}}, {})
    assert p.actions == [] and p.states["a"].phase == AdapterPhase.LOADING
    p = sa.plan_pod([desired()], {"a": ready()}, {})
    assert p.actions == [sa.Load("a", "/adapters/a/abc", inplace=False)]
    p = sa.plan_pod([desired()], {"a": ready()}, {"a": "/adapters/a/abc"})
    assert p.actions == [] and p.states["a"] == sa.PodAdapter(AdapterPhase.READY, f"serving {NEW}", 7)


def test_plan_replaces_in_place_and_then_drops_the_old_copy() -> None:
    # A new URI for a served name: fetch it while vLLM keeps serving the old copy.
    p = sa.plan_pod([desired(uri=NEW)], {"a": ready(uri=OLD, path="/adapters/a/old", copies=("old",))}, {"a": "/x"})
    assert p.actions == [sa.Fetch("a", NEW, "")]
    # A new revision of the same URI too.
    assert sa.plan_pod([desired(revision="r2")], {"a": ready()}, {}).actions[0] == sa.Fetch("a", NEW, "r2")
    fetched = ready(path="/adapters/a/new", copies=("new", "old"))
    p = sa.plan_pod([desired()], {"a": fetched}, {"a": "/adapters/a/old"})
    assert p.actions == [sa.Load("a", "/adapters/a/new", inplace=True), sa.Remove("a", keep="new")]


def test_plan_unloads_before_removing_and_leaves_what_it_does_not_know() -> None:
    p = sa.plan_pod([desired("a")], {"a": ready(), "gone": ready()}, {"a": "/adapters/a/abc", "gone": "/p"})
    assert p.actions == [sa.Unload("gone"), sa.Remove("gone")]
    # A name with nothing to serve (waiting for its job) is not loaded anywhere.
    assert sa.plan_pod([sa.DesiredAdapter("w", None)], {}, {"w": "/p"}).actions == [sa.Unload("w")]


def test_plan_reports_a_failed_fetch_and_asks_again() -> None:
    failed = {"uri": NEW, "revision": "", "phase": "Failed", "message": "no _COMPLETE", "path": None}
    p = sa.plan_pod([desired()], {"a": failed}, {})
    assert p.actions == [sa.Fetch("a", NEW, "")]
    assert p.states["a"].phase == AdapterPhase.FAILED and p.states["a"].message == "no _COMPLETE"


def result(state: AdapterPhase, message: str = "m") -> sa.PodResult:
    return sa.PodResult({"a": sa.PodAdapter(state, message, 7)})


def test_status_is_ready_only_on_every_ready_replica() -> None:
    d = [desired()]
    (st,) = sa.summarise(d, {"p1": result(AdapterPhase.READY), "p2": result(AdapterPhase.LOADING, "fetching")}, 2)
    assert (st.phase, st.loaded_replicas, st.step) == (AdapterPhase.LOADING, 1, 7)
    assert st.message == "fetching (1/2 replicas)"
    (st,) = sa.summarise(d, {"p1": result(AdapterPhase.READY), "p2": result(AdapterPhase.READY)}, 2)
    assert st.phase == AdapterPhase.READY and st.message == f"serving {NEW} on 2/2 replicas"
    (st,) = sa.summarise(d, {"p1": result(AdapterPhase.READY), "p2": result(AdapterPhase.FAILED, "bad")}, 2)
    assert st.phase == AdapterPhase.FAILED and st.message == "pod p2: bad"
    (st,) = sa.summarise(d, {}, 0)
    assert st.phase == AdapterPhase.LOADING and "waiting for a ready replica" in (st.message or "")
    assert sa.adapters_ready([st, st.model_copy(update={"phase": AdapterPhase.READY})]) == "1/2"


def test_events_fit_one_describe_line_and_say_what_happened() -> None:
    long = "adapter-" + "x" * 55
    pods = [
        sa.PodResult({}, loaded=[(long, True, 1.0), ("b", False, 1.0)], unloaded=["c"]),
        sa.PodResult({}, loaded=[("b", False, 1.0)]),
    ]
    new = [AdapterStatus(name="d", phase=AdapterPhase.FAILED), AdapterStatus(name="e", phase=AdapterPhase.FAILED)]
    old = [AdapterStatus(name="e", phase=AdapterPhase.FAILED)]
    events = sa.adapter_events(old, new, pods)
    assert [r for r, _ in events] == [sr.ADAPTER_REPLACED, sr.ADAPTER_LOADED, sr.ADAPTER_REMOVED, sr.ADAPTER_FAILED]
    assert events[1][1] == "adapter b loaded on 2 pod(s)"
    assert events[2][1] == "adapter c removed"
    assert events[3][1] == "adapter d failed; see status"
    assert all(len(m) <= sr.LINE.room for _, m in events) and events[0][1].endswith("xxx replaced")


def test_loading_adapters_are_looked_at_again_soon() -> None:
    st = api.ServingDeploymentStatus(ready_replicas=1, adapters=[AdapterStatus(name="a")])
    assert adapter_requeue(st) == 3.0
    st.ready_replicas = 0  # the pod's readiness wakes it
    st.adapters[0].phase = AdapterPhase.READY
    assert adapter_requeue(st) == 30.0
    st.adapters[0].phase = AdapterPhase.FAILED
    assert adapter_requeue(st) == 15.0
    assert adapter_requeue(api.ServingDeploymentStatus()) is None


def test_jobs_referenced_as_adapters_wake_their_deployments() -> None:
    raw = {"model": {"fineTuneJobRef": {"name": "base-ft"}}, "adapters": [REF, {"name": "u", "uri": OLD}]}
    assert referenced_jobs(raw) == {"base-ft", "ft"}
    assert referenced_jobs({"model": {"uri": BASE}}) == set()
    # An evaluation result or a new adapter changes what the informer hands on.
    assert model_view(snapshot(job(passed=True))) != model_view(snapshot(job(passed=False)))
    assert model_view(snapshot(job(adapter=OLD))) != model_view(snapshot(job(adapter=NEW)))
    # Progress and other status the serving side does not read change nothing it hears of.
    running = job(adapter=NEW)
    assert model_view(snapshot(running)) == model_view(
        snapshot({**running, "status": {**running["status"], "progress": {"step": 5}}})
    )


def test_the_finetunejob_informer_wakes_the_deployments_that_reference_a_job_by_name() -> None:
    from tpuforge.api.constants import SERVING_KIND
    from tpuforge.controllers.runtime.informer import Informer
    from tpuforge.controllers.serving.controller import ServingDeploymentController

    async def scenario() -> list[tuple[str, str]]:
        informer: Informer[tuple[str, str], Any] = Informer(
            api_version="tpuforge.dev/v1alpha1",
            kind="FineTuneJob",
            label_selector="",
            namespaces=None,
            view=snapshot,
            owner=lambda obj: ("ns", obj["metadata"]["uid"]),
            on_change=lambda *_: None,
        )
        controller = ServingDeploymentController(informer)
        requested: list[tuple[str, str]] = []
        controller.harness.queue.request = lambda key, delay=0.0: requested.append(key)  # type: ignore[method-assign]
        sd = {"metadata": {"namespace": "ns", "name": "sd", "uid": "s1"}, "spec": {"adapters": [REF]}}
        controller.servingdeployments._put("s1", ("ns", "sd"), snapshot(sd, SERVING_KIND), "ns")  # wakes "sd"
        requested.clear()
        running = job(adapter=None, phase="Running")
        running["metadata"]["namespace"] = "ns"
        informer._put("u1", ("ns", "u1"), snapshot(running), "ns")  # new: wakes "sd"
        progressed = {**running, "status": {**running["status"], "progress": {"step": 5}}}
        informer._put("u1", ("ns", "u1"), snapshot(progressed), "ns")  # nothing it reads: no reconcile
        done = job(adapter=NEW)
        done["metadata"]["namespace"] = "ns"
        informer._put("u1", ("ns", "u1"), snapshot(done), "ns")  # an adapter to serve: wakes "sd"
        await controller.harness.close()
        return requested

    assert asyncio.run(scenario()) == [("ns", "sd"), ("ns", "sd")]


class OldServer:
    """A vLLM server (and its adapters sidecar, on the same port) with one adapter fetched and ready, whose
    /v1/load_lora_adapter answers `status` with `body`: what a server without runtime LoRA loading says."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        import http.server
        import json
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/adapters":
                    self._send(200, {"adapters": {"a": ready()}})
                else:
                    self._send(200, {"data": [{"id": "base", "root": "/models/model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(outer.status, outer.body)

        self.status, self.body = status, body
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        # An image before tpu-inference v0.25.0: the TPU worker's add_lora is the base class's NotImplementedError.
        (500, {"error": {"message": "Call to add_lora method failed: NotImplementedError", "type": "x"}}, "500"),
        # A server without the route (runtime updating off): FastAPI's own 404.
        (404, {"detail": "Not Found"}, "no /v1/load_lora_adapter route"),
    ],
)
def test_a_server_without_runtime_lora_fails_the_adapters_saying_which_image_to_use(
    status: int, body: dict[str, Any], said: str
) -> None:
    server = OldServer(status, body)
    try:
        result = sa.sync_pod(sa.PodClient("127.0.0.1", server.port, server.port), [desired()])
    finally:
        server.close()
    assert result.lora_unsupported is not None and said in result.lora_unsupported
    assert result.states["a"].phase == AdapterPhase.FAILED
    message = sr.unsupported_message("vllm/vllm-tpu:v0.20.0", result.lora_unsupported)
    assert "cannot load LoRA adapters at runtime" in message and DEFAULT_VLLM_IMAGE in message


def test_an_adapter_vllm_cannot_find_is_not_taken_for_missing_runtime_lora() -> None:
    server = OldServer(404, {"error": {"message": "No adapter found for /adapters/a/abc", "type": "NotFoundError"}})
    try:
        result = sa.sync_pod(sa.PodClient("127.0.0.1", server.port, server.port), [desired()])
    finally:
        server.close()
    assert result.lora_unsupported is None
    assert result.states["a"].message.startswith("vLLM refused the adapter: HTTP 404: No adapter found")
