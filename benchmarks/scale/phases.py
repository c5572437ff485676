"""The phases of the operator-at-scale benchmark in order (baseline, burst, settling, baseline again, steady, the
duplicates check; with --burst-only, the first two), each printing its figure as it ends, and the results
against the targets. One Kind at a time (workload.FINETUNEJOB, serving.SERVINGDEPLOYMENT)."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.scale import serving
from benchmarks.scale.observe import (
    Arrivals,
    cpu_by_process,
    cpu_spent,
    duplicates,
    forced_watch_closes,
    percentile,
    pods_decided,
    quiet_for,
    settle,
)
from benchmarks.scale.processes import OperatorProcess, Profiler
from benchmarks.scale.workload import (
    FINETUNEJOB,
    Kind,
    baseline_names,
    create_all,
    namespace,
    run_baseline,
    run_steady,
)
from kubernetes import client

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.controllers.finetune.attempts import UNSCHEDULABLE_REPORT_SECONDS
from tpuforge.controllers.runtime.controller import API_CONCURRENCY
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox

TARGET_BURST_RATIO = 1.5
TARGET_P99_SECONDS = 1.0
TARGET_RSS_MB = 250.0
TARGET_CPU_MS_PER_OBJECT = 8.0
BURST_TIMEOUT_SECONDS = 1200.0


def restart_midway(
    operator: OperatorProcess, arrivals: Arrivals, names: set[str], out: dict[str, float]
) -> threading.Thread:
    """Once half of `names` are handled, restart the operator (in a thread, while the burst goes on); `out`
    gets when it stopped and how long until the new one served."""

    def run() -> None:
        deadline = time.monotonic() + BURST_TIMEOUT_SECONDS
        while arrivals.count(names) < len(names) // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        out["handled_at_restart"] = arrivals.count(names)
        out["at"] = time.monotonic()
        try:
            out["seconds"] = operator.restart()
        except Exception as exc:  # the burst's wait then times out; this says why
            print(f"  (the operator's restart failed: {exc})", flush=True)
            raise
        print(
            f"  operator restarted with {out['handled_at_restart']:.0f} of {len(names)} handled; the new one "
            f"served {out['seconds']:.1f} s after the stop",
            flush=True,
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def measure(
    api: client.ApiClient, sandbox: Sandbox, tmp: Path, args: argparse.Namespace, ns_name: Callable[[str], str]
) -> dict[str, Any]:
    kind: Kind = serving.SERVINGDEPLOYMENT if args.kind == "servingdeployment" else FINETUNEJOB
    n = args.jobs
    load_start = os.getloadavg()[0]
    print(f"baseline: one client makes the operator's writes for {n} {kind.name}s, {API_CONCURRENCY} threads ...")
    closes0 = forced_watch_closes(sandbox)
    base_ns = namespace(api, ns_name("baseline-before"))
    before, writes, baseline_cpu = run_baseline(api, kind, n, base_ns)
    closes1 = forced_watch_closes(sandbox)
    print(f"  {writes} writes per object: {before:.1f} s; CPU seconds {baseline_cpu}", flush=True)
    aftermath = {"before": baseline_aftermath(api, kind, base_ns, n, args.settle_timeout)}
    closes2 = forced_watch_closes(sandbox)

    ns, steady_ns = namespace(api, ns_name("burst")), namespace(api, ns_name("steady"))
    cprofile = args.profile if args.profile and args.profile.suffix == ".prof" else None
    operator = OperatorProcess(sandbox, tmp / "operator.log", [ns, steady_ns], cprofile)
    try:
        arrivals = kind.arrivals(api, ns)
        names = [f"burst-{i:05d}" for i in range(n)]
        restart: dict[str, float] = {}
        restarter = restart_midway(operator, arrivals, set(names), restart) if args.restart_midway else None
        print(f"burst: {n} {kind.name}s; the time until each has {kind.done_what} ...", flush=True)
        profiler = Profiler(operator.proc.pid, args.profile) if args.profile and not cprofile else None
        cpu0, sys0, threads0 = operator.cpu_seconds(), operator.system_cpu_seconds(), operator.thread_cpu_seconds()
        others0, requests0 = cpu_by_process(), serving.apiserver_requests(api)
        start = time.monotonic()
        sent = create_all(api, kind, ns, names)
        created = time.monotonic() - start
        burst = arrivals.wait(set(names), BURST_TIMEOUT_SECONDS) - start
        if restarter is not None:
            restarter.join()
            if "seconds" not in restart:
                raise RuntimeError("the operator's restart did not finish (see above)")
        latencies = sorted(arrivals.seen[x] - sent[x] for x in names)
        burst_cpu = {**cpu_spent(others0), "operator": round(operator.cpu_seconds() - cpu0, 1)}
        closes = {"baseline": dict(closes1 - closes0), "burst": dict(forced_watch_closes(sandbox) - closes2)}
        print(
            f"  created in {created:.1f} s; every one handled after {burst:.1f} s ({burst / before:.2f}x the "
            f"baseline before); latency p50 {percentile(latencies, 50):.2f} s, p99 {percentile(latencies, 99):.2f} s;"
            f" CPU seconds {burst_cpu}",
            flush=True,
        )
        live_cpu = operator.cpu_seconds() - cpu0
        live_sys = operator.system_cpu_seconds() - sys0
        threads = {t: c - threads0.get(t, 0.0) for t, c in operator.thread_cpu_seconds().items()}
        loop_cpu = threads.pop(operator.proc.pid, 0.0)
        busiest = sorted(threads.values(), reverse=True)
        if profiler is not None:
            profiler.stop()
        arrivals.stop()
        common = {
            "kind": kind.name,
            "objects": n,
            "load_average_at_start": round(load_start, 1),
            "operator_restarted_midway": bool(restart),
            **(
                {
                    "restart_handled_before": int(restart["handled_at_restart"]),
                    "restart_at_seconds": round(restart["at"] - start, 2),
                    "restart_seconds": round(restart["seconds"], 2),
                }
                if restart
                else {}
            ),
            "baseline_writes_per_object": writes,
            "created_seconds": round(created, 2),
            "burst_seconds": round(burst, 2),
            "cpu_seconds_baseline_before": baseline_cpu,
            "baseline_pods_decided_seconds": aftermath,
            "cpu_seconds_burst": burst_cpu,
            "apiserver_forced_watch_closes": closes,
            "burst_latency_p50_seconds": round(percentile(latencies, 50), 3),
            "burst_latency_p99_seconds": round(percentile(latencies, 99), 3),
            "operator_cpu_seconds_burst": round(live_cpu, 1),
            "operator_cpu_ms_per_object": round(live_cpu * 1000 / n, 1),
            "operator_cpu_ms_per_object_target": TARGET_CPU_MS_PER_OBJECT,
        }
        each = kind.writes(kube_objects.get(api, API_VERSION, kind.name, ns, names[0]) or {}).children()
        if args.burst_only:
            return {
                **common,
                "baseline_seconds": round(before, 2),
                "burst_ratio": round(burst / before, 2),
                "operator_system_cpu_seconds_burst": round(live_sys, 1),
                "operator_event_loop_cpu_seconds_burst": round(loop_cpu, 1),
                "operator_other_threads_cpu_seconds_burst": [len(busiest), round(sum(busiest), 1)],
                "operator_busiest_threads_cpu_seconds": [round(c, 2) for c in busiest[:8]],
                "reconciles": operator.metric("tpuforge_reconcile_total"),
                "duplicates": duplicates(api, kind.label, ns, names, each),
            }
        print(
            f"settling: every pod placed or reported unschedulable, then no reconcile for {args.quiet:g} s "
            f"(at most {args.settle_timeout:g} s) ...",
            flush=True,
        )
        settled = settle(api, kind.label, ns, names, operator, args.settle_timeout, args.quiet)
        decided_by = time.monotonic()  # every burst pod placed or refused by now
        settled_cpu = operator.cpu_seconds() - cpu0
        requests = (
            serving.writes(requests0, serving.apiserver_requests(api)) if kind is serving.SERVINGDEPLOYMENT else {}
        )
        live_rss = operator.peak_rss_mb()
        print(
            f"  settled after {settled.seconds:.1f} s; operator CPU {settled_cpu:.1f} s since the burst began, "
            f"peak RSS {live_rss:.0f} MB with {n} live",
            flush=True,
        )
        print("baseline again, so that the burst is bracketed by two ...", flush=True)
        base_ns = namespace(api, ns_name("baseline-after"))
        after, _, _ = run_baseline(api, kind, n, base_ns)
        baseline = (before + after) / 2
        print(f"  {after:.1f} s; burst over the mean of both: {burst / baseline:.2f}x", flush=True)
        aftermath["after"] = baseline_aftermath(api, kind, base_ns, n, args.settle_timeout)

        reports_wait = wait_for_late_reports(kind, operator, start, decided_by, args)

        steady = kind.arrivals(api, steady_ns)
        steady_names = [f"steady-{i:05d}" for i in range(max(2, int(args.rate * args.duration)))]
        print(f"steady: {args.rate:g}/s for {args.duration:g} s with {n} live ...", flush=True)
        steady_cpu0, steady_start = operator.cpu_seconds(), time.monotonic()
        reconcile0, writes0 = reconcile_seconds(operator), serving.apiserver_write_seconds(api)
        timed = run_steady(api, kind, steady, steady_ns, steady_names, args.rate)
        steady_cpu = (operator.cpu_seconds() - steady_cpu0) / (time.monotonic() - steady_start)
        reconcile1, writes1 = reconcile_seconds(operator), serving.apiserver_write_seconds(api)
        lat = sorted(latency for _, latency in timed)
        # The slowest, with when each was sent: a tail that comes together is one stall, not the operator's pace.
        slowest = sorted(timed, key=lambda t: -t[1])[:10]
        steady.stop()
        reports = late_reports(api, kind, ns)
        steady_reconciles = int(reconcile1[1] - reconcile0[1])
        reconcile_mean = (reconcile1[0] - reconcile0[0]) / max(steady_reconciles, 1)
        write_mean = (writes1[0] - writes0[0]) / max(writes1[1] - writes0[1], 1)
        print(
            f"  create -> {kind.done_what}: p50 {percentile(lat, 50):.3f} s, p90 {percentile(lat, 90):.3f} s, p99 "
            f"{percentile(lat, 99):.3f} s (the slowest sent at "
            + ", ".join(f"{t:.1f} s" for t, _ in slowest[:6])
            + "); the "
            f"operator used {steady_cpu:.2f} of a core; load average {os.getloadavg()[0]:.1f}"
            + (f"; {reports} of the burst reported their pods unschedulable by its end" if reports else ""),
            flush=True,
        )
        print(
            f"  {steady_reconciles} reconciles, {reconcile_mean:.3f} s each on average (the operator's time, its "
            f"API calls' waits included); the apiserver's own time per write (every client's) {write_mean:.3f} s",
            flush=True,
        )
        peak_rss = operator.peak_rss_mb()
        dup = duplicates(api, kind.label, ns, names, each) + duplicates(api, kind.label, steady_ns, steady_names, each)
        print(f"check: {dup} children beyond what the operator makes per {kind.name}", flush=True)
        conflicts = operator.metric("tpuforge_reconcile_conflicts_total")
        reconciles = operator.metric("tpuforge_reconcile_total")
    finally:
        operator.stop()
    return {
        **common,
        "baseline_seconds_before_after": [round(before, 2), round(after, 2)],
        "baseline_seconds": round(baseline, 2),
        "burst_ratio": round(burst / baseline, 2),
        "burst_ratio_target": TARGET_BURST_RATIO,
        **settled.result(),
        "operator_cpu_seconds_settled": round(settled_cpu, 1),
        **({"apiserver_requests_burst_and_settling": requests} if requests else {}),
        "steady_rate_per_second": args.rate,
        "steady_seconds": args.duration,
        "steady_p50_seconds": round(percentile(lat, 50), 3),
        "steady_p99_seconds": round(percentile(lat, 99), 3),
        "steady_p99_target": TARGET_P99_SECONDS,
        "steady_p90_seconds": round(percentile(lat, 90), 3),
        "steady_slowest_sent_at_and_latency_seconds": [[round(t, 2), round(x, 3)] for t, x in slowest],
        "unschedulable_reports_by_end_of_steady": reports,
        "steady_waited_for_late_reports_seconds": reports_wait,
        "operator_cores_used_steady": round(steady_cpu, 2),
        "steady_reconciles": steady_reconciles,
        "steady_reconcile_mean_seconds": round(reconcile_mean, 3),
        "steady_apiserver_write_mean_seconds": round(write_mean, 3),
        "operator_system_cpu_seconds_burst": round(live_sys, 1),
        "operator_rss_mb_at_objects_live": round(live_rss, 1),
        "operator_peak_rss_mb": round(peak_rss, 1),
        "rss_target_mb": TARGET_RSS_MB,
        "reconciles": reconciles,
        "status_conflicts": conflicts,
        "duplicates": dup,
    }


def baseline_aftermath(api: client.ApiClient, kind: Kind, ns: str, n: int, timeout: float) -> float:
    """Wait (untimed) until the baseline's objects have their pods, each placed or reported unschedulable: the
    controllers' work on what the baseline wrote (the Job controller's pods, the Deployments' ReplicaSets') then
    does not fall into the phase after it. The burst makes its own pods while it runs, as the baseline did;
    without this wait it would also carry the baseline's. The seconds waited."""
    start = time.monotonic()
    why = pods_decided(api, kind.label, ns, baseline_names(n), start + timeout)
    seconds = time.monotonic() - start
    if why is None:
        print(f"  the baseline's pods each placed or reported unschedulable {seconds:.1f} s later", flush=True)
    else:
        print(f"  (the baseline's pods: {why}; going on)", flush=True)
    return round(seconds, 1)


def reconcile_seconds(operator: OperatorProcess) -> tuple[float, float]:
    """The operator's reconcile time and count so far, both kinds (tpuforge_reconcile_duration_seconds; the
    running process's: take both ends of a phase from one process)."""
    return (
        operator.metric("tpuforge_reconcile_duration_seconds_sum"),
        operator.metric("tpuforge_reconcile_duration_seconds_count"),
    )


REPORTS_MARGIN_SECONDS = 30.0


def wait_for_late_reports(
    kind: Kind, operator: OperatorProcess, burst_start: float, decided_by: float, args: argparse.Namespace
) -> float:
    """The operator reports a FineTuneJob's training pod unschedulable UNSCHEDULABLE_REPORT_SECONDS after the
    pod was refused (a status write and an Event each): on a sandbox with no TPU nodes, every burst job does,
    a wave that is the burst's aftermath, not the steady state. When the steady phase would overlap it (no pod
    was refused before the burst began, and every one by `decided_by`), wait until it has passed and the
    operator is quiet again. The seconds waited (0: the steady phase ends before the first report is due)."""
    now = time.monotonic()
    if (
        kind is not FINETUNEJOB
        or now + args.duration + REPORTS_MARGIN_SECONDS < burst_start + UNSCHEDULABLE_REPORT_SECONDS
    ):
        return 0.0
    until = decided_by + UNSCHEDULABLE_REPORT_SECONDS
    print(
        f"waiting {until - now:.0f} s for the burst's delayed unschedulable reports (due "
        f"{UNSCHEDULABLE_REPORT_SECONDS:.0f} s after each pod was refused), then for the operator to be quiet ...",
        flush=True,
    )
    time.sleep(max(0.0, until - now))
    if not quiet_for(operator, args.quiet, time.monotonic() + args.settle_timeout):
        print(f"  (the operator never went {args.quiet:g} s without a reconcile; going on)", flush=True)
    waited = time.monotonic() - now
    print(f"  waited {waited:.1f} s", flush=True)
    return round(waited, 1)


def late_reports(api: client.ApiClient, kind: Kind, ns: str) -> int:
    """FineTuneJobs of the burst whose status says that their training pod is unschedulable: the operator
    says so UNSCHEDULABLE_REPORT_SECONDS after the pod was refused, a wave of status writes that a steady phase
    running that late measures too."""
    if kind.name != FINETUNEJOB_KIND:
        return 0
    ftjs = kube_objects.list_objects(api, API_VERSION, kind.name, ns)
    return sum(
        any(c.get("reason") == "Unschedulable" for c in (f.get("status") or {}).get("conditions") or []) for f in ftjs
    )
