"""LoRA adapters on a running ServingDeployment: bringing every ready replica to the adapters each name should
serve (`adapter_sources`), without restarting anything.

The decisions are pure (`plan_pod`, `summarise`, `adapter_events`); `sync_pod` carries a plan out over HTTP,
straight to the pod's IP: the adapters sidecar (port 8001) fetches a copy into the pod, then vLLM (port 8000)
loads it with /v1/load_lora_adapter (`load_inplace` swaps a replacement atomically under the same name), and
names no longer wanted are unloaded before their copies are deleted. Each step is level-based: what a pod
already holds is read first, so a replica that restarts, or a vLLM process that comes back empty, simply gets
every adapter again on the next reconcile.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuforge.api import serving_reasons as sr
from tpuforge.api.serving import AdapterPhase, AdapterStatus
from tpuforge.controllers.serving.adapter_sources import DesiredAdapter as DesiredAdapter
from tpuforge.controllers.serving.adapter_sources import max_job_rank as max_job_rank
from tpuforge.controllers.serving.adapter_sources import resolve_adapter as resolve_adapter
from tpuforge.controllers.serving.adapter_sources import resolve_adapters as resolve_adapters
from tpuforge.manifests import serving as manifests
from tpuforge.manifests import vllm_server

Obj = dict[str, Any]

# Short: these run inside a reconcile. A load reads the adapter and preloads it into the engine.
GET_TIMEOUT = 3.0
LOAD_TIMEOUT = 60.0


# --- One replica ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetch:
    name: str
    uri: str
    revision: str


@dataclass(frozen=True)
class Load:
    name: str
    path: str
    inplace: bool  # a replacement: vLLM swaps it under the same name and id


@dataclass(frozen=True)
class Unload:
    name: str


@dataclass(frozen=True)
class Remove:
    """Delete local copies: all of them, or all but `keep` (the directory vLLM now reads)."""

    name: str
    keep: str | None = None


Action = Fetch | Load | Unload | Remove


@dataclass(frozen=True)
class PodAdapter:
    """One adapter on one replica."""

    phase: AdapterPhase
    message: str
    step: int | None = None
    seconds: float | None = None  # the sidecar's fetch time


@dataclass
class PodPlan:
    actions: list[Action] = field(default_factory=list)
    states: dict[str, PodAdapter] = field(default_factory=dict)


def plan_pod(desired: Sequence[DesiredAdapter], sidecar: Mapping[str, Obj], loras: Mapping[str, str]) -> PodPlan:
    """What one replica needs, from what its sidecar holds (name -> state) and what its vLLM serves (LoRA name
    -> path). Loads come after their fetch is Ready; unloads come before their copies are removed."""
    plan = PodPlan()
    wanted = {d.name: d for d in desired if d.uri is not None}
    for d in wanted.values():
        assert d.uri is not None
        s = sidecar.get(d.name)
        if s is None or (s.get("uri"), s.get("revision") or "") != (d.uri, d.revision):
            plan.actions.append(Fetch(d.name, d.uri, d.revision))
            plan.states[d.name] = PodAdapter(AdapterPhase.LOADING, sr.fetching(d.uri))
            continue
        step = s.get("step")
        if s.get("phase") == "Failed":
            plan.actions.append(Fetch(d.name, d.uri, d.revision))  # the sidecar retries after a pause
            plan.states[d.name] = PodAdapter(AdapterPhase.FAILED, str(s.get("message") or sr.FETCH_FAILED), step)
        elif s.get("phase") != "Ready" or not s.get("path"):
            plan.states[d.name] = PodAdapter(AdapterPhase.LOADING, sr.fetching(d.uri))
        else:
            path = str(s["path"])
            if loras.get(d.name) != path:
                plan.actions.append(Load(d.name, path, inplace=d.name in loras))
                plan.states[d.name] = PodAdapter(
                    AdapterPhase.LOADING, sr.loading_adapter(d.uri), step, s.get("seconds")
                )
            else:
                plan.states[d.name] = PodAdapter(AdapterPhase.READY, sr.serving_uri(d.uri), step)
            keep = posixpath.basename(path.rstrip("/"))
            if any(c != keep for c in s.get("copies") or []):
                plan.actions.append(Remove(d.name, keep))
    for name in sorted(set(loras) - set(wanted)):
        plan.actions.append(Unload(name))
    for name in sorted(set(sidecar) - set(wanted)):
        plan.actions.append(Remove(name))
    return plan


@dataclass
class PodResult:
    states: dict[str, PodAdapter]
    loaded: list[tuple[str, bool, float]] = field(default_factory=list)  # name, replaced, seconds
    unloaded: list[str] = field(default_factory=list)
    unreachable: str | None = None
    # What the server answered when it cannot load adapters at runtime at all (an image without it).
    lora_unsupported: str | None = None


# What a server without runtime LoRA loading (sr.RUNTIME_LORA_UNSUPPORTED) answers.
_UNSUPPORTED = re.compile(r"NotImplementedError|not implemented|not supported|unsupported", re.IGNORECASE)


def lora_unsupported(e: Exception) -> str | None:
    """What the server said, when a load failed because the server cannot load adapters at runtime."""
    if not isinstance(e, urllib.error.HTTPError):
        return None
    body = _error_body(e)
    if e.code == 404 and body.get("detail") == "Not Found":
        return sr.NO_LOAD_ROUTE
    msg = _error_message(body)
    if e.code == 501 or _UNSUPPORTED.search(msg):
        return sr.http_error(e.code, msg or e.reason)
    return None


class PodClient:
    """HTTP to one serving pod: its sidecar and its vLLM server."""

    def __init__(self, ip: str, vllm_port: int = vllm_server.VLLM_PORT, sidecar_port: int = manifests.ADAPTERS_PORT):
        self.vllm = f"http://{ip}:{vllm_port}"
        self.sidecar = f"http://{ip}:{sidecar_port}"

    @staticmethod
    def _call(method: str, url: str, body: Obj | None = None, timeout: float = GET_TIMEOUT) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def sidecar_states(self) -> dict[str, Obj]:
        out: dict[str, Obj] = self._call("GET", f"{self.sidecar}/adapters").get("adapters") or {}
        return out

    def loras(self) -> dict[str, str]:
        """vLLM's LoRA adapters (name -> path): the models with a parent."""
        data = self._call("GET", f"{self.vllm}/v1/models").get("data") or []
        return {m["id"]: m.get("root") or "" for m in data if m.get("parent")}

    def fetch(self, a: Fetch) -> None:
        self._call("PUT", f"{self.sidecar}/adapters/{a.name}", {"uri": a.uri, "revision": a.revision})

    def load(self, a: Load) -> None:
        body = {"lora_name": a.name, "lora_path": a.path, "load_inplace": a.inplace}
        self._call("POST", f"{self.vllm}/v1/load_lora_adapter", body, timeout=LOAD_TIMEOUT)

    def unload(self, a: Unload) -> None:
        self._call("POST", f"{self.vllm}/v1/unload_lora_adapter", {"lora_name": a.name})

    def remove(self, a: Remove) -> None:
        query = f"?keep={a.keep}" if a.keep else ""
        self._call("DELETE", f"{self.sidecar}/adapters/{a.name}{query}")


def _error_body(e: urllib.error.HTTPError) -> dict[str, Any]:
    """The JSON body of an HTTP error, read once (a second read of the response gives nothing)."""
    cached = getattr(e, "tpuforge_body", None)
    if cached is None:
        try:
            cached = json.loads(e.read().decode() or "{}")
        except ValueError:
            cached = {}
        if not isinstance(cached, dict):
            cached = {}
        e.tpuforge_body = cached  # type: ignore[attr-defined]
    return cached


def _error_message(body: Mapping[str, Any]) -> str:
    error = body.get("error")
    return str((error.get("message") if isinstance(error, dict) else error) or body.get("message") or "")


def _http_error(e: Exception) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return sr.http_error(e.code, _error_message(_error_body(e)) or e.reason)
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return str(e)


def sync_pod(pod: PodClient, desired: Sequence[DesiredAdapter]) -> PodResult:
    """Bring one ready replica to `desired`; what each adapter is on it afterwards."""
    try:
        sidecar, loras = pod.sidecar_states(), pod.loras()
    except (OSError, ValueError) as e:
        why = sr.unreachable(_http_error(e))
        return PodResult({d.name: PodAdapter(AdapterPhase.LOADING, why) for d in desired}, unreachable=why)
    plan = plan_pod(desired, sidecar, loras)
    uris = {d.name: d.uri for d in desired}
    result = PodResult(dict(plan.states))
    for a in plan.actions:
        try:
            if isinstance(a, Fetch):
                pod.fetch(a)
            elif isinstance(a, Load):
                started = time.monotonic()
                pod.load(a)
                prior = result.states[a.name]
                seconds = (prior.seconds or 0.0) + time.monotonic() - started
                result.states[a.name] = PodAdapter(AdapterPhase.READY, sr.serving_uri(str(uris[a.name])), prior.step)
                result.loaded.append((a.name, a.inplace, seconds))
            elif isinstance(a, Unload):
                pod.unload(a)
                result.unloaded.append(a.name)
            else:
                pod.remove(a)
        except (OSError, ValueError) as e:
            if isinstance(a, Load):
                prior = result.states[a.name]
                unsupported = lora_unsupported(e)
                if unsupported is not None:
                    result.lora_unsupported = unsupported
                    why = sr.cannot_load_at_runtime(unsupported)
                else:
                    why = sr.refused_adapter(_http_error(e))
                result.states[a.name] = PodAdapter(AdapterPhase.FAILED, why, prior.step)
            elif isinstance(a, Fetch) and a.name in result.states:
                prior = result.states[a.name]
                if prior.phase != AdapterPhase.FAILED:
                    result.states[a.name] = PodAdapter(AdapterPhase.LOADING, sr.asking_for_fetch(_http_error(e)))
            # An unload or a removal that failed is tried again on the next reconcile.
    return result


# --- Status ---------------------------------------------------------------------------------------------------


def summarise(
    desired: Sequence[DesiredAdapter], pods: Mapping[str, PodResult], ready_replicas: int
) -> list[AdapterStatus]:
    """One status per spec.adapters entry, in order, from what each ready replica said."""
    out = []
    for d in desired:
        st = AdapterStatus(name=d.name, uri=d.uri, source=d.source, revision=d.revision or None)
        if d.refused is not None:
            st.phase, st.message = AdapterPhase.FAILED, d.refused
            out.append(st)
            continue
        if d.uri is None:
            reason, message = d.held_back or (sr.WAITING_FOR_JOB, sr.nothing_to_serve(d.name))
            st.phase = AdapterPhase.FAILED if reason in sr.ADAPTER_FAILED_REASONS else AdapterPhase.LOADING
            st.message = message
            out.append(st)
            continue
        per_pod = {pod: res.states[d.name] for pod, res in pods.items() if d.name in res.states}
        st.loaded_replicas = sum(1 for s in per_pod.values() if s.phase == AdapterPhase.READY)
        st.step = next((s.step for s in per_pod.values() if s.step is not None), None)
        failed = [(pod, s) for pod, s in per_pod.items() if s.phase == AdapterPhase.FAILED]
        if failed:
            pod, s = failed[0]
            st.phase, st.message = AdapterPhase.FAILED, sr.on_pod(pod, s.message)
        elif ready_replicas > 0 and st.loaded_replicas >= ready_replicas:
            st.phase = AdapterPhase.READY
            st.message = sr.serving_on(d.uri, st.loaded_replicas, ready_replicas)
        else:
            st.phase = AdapterPhase.LOADING
            waiting = next((s.message for s in per_pod.values() if s.phase != AdapterPhase.READY), None)
            st.message = sr.loaded_of(waiting or sr.WAITING_FOR_REPLICA, st.loaded_replicas, ready_replicas)
        if d.held_back is not None:
            st.message += f"; {d.held_back[1]}"
        out.append(st)
    return out


def adapters_ready(statuses: Sequence[AdapterStatus]) -> str:
    return f"{sum(1 for s in statuses if s.phase == AdapterPhase.READY)}/{len(statuses)}"


# --- Events ---------------------------------------------------------------------------------------------------


def adapter_events(
    old: Sequence[AdapterStatus], new: Sequence[AdapterStatus], pods: Sequence[PodResult]
) -> list[tuple[str, str]]:
    """(reason, message) for what this reconcile did: loads and replacements (once per adapter however many
    replicas), removals, and adapters that have just failed. Full details are in status.adapters."""
    out: list[tuple[str, str]] = []
    loaded: dict[str, bool] = {}
    for res in pods:
        for name, replaced, _ in res.loaded:
            loaded[name] = loaded.get(name, False) or replaced
    for name, replaced in loaded.items():
        n = sum(1 for res in pods if any(x[0] == name for x in res.loaded))
        out.append((sr.ADAPTER_REPLACED if replaced else sr.ADAPTER_LOADED, sr.adapter_loaded(name, replaced, n)))
    unloaded = sorted({name for p in pods for name in p.unloaded})
    out += [(sr.ADAPTER_REMOVED, sr.adapter_removed(n)) for n in unloaded]
    before = {a.name: a.phase for a in old}
    for a in new:
        if a.phase == AdapterPhase.FAILED and before.get(a.name) != AdapterPhase.FAILED:
            out.append((sr.ADAPTER_FAILED, sr.adapter_failed(a.name)))
    return out
