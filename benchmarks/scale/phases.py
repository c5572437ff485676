"""The phases of the operator-at-scale benchmark in order (baseline, burst, settling, baseline again, steady,
the duplicates check; with --burst-only, the first two), and the results each reports against its target."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks.scale.observe import (
    JobWatch,
    cpu_by_process,
    cpu_spent,
    duplicates,
    forced_watch_closes,
    metric,
    percentile,
    settle,
)
from benchmarks.scale.processes import OperatorProcess, Profiler
from benchmarks.scale.workload import create_all, namespace, run_baseline, run_steady
from kubernetes import client

from tpuforge.controllers.finetune.attempts import UNSCHEDULABLE_REPORT_SECONDS
from tpuforge.controllers.finetune.controller import API_CONCURRENCY
from tpuforge.manifests.finetune_common import train_job_name
from tpuforge_sandbox import Sandbox

TARGET_BURST_RATIO = 1.5
TARGET_P99_SECONDS = 1.0
TARGET_RSS_MB = 250.0
TARGET_CPU_MS_PER_JOB = 8.0


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
                "reconciles": metric(operator.port, "tpuforge_reconcile_total"),
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
        conflicts = metric(operator.port, "tpuforge_reconcile_conflicts_total")
        reconciles = metric(operator.port, "tpuforge_reconcile_total")
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
