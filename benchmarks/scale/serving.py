"""The ServingDeployment burst of the operator-at-scale benchmark (`operator_scale.py --kind servingdeployment`):
the operator runs; one client creates N ServingDeployments as fast as it can; the time until every one has its
first status with an endpoint (its children applied and its status written: reconciled), then, once the
operator has gone quiet (its reconcile count unchanged for QUIET_SECONDS: the Deployments' and pods' own
changes handled), the reconciles, the operator's CPU, the children beyond one of each kind, and the writes
the apiserver counted (its apiserver_request_total: status patches, creates refused as already there, updates)
per ServingDeployment. The sandbox has no TPU nodes: the pods stay Pending, which is all the operator needs.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.scale.observe import cpu_by_process, cpu_spent, metric, percentile
from benchmarks.scale.processes import OperatorProcess
from benchmarks.scale.workload import namespace
from kubernetes import client

from tpuforge.api.constants import API_VERSION, LABEL_SERVING, SERVING_KIND
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox, wait_for

API_CONCURRENCY = 128  # the burst's client threads, as the FineTuneJob burst's
QUIET_SECONDS = 10.0
CHILD_KINDS = {"Deployment": "apps/v1", "Service": "v1", "PersistentVolumeClaim": "v1"}
# The writes counted, (verb, resource, subresource, code): the operator is their only writer here.
WRITES = {
    "status_patches": ("PATCH", "servingdeployments", "status", "200"),
    "status_conflicts": ("PATCH", "servingdeployments", "status", "409"),
    "child_creates": ("POST", "*", "", "201"),
    "child_creates_refused_as_existing": ("POST", "*", "", "409"),
    "child_updates": ("PUT", "services|persistentvolumeclaims", "", "200"),
    "reads": ("GET", "*", "", "*"),
}
CHILD_RESOURCES = {"deployments", "services", "persistentvolumeclaims"}
READ_RESOURCES = CHILD_RESOURCES | {"servingdeployments", "finetunejobs"}


def servingdeployment(ns: str, name: str) -> dict[str, Any]:
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


class Reconciled:
    """Local receive time of each ServingDeployment's first status with an endpoint (a LIST, then a WATCH that
    resumes where it broke off)."""

    def __init__(self, api: client.ApiClient, ns: str):
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._api, self._ns = api, ns
        _, version = kube_objects.list_collection(api, API_VERSION, SERVING_KIND, ns)
        threading.Thread(target=self._run, args=(version,), daemon=True).start()

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            try:
                for event in kube_client.WatchStream(
                    self._api, API_VERSION, SERVING_KIND, self._ns, version, timeout_seconds=60
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    if (obj.get("status") or {}).get("endpoint"):
                        self.seen.setdefault(obj["metadata"]["name"], time.monotonic())
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a dropped stream: resume from the last version seen
                print(f"  (watch: {exc}; resuming)", flush=True)
                time.sleep(0.2)

    def wait(self, names: set[str], timeout: float) -> float:
        try:
            wait_for(lambda: names <= self.seen.keys(), timeout, f"{len(names)} reconciled", interval=0.05)
        except TimeoutError:
            missing = sorted(names - self.seen.keys())
            raise TimeoutError(f"{len(missing)} of {len(names)} not reconciled, e.g. {missing[:3]}") from None
        return max(self.seen[n] for n in names)

    def stop(self) -> None:
        self._stop.set()


def apiserver_requests(api: client.ApiClient) -> Counter[tuple[str, str, str, str]]:
    """The apiserver's apiserver_request_total, by (verb, resource, subresource, code)."""
    cfg = api.configuration
    resp = api.rest_client.pool_manager.request(
        "GET", f"{cfg.host}/metrics", headers=kube_client.request_headers(cfg, None)
    )
    out: Counter[tuple[str, str, str, str]] = Counter()
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, value = line[len("apiserver_request_total{") :].rsplit("} ", 1)
        labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
        get = {k: v.strip('"') for k, v in labels.items()}.get
        out[(get("verb", ""), get("resource", ""), get("subresource", ""), get("code", ""))] += int(float(value))
    return out


def writes(before: Counter[tuple[str, str, str, str]], after: Counter[tuple[str, str, str, str]]) -> dict[str, int]:
    def matches(key: tuple[str, str, str, str], want: tuple[str, str, str, str]) -> bool:
        verb, resource, sub, code = key
        resources = want[1].split("|") if want[1] != "*" else None
        allowed = resources or (READ_RESOURCES if want[0] == "GET" else CHILD_RESOURCES)
        return verb == want[0] and resource in allowed and sub == want[2] and want[3] in ("*", code)

    delta = after - before
    return {name: sum(n for k, n in delta.items() if matches(k, want)) for name, want in WRITES.items()}


def duplicates(api: client.ApiClient, ns: str, names: list[str]) -> int:
    """Children beyond one of each kind per ServingDeployment (the PVCs: the model's and the XLA cache's)."""
    extra = 0
    for kind, api_version in CHILD_KINDS.items():
        counts = Counter(
            o["metadata"]["labels"][LABEL_SERVING]
            for o in kube_objects.list_objects(api, api_version, kind, ns, LABEL_SERVING)
        )
        each = 2 if kind == "PersistentVolumeClaim" else 1
        extra += sum(c - each for c in counts.values() if c > each)
        missing = [n for n in names if n not in counts]
        if missing:
            raise RuntimeError(f"{len(missing)} ServingDeployments have no {kind}, e.g. {missing[:3]}")
    return extra


def quiet(operator: OperatorProcess, timeout: float = 600) -> float:
    """Wait until the operator's reconcile count has not moved for QUIET_SECONDS; the count."""
    last, since, deadline = -1.0, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = metric(operator.port, "tpuforge_reconcile_total")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET_SECONDS:
            return now
        time.sleep(1.0)
    return last


def measure(api: client.ApiClient, sandbox: Sandbox, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    ns = namespace(api, "bench-serving")
    operator = OperatorProcess(sandbox, tmp / "operator.log", [ns])
    try:
        reconciled = Reconciled(api, ns)
        names = [f"sd-{i:05d}" for i in range(n)]
        print(f"burst: {n} ServingDeployments ...", flush=True)
        cpu0, requests0, others0 = operator.cpu_seconds(), apiserver_requests(api), cpu_by_process()
        sent: dict[str, float] = {}

        def create(name: str) -> None:
            sent[name] = time.monotonic()
            kube_objects.create(api, servingdeployment(ns, name))

        start = time.monotonic()
        with ThreadPoolExecutor(API_CONCURRENCY) as pool:
            list(pool.map(create, names))
        created = time.monotonic() - start
        burst = reconciled.wait(set(names), 1200) - start
        burst_cpu = operator.cpu_seconds() - cpu0
        latencies = sorted(reconciled.seen[x] - sent[x] for x in names)
        reconciles_burst = metric(operator.port, "tpuforge_reconcile_total")
        print(f"  created in {created:.1f} s; every one reconciled after {burst:.1f} s", flush=True)
        print(f"  settling: until no reconcile for {QUIET_SECONDS:.0f} s ...", flush=True)
        reconciles = quiet(operator)
        settled_cpu = operator.cpu_seconds() - cpu0
        counted = writes(requests0, apiserver_requests(api))
        reconciled.stop()
        return {
            "kind": SERVING_KIND,
            "servingdeployments": n,
            "created_seconds": round(created, 2),
            "burst_seconds": round(burst, 2),
            "burst_latency_p50_seconds": round(percentile(latencies, 50), 3),
            "burst_latency_p99_seconds": round(percentile(latencies, 99), 3),
            "operator_cpu_seconds_burst": round(burst_cpu, 1),
            "operator_cpu_seconds_settled": round(settled_cpu, 1),
            "operator_cpu_ms_per_object_settled": round(settled_cpu * 1000 / n, 1),
            "operator_rss_mb_peak": round(operator.peak_rss_mb(), 1),
            "cpu_seconds_burst_and_settling": cpu_spent(others0),
            "reconciles_burst": reconciles_burst,
            "reconciles_settled": reconciles,
            "reconcile_conflicts": metric(operator.port, "tpuforge_reconcile_conflicts_total"),
            "apiserver_requests": counted,
            "apiserver_requests_per_object": {k: round(v / n, 2) for k, v in counted.items()},
            "duplicates": duplicates(api, ns, names),
        }
    finally:
        operator.stop()
