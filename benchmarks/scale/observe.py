"""What the operator-at-scale benchmark watches and counts: when each training Job appears, the cluster
settling after the burst, children beyond one of each kind, the CPU seconds of the clients and of the control
plane, the watches the apiserver closed for falling behind, the operator's metrics, and percentiles."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import psutil
from benchmarks.scale.processes import OperatorProcess
from kubernetes import client

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.controllers.finetune.attempts import UNSCHEDULABLE_REPORT_SECONDS
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox, wait_for

CHILD_KINDS = {
    "ServiceAccount": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ConfigMap": "v1",
    "Job": "batch/v1",
}


class JobWatch:
    """Local receive time of each new Job's first event in a namespace (a LIST, then a WATCH that resumes
    where it broke off)."""

    def __init__(self, api: client.ApiClient, ns: str):
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._api, self._ns = api, ns
        _, version = kube_objects.list_collection(api, "batch/v1", "Job", ns)
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            try:
                for event in kube_client.WatchStream(
                    self._api, "batch/v1", "Job", self._ns, version, timeout_seconds=60
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"watch error: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "ADDED":
                        self.seen.setdefault(obj["metadata"]["name"], time.monotonic())
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a dropped stream: resume from the last version seen
                print(f"  (job watch: {exc}; resuming)", flush=True)
                time.sleep(0.2)

    def wait(self, names: set[str], timeout: float) -> float:
        def arrived() -> bool:
            return names <= self.seen.keys()

        try:
            wait_for(arrived, timeout, f"{len(names)} training Jobs", interval=0.05)
        except TimeoutError:
            missing = sorted(names - self.seen.keys())
            raise TimeoutError(f"{len(missing)} of {len(names)} training Jobs missing, e.g. {missing[:3]}") from None
        return max(self.seen[n] for n in names)

    def stop(self) -> None:
        self._stop.set()


def settle(api: client.ApiClient, ns: str, n: int, operator: OperatorProcess) -> None:
    """Wait for the burst's aftermath so that the steady phase measures the operator alone: the Job
    controller's pods, the node agent marking them unschedulable (the sandbox has no nodes), and, once they
    have waited UNSCHEDULABLE_REPORT_SECONDS, the operator reporting so in every job's status."""
    wait_for(lambda: len(kube_objects.list_objects(api, "v1", "Pod", ns)) >= n, 600, f"{n} pods", interval=1.0)

    def reported() -> bool:
        ftjs = kube_objects.list_objects(api, API_VERSION, FINETUNEJOB_KIND, ns)
        return sum(_unschedulable(f) for f in ftjs) >= n

    wait_for(reported, UNSCHEDULABLE_REPORT_SECONDS + 300, "every job to report its pod unschedulable", interval=2.0)
    last, quiet_since = -1.0, time.monotonic()
    while time.monotonic() - quiet_since < 5.0:
        now = metric(operator.port, "tpuforge_reconcile_total")
        if now != last:
            last, quiet_since = now, time.monotonic()
        time.sleep(0.5)


def _unschedulable(ftj: dict[str, Any]) -> bool:
    conds = (ftj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Training" and c.get("reason") == "Unschedulable" for c in conds)


def duplicates(api: client.ApiClient, ns: str, names: list[str]) -> int:
    """Children beyond one of each kind per FineTuneJob."""
    extra = 0
    for kind, api_version in CHILD_KINDS.items():
        counts: dict[str, int] = {}
        for obj in kube_objects.list_objects(api, api_version, kind, ns, "tpuforge.dev/finetunejob"):
            owner = obj["metadata"]["labels"]["tpuforge.dev/finetunejob"]
            counts[owner] = counts.get(owner, 0) + 1
        extra += sum(c - 1 for c in counts.values() if c > 1)
        missing = [n for n in names if n not in counts]
        if missing:
            raise RuntimeError(f"{len(missing)} FineTuneJobs have no {kind}, e.g. {missing[:3]}")
    return extra


CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager")


def cpu_by_process() -> dict[str, float]:
    """CPU seconds (user + system) so far of this benchmark (its clients) and of the sandbox's control plane."""
    me = psutil.Process()
    times = me.cpu_times()
    out = {"clients": times.user + times.system}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name() in CONTROL_PLANE:
                t = child.cpu_times()
                out[child.name()] = out.get(child.name(), 0.0) + t.user + t.system
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
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0
