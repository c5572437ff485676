"""The ServingDeployment kind of the operator-at-scale benchmark (--kind servingdeployment): the objects, the
writes the operator makes for each (from the serving controller's own decisions: the claims, Service and
Deployment, the status with the endpoint, the Events), handled once its first status with an endpoint arrives
(its children applied and its status written: reconciled); and what the apiserver counted of the operator's
requests (its apiserver_request_total: status patches, creates refused as already there, updates, reads) per
ServingDeployment. The sandbox has no TPU nodes: the pods stay Pending, which is all the operator needs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchmarks.scale.workload import Kind, Writes
from kubernetes import client

from tpuforge import api
from tpuforge.api.constants import API_VERSION, LABEL_SERVING, SERVING_KIND
from tpuforge.controllers.serving import plan
from tpuforge.kube import client as kube_client

Obj = dict[str, Any]

# The requests counted, (verb, resource, subresource, code): the operator is their only maker here.
WRITES = {
    "status_patches": ("PATCH", "servingdeployments", "status", "200"),
    "status_conflicts": ("PATCH", "servingdeployments", "status", "409"),
    "child_creates": ("POST", "*", "", "201"),
    "child_creates_refused_as_existing": ("POST", "*", "", "409"),
    "child_updates": ("PUT", "services|persistentvolumeclaims", "", "200"),
    "reads": ("GET", "*", "", "*"),
}
CHILD_RESOURCES = {"deployments", "services", "persistentvolumeclaims", "poddisruptionbudgets"}
READ_RESOURCES = CHILD_RESOURCES | {"servingdeployments", "finetunejobs"}


def servingdeployment(ns: str, name: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": SERVING_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"uri": f"gs://bench/models/{name}", "name": "gemma4-31b"},
            "serviceAccountName": "default",
            "tpu": {"slice": "v6e-8"},
        },
    }


def servingdeployment_writes(sdep: Obj) -> Writes:
    """What the operator writes for a new ServingDeployment, from the serving controller's decisions: the
    children in order, then the status it computes from the new Deployment (no pods yet), then its Events."""
    meta = sdep["metadata"]
    observed = plan.Observed(
        meta["namespace"], meta["name"], meta["uid"], 1, sdep["spec"], api.ServingDeploymentStatus()
    )
    p = plan.plan_children(observed)
    t = p.target
    if t is None:
        raise RuntimeError(f"the operator would not serve the benchmark's ServingDeployment: {p.status}")
    p = plan.plan_status(observed, p, t, plan.Replicas(t.objects[-1], []))
    status = p.status.model_dump(mode="json", by_alias=True)
    return Writes([[o] for o in t.objects], status, list(p.events))


def reconciled(sdep: Obj) -> str | None:
    """A ServingDeployment is handled once its status has an endpoint."""
    return sdep["metadata"]["name"] if (sdep.get("status") or {}).get("endpoint") else None


SERVINGDEPLOYMENT = Kind(
    name=SERVING_KIND,
    label=LABEL_SERVING,
    manifest=servingdeployment,
    writes=servingdeployment_writes,
    done_what="its status with an endpoint",
    done_api_version=API_VERSION,
    done_kind=SERVING_KIND,
    done_owner=reconciled,
)


def _apiserver_series(api: client.ApiClient, name: str) -> list[tuple[dict[str, str], float]]:
    """The series of one metric on the apiserver's /metrics: (labels, value) each."""
    cfg = api.configuration
    resp = api.rest_client.pool_manager.request(
        "GET", f"{cfg.host}/metrics", headers=kube_client.request_headers(cfg, None)
    )
    out = []
    for line in resp.data.decode().splitlines():
        if not line.startswith(name + "{"):
            continue
        labels_text, value = line[len(name) + 1 :].rsplit("} ", 1)
        labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
        out.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
    return out


def apiserver_requests(api: client.ApiClient) -> Counter[tuple[str, str, str, str]]:
    """The apiserver's apiserver_request_total, by (verb, resource, subresource, code)."""
    out: Counter[tuple[str, str, str, str]] = Counter()
    for labels, value in _apiserver_series(api, "apiserver_request_total"):
        get = labels.get
        out[(get("verb", ""), get("resource", ""), get("subresource", ""), get("code", ""))] += int(value)
    return out


WRITE_VERBS = ("POST", "PUT", "PATCH")


def apiserver_write_seconds(api: client.ApiClient) -> tuple[float, float]:
    """The apiserver's own time on writes (apiserver_request_duration_seconds, every client's POST, PUT and
    PATCH): (seconds, requests) so far. Over a phase, their mean is the time a write took inside the
    apiserver, which a client's wait, when much longer, is not."""
    seconds = sum(
        v
        for labels, v in _apiserver_series(api, "apiserver_request_duration_seconds_sum")
        if labels.get("verb") in WRITE_VERBS
    )
    count = sum(
        v
        for labels, v in _apiserver_series(api, "apiserver_request_duration_seconds_count")
        if labels.get("verb") in WRITE_VERBS
    )
    return seconds, count


def writes(before: Counter[tuple[str, str, str, str]], after: Counter[tuple[str, str, str, str]]) -> dict[str, int]:
    def matches(key: tuple[str, str, str, str], want: tuple[str, str, str, str]) -> bool:
        verb, resource, sub, code = key
        resources = want[1].split("|") if want[1] != "*" else None
        allowed = resources or (READ_RESOURCES if want[0] == "GET" else CHILD_RESOURCES)
        return verb == want[0] and resource in allowed and sub == want[2] and want[3] in ("*", code)

    delta = after - before
    return {name: sum(n for k, n in delta.items() if matches(k, want)) for name, want in WRITES.items()}
