"""FineTuneJob operator at scale, on a sandbox of its own (real kube-apiserver, kube-controller-manager).

Phases, all in one run against the same apiserver:
  baseline  for N FineTuneJobs created beforehand (untimed, no operator), one client makes exactly the writes
            the operator makes for each, computed by the operator's own decision code: the ServiceAccount,
            Role, RoleBinding, ConfigMap and Job, the status, the Event; with as many threads as the
            operator makes API calls at once
  burst     the operator runs; one client creates N FineTuneJobs as fast as it can; the time until every one
            has its training Job, over the baseline's time (target <= 1.5). The burst also holds the N
            creates themselves, which the baseline does not. The baseline runs before the burst and again
            after it (other load on the machine drifts): the ratio is over their mean
  live      the operator's CPU seconds for the burst; its peak RSS (target <= 250 MB) with the N jobs live,
            once the cluster has settled (pods created, then reported unschedulable: the sandbox has no nodes)
  steady    R FineTuneJobs per second for D seconds, with the N jobs live; create -> training Job latency
            p50/p99 (target p99 <= 1 s)
  check     every FineTuneJob has exactly one of each child (duplicates must be 0)

The sandbox has no nodes, so no pod runs: the numbers are the control plane's and the operator's alone.
Each phase also reports the CPU seconds of each process and the watches the apiserver closed because they
fell behind (apiserver_forced_watch_closes): on a saturated machine these are what move the ratio.

    python benchmarks/operator_scale.py                    # 1000 jobs, 10/s for 60 s
    python benchmarks/operator_scale.py --jobs 200 --duration 20 --json out.json
    python benchmarks/operator_scale.py --jobs 500 --burst-only --profile burst.prof   # where the CPU goes
    python benchmarks/operator_scale.py --load 2           # the same with two busy processes beside it

--load K starts K processes that spin on the CPU (at the same priority) before the first baseline and stops
them at the end: a loaded machine that every run can reproduce, where other work's load is whatever it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator")]

import psutil  # noqa: E402
from kubernetes import client  # noqa: E402

from tpuforge import crds, kube_client, kube_events, kube_objects  # noqa: E402
from tpuforge.api import FineTuneJobStatus  # noqa: E402
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND  # noqa: E402
from tpuforge.controllers.finetune_attempts import UNSCHEDULABLE_REPORT_SECONDS  # noqa: E402
from tpuforge.controllers.finetune_plan import Event, Observed, plan, status_patch  # noqa: E402
from tpuforge.controllers.finetunejob import API_CONCURRENCY, creation_groups  # noqa: E402
from tpuforge.manifests.finetune_common import train_job_name  # noqa: E402
from tpuforge.sandbox import Ports, Sandbox, wait_for  # noqa: E402
from tpuforge.sandbox.procs import free_port  # noqa: E402

TARGET_BURST_RATIO = 1.5
TARGET_P99_SECONDS = 1.0
TARGET_RSS_MB = 250.0
TARGET_CPU_MS_PER_JOB = 8.0
CHILD_KINDS = {
    "ServiceAccount": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ConfigMap": "v1",
    "Job": "batch/v1",
}


def spec(name: str) -> dict[str, Any]:
    return {
        "model": {"name": "gemma4-31b", "uri": "gs://bench/models/gemma4-31b"},
        "dataset": {"uri": "gs://bench/data/train.jsonl"},
        "training": {"maxSeqLen": 3072},
        "tpu": {"slice": "v5p-8"},
        "checkpoint": {"uri": f"gs://bench/jobs/{name}/checkpoints"},
        "output": {"uri": f"gs://bench/jobs/{name}/merged"},
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


class OperatorProcess:
    def __init__(self, sandbox: Sandbox, log: Path, namespaces: list[str], cprofile: Path | None = None):
        self.port = free_port()
        argv = [
            sys.executable,
            *(["-m", "cProfile", "-o", str(cprofile)] if cprofile else []),
            "-m",
            "tpuforge.cli",
            "operator",
            "--kubeconfig",
            str(sandbox.kubeconfig),
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.port),
            *(arg for ns in namespaces for arg in ("--namespace", ns)),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        self.ps = psutil.Process(self.proc.pid)
        wait_for(self._ready, 60, "the operator's /metrics")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2):
                return True
        except OSError:
            return False

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float(self.ps.memory_info().rss / 2**20)

    def cpu_seconds(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def thread_cpu_seconds(self) -> dict[int, float]:
        """CPU seconds of each of the operator's threads, by thread id (the event loop's is the pid)."""
        out: dict[int, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def system_cpu_seconds(self) -> float:
        return float(self.ps.cpu_times().system)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            print("  (the operator did not stop within 30 s of SIGTERM; killed)", flush=True)
            self.proc.kill()
            self.proc.wait(10)


class Profiler:
    """py-spy sampling the operator's running threads (idle ones, waiting on a socket or a lock, are left
    out), without pausing it, until `stop`."""

    def __init__(self, pid: int, out: Path):
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        argv = [py_spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "100", "--output", str(out)]
        if out.suffix != ".svg":
            argv += ["--format", "raw"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # attached before the burst starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)


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
        now = _metric(operator.port, "tpuforge_reconcile_total")
        if now != last:
            last, quiet_since = now, time.monotonic()
        time.sleep(0.5)


def _unschedulable(ftj: dict[str, Any]) -> bool:
    conds = (ftj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Training" and c.get("reason") == "Unschedulable" for c in conds)


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


class CpuLoad:
    """K processes spinning on the CPU, as other work on a shared machine would."""

    def __init__(self, processes: int) -> None:
        spin = "while True:\n    pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000, help="FineTuneJobs in the burst (default 1000)")
    p.add_argument("--rate", type=float, default=10.0, help="steady creations per second (default 10)")
    p.add_argument("--duration", type=float, default=60.0, help="steady phase seconds (default 60)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--operator-log", type=Path, help="keep the operator's log here")
    p.add_argument(
        "--profile",
        type=Path,
        help="profile the operator: py-spy during the burst, its flame graph (.svg) or raw stacks (.txt); or, "
        "for a .prof path, cProfile of its event loop thread for the whole run (with --burst-only: the burst)",
    )
    p.add_argument(
        "--burst-only",
        action="store_true",
        help="stop after the burst (no settling, second baseline or steady phase): for profiling",
    )
    p.add_argument("--load", type=int, default=0, help="CPU-spinning processes to run beside it (default 0)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpuforge-bench-") as tmp_s:
        tmp = Path(tmp_s)
        crd_dir = tmp / "crds"
        crd_dir.mkdir()
        for kind in crds.KINDS:
            (crd_dir / crds.filename(kind)).write_text(crds.render(kind))
        sandbox = Sandbox(tmp / "sandbox", ports=Ports.free(), nodes="", crds_dir=crd_dir, attach=True, log=print)
        sandbox.up(timeout=180)
        load = CpuLoad(args.load)
        try:
            kube_client.configure(sandbox.kubeconfig)
            api = kube_client.api_client()
            results = {"load_processes": args.load, **measure(api, sandbox, tmp, args)}
        finally:
            load.stop()
            sandbox.down()
            if args.operator_log and (tmp / "operator.log").exists():
                shutil.copyfile(tmp / "operator.log", args.operator_log)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if results["duplicates"] else 0


def measure(api: client.ApiClient, sandbox: Sandbox, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    print(f"baseline: one client makes the operator's writes for {n} FineTuneJobs, {API_CONCURRENCY} threads ...")
    closes0 = forced_watch_closes(sandbox)
    before, writes, baseline_cpu = run_baseline(api, n, "bench-baseline-before")
    closes1 = forced_watch_closes(sandbox)
    print(f"  {writes} writes per job: {before:.1f} s; CPU seconds {baseline_cpu}", flush=True)

    ns, steady_ns = namespace(api, "bench-burst"), namespace(api, "bench-steady")
    cprofile = args.profile if args.profile and args.profile.suffix == ".prof" else None
    operator = OperatorProcess(sandbox, tmp / "operator.log", [ns, steady_ns], cprofile)
    try:
        jobs = JobWatch(api, ns)
        names = [f"burst-{i:05d}" for i in range(n)]
        print(f"burst: {n} FineTuneJobs ...", flush=True)
        profiler = Profiler(operator.proc.pid, args.profile) if args.profile and not cprofile else None
        cpu0, sys0, threads0 = operator.cpu_seconds(), operator.system_cpu_seconds(), operator.thread_cpu_seconds()
        others0 = cpu_by_process()
        start = time.monotonic()
        sent = create_all(api, ns, names)
        created = time.monotonic() - start
        last = jobs.wait({train_job_name(x, 0) for x in names}, 600)
        burst = last - start
        burst_latencies = sorted(jobs.seen[train_job_name(x, 0)] - sent[x] for x in names)
        burst_cpu = {**cpu_spent(others0), "operator": round(operator.cpu_seconds() - cpu0, 1)}
        closes = {"baseline": dict(closes1 - closes0), "burst": dict(forced_watch_closes(sandbox) - closes1)}
        print(f"  created in {created:.1f} s; every training Job after {burst:.1f} s; CPU seconds {burst_cpu}")
        live_cpu = operator.cpu_seconds() - cpu0
        live_sys = operator.system_cpu_seconds() - sys0
        threads = {t: c - threads0.get(t, 0.0) for t, c in operator.thread_cpu_seconds().items()}
        loop_cpu = threads.pop(operator.proc.pid, 0.0)
        busiest = sorted(threads.values(), reverse=True)
        if profiler is not None:
            profiler.stop()
        jobs.stop()
        if args.burst_only:
            return {
                "jobs": n,
                "baseline_seconds": round(before, 2),
                "burst_seconds": round(burst, 2),
                "burst_ratio": round(burst / before, 2),
                "cpu_seconds_baseline": baseline_cpu,
                "cpu_seconds_burst": burst_cpu,
                "apiserver_forced_watch_closes": closes,
                "burst_latency_p50_seconds": round(percentile(burst_latencies, 50), 3),
                "burst_latency_p99_seconds": round(percentile(burst_latencies, 99), 3),
                "operator_cpu_seconds_burst": round(live_cpu, 1),
                "operator_cpu_ms_per_job": round(live_cpu * 1000 / n, 1),
                "operator_system_cpu_seconds_burst": round(live_sys, 1),
                "operator_event_loop_cpu_seconds_burst": round(loop_cpu, 1),
                "operator_other_threads_cpu_seconds_burst": [len(busiest), round(sum(busiest), 1)],
                "operator_busiest_threads_cpu_seconds": [round(c, 2) for c in busiest[:8]],
                "reconciles": _metric(operator.port, "tpuforge_reconcile_total"),
                "duplicates": duplicates(api, ns, names),
            }
        print(
            f"  settling: pods created, reported unschedulable after {UNSCHEDULABLE_REPORT_SECONDS:.0f} s ...",
            flush=True,
        )
        settle(api, ns, n, operator)
        live_rss = operator.peak_rss_mb()
        print("baseline again, so that the burst is bracketed by two ...", flush=True)
        after, _, _ = run_baseline(api, n, "bench-baseline-after")
        print(f"  {after:.1f} s", flush=True)

        steady_jobs = JobWatch(api, steady_ns)
        print(f"steady: {args.rate:g}/s for {args.duration:g} s with {n} jobs live ...", flush=True)
        lat = run_steady(api, steady_jobs, steady_ns, args.rate, args.duration)
        steady_jobs.stop()
        peak_rss = operator.peak_rss_mb()
        dup = duplicates(api, ns, names) + duplicates(
            api, steady_ns, [f"steady-{i:05d}" for i in range(int(args.rate * args.duration))]
        )
        conflicts = _metric(operator.port, "tpuforge_reconcile_conflicts_total")
        reconciles = _metric(operator.port, "tpuforge_reconcile_total")
    finally:
        operator.stop()
    baseline = (before + after) / 2
    ratio = burst / baseline
    return {
        "jobs": n,
        "baseline_writes_per_job": writes,
        "baseline_seconds_before_after": [round(before, 2), round(after, 2)],
        "baseline_seconds": round(baseline, 2),
        "burst_seconds": round(burst, 2),
        "burst_ratio": round(ratio, 2),
        "burst_ratio_target": TARGET_BURST_RATIO,
        "cpu_seconds_baseline_before": baseline_cpu,
        "cpu_seconds_burst": burst_cpu,
        "apiserver_forced_watch_closes": closes,
        "burst_latency_p50_seconds": round(percentile(burst_latencies, 50), 3),
        "burst_latency_p99_seconds": round(percentile(burst_latencies, 99), 3),
        "steady_rate_per_second": args.rate,
        "steady_seconds": args.duration,
        "steady_p50_seconds": round(percentile(lat, 50), 3),
        "steady_p99_seconds": round(percentile(lat, 99), 3),
        "steady_p99_target": TARGET_P99_SECONDS,
        "operator_cpu_seconds_burst": round(live_cpu, 1),
        "operator_cpu_ms_per_job": round(live_cpu * 1000 / n, 1),
        "operator_cpu_ms_per_job_target": TARGET_CPU_MS_PER_JOB,
        "operator_system_cpu_seconds_burst": round(live_sys, 1),
        "operator_rss_mb_at_jobs_live": round(live_rss, 1),
        "operator_peak_rss_mb": round(peak_rss, 1),
        "rss_target_mb": TARGET_RSS_MB,
        "reconciles": reconciles,
        "status_conflicts": conflicts,
        "duplicates": dup,
    }


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
