"""What the operator-at-scale benchmark watches and counts: when each object is handled (Arrivals), the cluster
settling after the burst, children beyond what the operator makes per object, the CPU seconds of the clients and
of the control plane, the watches the apiserver closed for falling behind, the operator's metrics, and
percentiles."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
from kubernetes import client

from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox, wait_for

if TYPE_CHECKING:
    from benchmarks.scale.processes import OperatorProcess

Obj = dict[str, Any]


class Arrivals:
    """Local receive time of each owner's first sign of being handled: the first event of an object of
    (api_version, kind) in a namespace for which `owner_of` names an owner (a LIST, then a WATCH that resumes
    where it broke off)."""

    def __init__(
        self, api: client.ApiClient, ns: str, api_version: str, kind: str, owner_of: Callable[[Obj], str | None]
    ):
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._api, self._ns, self._what, self._owner_of = api, ns, (api_version, kind), owner_of
        _, version = kube_objects.list_collection(api, api_version, kind, ns)
        threading.Thread(target=self._run, args=(version,), daemon=True).start()

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            try:
                for event in kube_client.WatchStream(self._api, *self._what, self._ns, version, timeout_seconds=60):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "DELETED" and (owner := self._owner_of(obj)) is not None:
                        self.seen.setdefault(owner, time.monotonic())
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a dropped stream: resume from the last version seen
                if self._stop.is_set():
                    return
                print(f"  ({self._what[1]} watch: {exc}; resuming)", flush=True)
                time.sleep(0.2)

    def count(self, names: set[str]) -> int:
        return len(names & self.seen.keys())

    def wait(self, names: set[str], timeout: float) -> float:
        """The time the last of `names` arrived; TimeoutError saying how many did not."""
        try:
            wait_for(lambda: names <= self.seen.keys(), timeout, f"{len(names)} handled", interval=0.05)
        except TimeoutError:
            missing = sorted(names - self.seen.keys())
            raise TimeoutError(f"{len(missing)} of {len(names)} not handled, e.g. {missing[:3]}") from None
        return max(self.seen[n] for n in names)

    def stop(self) -> None:
        self._stop.set()


@dataclass(frozen=True)
class Settled:
    """How the wait for the burst's aftermath ended: its seconds, and what had not happened within the bound."""

    seconds: float
    incomplete: str | None  # None: settled

    def result(self) -> dict[str, Any]:
        return {"settle_seconds": round(self.seconds, 1), "settle_incomplete": self.incomplete}


def placed_or_refused(pod: Obj) -> bool:
    """Whether the scheduler (the sandbox's node agent) has decided about a pod: bound to a node, or its
    PodScheduled condition False (reason Unschedulable, with the scheduler's message)."""
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds)


def pods_decided(api: client.ApiClient, label: str, ns: str, names: list[str], deadline: float) -> str | None:
    """Wait, until the monotonic `deadline`, for a pod of every owner in `names` (made by the Job controller, or
    the Deployment's ReplicaSet), each placed or reported unschedulable by the node agent (the scheduler here).
    None when that happened; else what had not."""
    start, wanted = time.monotonic(), set(names)
    while True:
        pods = kube_objects.list_objects(api, "v1", "Pod", ns, label)
        owners = {(p["metadata"].get("labels") or {}).get(label) for p in pods}
        pods_missing = len(wanted - owners)
        undecided = sum(not placed_or_refused(p) for p in pods)
        if not pods_missing and not undecided:
            return None
        if time.monotonic() >= deadline:
            return (
                f"after {time.monotonic() - start:.0f} s, {pods_missing} of {len(wanted)} had no pod and "
                f"{undecided} pods were neither placed nor reported unschedulable"
            )
        time.sleep(1.0)


def settle(
    api: client.ApiClient,
    label: str,
    ns: str,
    names: list[str],
    operator: OperatorProcess,
    timeout: float,
    quiet: float,
) -> Settled:
    """Wait, at most `timeout` seconds in all, for the burst's aftermath, so that what follows measures the
    operator alone: a pod for every owner (made by the Job controller, or the Deployment's ReplicaSet), every
    pod placed or reported unschedulable by the node agent (the scheduler here), and the operator's handling of
    those changes, until its reconcile count has not moved for `quiet` seconds. What the operator reports
    later by design (a training pod unschedulable for longer than UNSCHEDULABLE_REPORT_SECONDS) is not waited
    for: the phases after this one end before it is due at the sizes run here, and the steady phase counts
    the objects that reported it."""
    start = time.monotonic()
    deadline = start + timeout
    why = pods_decided(api, label, ns, names, deadline)
    if why is not None:
        print(f"  (settling: {why}; going on)", flush=True)
        return Settled(time.monotonic() - start, why)
    print(f"  pods: each placed or unschedulable after {time.monotonic() - start:.1f} s", flush=True)
    if quiet_for(operator, quiet, deadline):
        return Settled(time.monotonic() - start, None)
    why = f"the operator still reconciled {timeout:.0f} s after the burst (never {quiet:.0f} s without one)"
    print(f"  (settling: {why}; going on)", flush=True)
    return Settled(time.monotonic() - start, why)


def quiet_for(operator: OperatorProcess, quiet: float, deadline: float) -> bool:
    """Wait until the operator has not reconciled for `quiet` seconds (True), or the monotonic `deadline`."""
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = operator.metric("tpuforge_reconcile_total")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return True
        time.sleep(0.5)
    return False


def duplicates(api: client.ApiClient, label: str, ns: str, names: list[str], each: Counter[tuple[str, str]]) -> int:
    """Children beyond `each` ((apiVersion, kind) -> how many the operator makes per owner) per owner. An owner
    short of any kind raises, naming it."""
    extra = 0
    for (api_version, kind), want in each.items():
        counts = Counter(
            o["metadata"]["labels"][label] for o in kube_objects.list_objects(api, api_version, kind, ns, label)
        )
        extra += sum(c - want for c in counts.values() if c > want)
        short = [n for n in names if counts[n] < want]
        if short:
            raise RuntimeError(f"{len(short)} of {len(names)} have fewer than {want} {kind}, e.g. {short[:3]}")
    return extra


CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "jobset-controller", "kueue-controller")
NODE_AGENT = "tpuforge_sandbox.agent"  # a Python process: known by its command line


def cpu_by_process() -> dict[str, float]:
    """CPU seconds (user + system) so far of this benchmark (its clients) and of the sandbox's control plane."""
    me = psutil.Process()
    times = me.cpu_times()
    out = {"clients": times.user + times.system}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            name = child.name()
            if name not in CONTROL_PLANE:
                name = "node-agent" if NODE_AGENT in child.cmdline() else ""
            if name:
                t = child.cpu_times()
                out[name] = out.get(name, 0.0) + t.user + t.system
    return out


def cpu_spent(before: dict[str, float]) -> dict[str, float]:
    now = cpu_by_process()
    return {k: round(v - before.get(k, 0.0), 1) for k, v in now.items()}


def forced_watch_closes(sandbox: Sandbox) -> Counter[str]:
    """Watches the apiserver has closed so far because they fell behind ("Forcing watcher close due to
    unresponsiveness"), by the type it names: *unstructured.Unstructured is a custom resource's watch, such as
    the operator's of FineTuneJobs. The watcher reconnects from where it was; a starved apiserver replays
    what it missed, and may close it again."""
    log = sandbox.config.logs_dir / "kube-apiserver.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return Counter(line.rsplit(" ", 1)[-1] for line in lines if "Forcing watcher close due to unresponsiveness" in line)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def metric(port: int, name: str) -> float:
    """The sum of a metric's series (e.g. tpuforge_reconcile_total of both kinds) on /metrics at `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{"))
