"""The operator-at-scale benchmark (benchmarks/operator_scale.py) run small on the session sandbox, for both
kinds, with the operator restarted mid-burst: every phase runs to its end and prints its figure, and the
duplicates check (the script's exit code) holds. The figures themselves are not asserted here: they are the
benchmark's, at its own sizes (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PHASES = (
    "baseline:",
    "the baseline's pods",
    "burst:",
    "operator restarted",
    "settling:",
    "baseline again",
    "steady:",
    "reconciles,",
    "check:",
)
FIGURES = (
    "baseline_seconds",
    "burst_seconds",
    "burst_ratio",
    "restart_seconds",
    "settle_seconds",
    "operator_rss_mb_at_objects_live",
    "steady_p50_seconds",
    "steady_p99_seconds",
    "steady_reconcile_mean_seconds",
    "steady_apiserver_write_mean_seconds",
    "steady_waited_for_late_reports_seconds",
    "operator_cpu_seconds_burst",
)


@pytest.mark.parametrize("kind", ["finetunejob", "servingdeployment"])
def test_every_phase_runs_and_reports_on_a_small_burst(kind: str, sandbox: Sandbox, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "operator_scale.py"), "--kind", kind]
    argv += ["--sandbox-dir", str(sandbox.dir), "--jobs", "20", "--rate", "5", "--duration", "2"]
    argv += ["--quiet", "2", "--settle-timeout", "120", "--restart-midway", "--json", str(out)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    lines = run.stdout.splitlines()
    for phase in PHASES:
        at = next((i for i, line in enumerate(lines) if line.startswith(phase) or phase in line), None)
        assert at is not None, f"no {phase!r} in:\n{run.stdout[-4000:]}"
    results = json.loads(out.read_text())
    assert results["kind"] == {"finetunejob": "FineTuneJob", "servingdeployment": "ServingDeployment"}[kind]
    assert results["operator_restarted_midway"] and results["duplicates"] == 0
    assert results["settle_incomplete"] is None, results["settle_incomplete"]
    missing = [k for k in FIGURES if not isinstance(results.get(k), int | float)]
    assert not missing, f"no figure for {missing}: {results}"
    # Both baselines' pods were waited for before the phase after each.
    assert set(results["baseline_pods_decided_seconds"]) == {"before", "after"}, results
    # Its namespaces are gone from the shared sandbox (or going).
    with sandbox.api_client() as api:
        namespaces = kube_objects.list_objects(api, "v1", "Namespace", None)
    left = [
        ns["metadata"]["name"]
        for ns in namespaces
        if ns["metadata"]["name"].startswith("bench-") and ns["status"]["phase"] == "Active"
    ]
    assert not left, left
