"""The merge benchmark (benchmarks/merge_throughput.py) run small, on the tiny model's shapes in the 31B's
multimodal bf16 layout: every step (plain copy, storage-layer copy, streamed merge, on the local disk and on
fake-gcs-server) runs in its own process to the end, and the report names each. The figures are the
benchmark's, at its own sizes (docs/performance.md), and not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_small_merge_run_measures_every_step(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "merge_throughput.py"), "--model", "gemma4-tiny-mm"]
    argv += ["--layers", "1", "--rounds", "1", "--no-whole-model", "--workdir", str(tmp_path / "w")]
    run = subprocess.run([*argv, "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = json.loads(out.read_text())
    steps = {(r["layers"], r["where"], r["what"]) for r in rows}
    assert steps == {
        (1, "local", "cp"),
        (1, "local", "copy"),
        (1, "local", "merge"),
        (1, "gcs", "copy"),
        (1, "gcs", "merge"),
        (2, "local", "cp"),
        (2, "local", "copy"),
        (2, "local", "merge"),
    }
    assert all(r["seconds"] > 0 and r["peak_rss_gb"] > 0 for r in rows)
    for layers, where in ((1, "local"), (1, "gcs"), (2, "local")):
        assert f"merge vs copy, {layers} layers, {where}: median" in run.stdout
    assert "streamed merge peak RSS, 2 vs 1 layers" in run.stdout
