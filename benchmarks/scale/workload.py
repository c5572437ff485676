"""The load of the operator-at-scale benchmark: a Kind (what is created, and what the operator writes for each
one, from its own decision code), the FineTuneJob kind, and the load itself: the objects created in a burst (as
fast as one client can) or at a steady rate, and the baseline, one client making the operator's writes."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks.scale.observe import Arrivals, cpu_by_process, cpu_spent
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge.api import FineTuneJobStatus
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND, LABEL_FINETUNEJOB
from tpuforge.controllers.finetune.controller import creation_groups
from tpuforge.controllers.finetune.plan import Observed, plan, status_patch
from tpuforge.controllers.runtime.controller import API_CONCURRENCY
from tpuforge.kube import client as kube_client
from tpuforge.kube import events as kube_events
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox.agent.agent import CONTAINERS_PLAYED

Obj = dict[str, Any]


@dataclass(frozen=True)
class Writes:
    """What the operator writes for one new object: its children in creation groups (one after the other),
    its status patch and its Events (type, reason, message)."""

    groups: list[list[Obj]]
    status: Obj
    events: list[tuple[str, str, str]]

    @property
    def count(self) -> int:
        return sum(len(g) for g in self.groups) + 1 + len(self.events)

    def children(self) -> Counter[tuple[str, str]]:
        """(apiVersion, kind) -> how many of each."""
        return Counter((o["apiVersion"], o["kind"]) for g in self.groups for o in g)


@dataclass(frozen=True)
class Kind:
    """One kind the benchmark bursts: how to make one, what the operator writes for it, and the event that says
    the operator has handled it (an object of `done_kind` for which `done_owner` names the owner)."""

    name: str
    label: str  # on the operator's children and their pods: the owner's name
    manifest: Callable[[str, str], Obj]  # (namespace, name) -> the object to create
    writes: Callable[[Obj], Writes]  # for the object as created
    done_what: str  # e.g. "its training Job"
    done_api_version: str
    done_kind: str
    done_owner: Callable[[Obj], str | None]

    def arrivals(self, api: client.ApiClient, ns: str) -> Arrivals:
        return Arrivals(api, ns, self.done_api_version, self.done_kind, self.done_owner)


def spec(name: str) -> Obj:
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


def finetunejob(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": FINETUNEJOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec(name),
    }


def finetunejob_writes(ftj: Obj) -> Writes:
    """What the operator writes for a new FineTuneJob, from its own decision code."""
    meta = ftj["metadata"]
    observed = Observed(meta["namespace"], meta["name"], meta["uid"], 1, ftj["spec"], FineTuneJobStatus())
    decided = plan(observed, datetime.now(UTC))
    events = [(e.type, e.reason, e.message) for e in decided.events]
    return Writes(creation_groups(decided.create), status_patch(FineTuneJobStatus(), decided.status), events)


def training_job_owner(job: Obj) -> str | None:
    """A Job's FineTuneJob: the only Jobs here are training Jobs (the preflight is off)."""
    return (job["metadata"].get("labels") or {}).get(LABEL_FINETUNEJOB)


FINETUNEJOB = Kind(
    name=FINETUNEJOB_KIND,
    label=LABEL_FINETUNEJOB,
    manifest=finetunejob,
    writes=finetunejob_writes,
    done_what="its training Job",
    done_api_version="batch/v1",
    done_kind="Job",
    done_owner=training_job_owner,
)


def namespace(api: client.ApiClient, name: str) -> str:
    """A namespace whose pods the node agent places (or reports unschedulable) but does not run: on a sandbox
    with TPU nodes, a training or serving pod that fits must not start a trainer or vLLM here."""
    key, value = CONTAINERS_PLAYED.split("=")
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {key: value}}}
    kube_objects.create(api, body)
    return name


def create(api: client.ApiClient, obj: Obj) -> Obj:
    """Create `obj`; the object as stored. A create that the client retried after losing the answer (a
    timeout on a starved apiserver) finds its own first try there: that counts as the write."""
    try:
        return kube_objects.create(api, obj)
    except ApiException as exc:
        if not kube_client.is_already_exists(exc):
            raise
    found = kube_objects.get(api, obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
    if found is None:
        raise RuntimeError(f"{obj['kind']} {obj['metadata']['name']} was said to exist, then was not there")
    return found


def baseline_names(n: int) -> list[str]:
    return [f"base-{i:05d}" for i in range(n)]


def run_baseline(api: client.ApiClient, kind: Kind, n: int, ns: str) -> tuple[float, int, dict[str, float]]:
    """One client makes the operator's writes for n objects (created beforehand, untimed): per object its
    children, group after group, then the status, then the Events, with as many threads as the operator makes
    API calls at once. Returns the time, the writes per object and the CPU seconds of the writes."""
    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        objs = list(pool.map(lambda name: create(api, kind.manifest(ns, name)), baseline_names(n)))
    work = [(obj, kind.writes(obj)) for obj in objs]

    def write(obj: Obj, w: Writes) -> None:
        for group in w.groups:
            for child in group:
                create(api, child)
        kube_objects.patch_status(api, obj, w.status, obj["metadata"]["resourceVersion"])
        for type_, reason, message in w.events:
            kube_events.post_event(api, obj, type_, reason, message)

    start, cpu = time.monotonic(), cpu_by_process()
    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        list(pool.map(lambda job: write(*job), work))
    return time.monotonic() - start, work[0][1].count, cpu_spent(cpu)


def create_all(api: client.ApiClient, kind: Kind, ns: str, names: list[str]) -> dict[str, float]:
    """Create the objects as fast as one client can; when each create was sent."""
    sent: dict[str, float] = {}

    def one(name: str) -> None:
        sent[name] = time.monotonic()
        create(api, kind.manifest(ns, name))

    with ThreadPoolExecutor(API_CONCURRENCY) as pool:
        list(pool.map(one, names))
    return sent


def run_steady(
    api: client.ApiClient, kind: Kind, arrivals: Arrivals, ns: str, names: list[str], rate: float
) -> list[tuple[float, float]]:
    """Create `names` at `rate` per second; for each, in order, when it was sent (seconds into the phase) and
    its latency from its create to the operator's handling."""
    sent: dict[str, float] = {}
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for i, name in enumerate(names):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent[name] = time.monotonic()
            pool.submit(create, api, kind.manifest(ns, name))
    arrivals.wait(set(names), 120)
    return [(sent[n] - start, arrivals.seen[n] - sent[n]) for n in names]
