"""The load of the operator-at-scale benchmark: the FineTuneJobs it creates (in a burst, as fast as one client
can, or at a steady rate), and the baseline, one client making the writes that the operator makes for each
FineTuneJob, as the operator's own decision code computes them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from benchmarks.scale.observe import JobWatch, cpu_by_process, cpu_spent
from kubernetes import client

from tpuforge.api import FineTuneJobStatus
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.controllers.finetune.controller import API_CONCURRENCY, creation_groups
from tpuforge.controllers.finetune.plan import Event, Observed, plan, status_patch
from tpuforge.kube import events as kube_events
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_common import train_job_name


def spec(name: str) -> dict[str, Any]:
    return {
        "model": {"name": "gemma4-31b", "uri": "gs://bench/models/gemma4-31b"},
        "dataset": {"uri": "gs://bench/data/train.jsonl"},
        "training": {"maxSeqLen": 3072},
        "tpu": {"slice": "v5p-8"},
        "checkpoint": {"uri": f"gs://bench/jobs/{name}/checkpoints"},
        "output": {"uri": f"gs://bench/jobs/{name}/merged"},
        # What is measured is the operator taking a job to its training Job. With the preflight on, each job
        # would first wait for a preflight Job, which needs a CPU node this benchmark's sandbox does not run
        # (tests/pipelines/test_preflight.py covers that path).
        "preflight": {"enabled": False},
        "serviceAccountName": "default",
    }


def finetunejob(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": FINETUNEJOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec(name),
    }


def namespace(api: client.ApiClient, name: str) -> str:
    kube_objects.create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def operator_writes(ftj: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], list[Event]]:
    """What the operator writes for a new FineTuneJob, from its own decision code: the children, the status
    patch and the Events."""
    meta = ftj["metadata"]
    observed = Observed(meta["namespace"], meta["name"], meta["uid"], 1, ftj["spec"], FineTuneJobStatus())
    decided = plan(observed, datetime.now(UTC))
    return decided.create, status_patch(FineTuneJobStatus(), decided.status), decided.events


def run_baseline(api: client.ApiClient, n: int, ns_name: str) -> tuple[float, int, dict[str, float]]:
    """One client makes the operator's writes for n FineTuneJobs (created beforehand, untimed): per job the
    children (those a pod needs first), the status, the Event. Returns the time, the writes per job and the
    CPU seconds of the writes (see cpu_by_process)."""
    ns = namespace(api, ns_name)
    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        ftjs = list(pool.map(lambda i: kube_objects.create(api, finetunejob(ns, f"base-{i:05d}")), range(n)))
    work = [(ftj, *operator_writes(ftj)) for ftj in ftjs]

    def write(ftj: dict[str, Any], children: list[dict[str, Any]], status: dict[str, Any], events: list[Event]) -> None:
        for group in creation_groups(children):
            for obj in group:
                kube_objects.create(api, obj)
        kube_objects.patch_status(api, ftj, status, ftj["metadata"]["resourceVersion"])
        for e in events:
            kube_events.post_event(api, ftj, e.type, e.reason, e.message)

    start, cpu = time.monotonic(), cpu_by_process()
    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        list(pool.map(lambda w: write(*w), work))
    per_job = len(work[0][1]) + 1 + len(work[0][3])
    return time.monotonic() - start, per_job, cpu_spent(cpu)


def create_all(api: client.ApiClient, ns: str, names: list[str]) -> dict[str, float]:
    """Create the FineTuneJobs as fast as one client can; when each create was sent."""
    sent: dict[str, float] = {}

    def one(name: str) -> None:
        sent[name] = time.monotonic()
        kube_objects.create(api, finetunejob(ns, name))

    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        list(pool.map(one, names))
    return sent


def run_steady(api: client.ApiClient, jobs: JobWatch, ns: str, rate: float, duration: float) -> list[float]:
    names = [f"steady-{i:05d}" for i in range(int(rate * duration))]
    sent: dict[str, float] = {}
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for i, name in enumerate(names):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent[name] = time.monotonic()
            pool.submit(kube_objects.create, api, finetunejob(ns, name))
    wanted = {train_job_name(n, 0) for n in names}
    jobs.wait(wanted, 120)
    return sorted(jobs.seen[train_job_name(n, 0)] - sent[n] for n in names)
