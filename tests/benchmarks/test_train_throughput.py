"""The training benchmark (benchmarks/train_throughput.py) on the tiny model: it trains the trainer's own step
on random weights, and its FLOP count (from shapes alone, as the preflight counts) is the one the measured rows
divide by."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_spread_weights_are_bounded_varied_and_in_the_asked_dtype() -> None:
    import jax.numpy as jnp
    from benchmarks.train_throughput import spread

    w = np.asarray(spread(jnp.uint32(3), (64, 48), jnp.bfloat16).astype(jnp.float32))
    other = np.asarray(spread(jnp.uint32(4), (64, 48), jnp.bfloat16).astype(jnp.float32))
    assert spread(jnp.uint32(3), (2, 2), jnp.bfloat16).dtype == jnp.bfloat16
    assert np.abs(w).max() <= 0.02 * (1 + 2**-7) and 0.005 < w.std() < 0.02
    assert len(np.unique(w)) > 500  # not a pattern of a few values
    assert not np.array_equal(w, other)  # each leaf its own


def test_the_benchmark_trains_the_tiny_model_and_counts_its_flops(tmp_path: Path) -> None:
    from benchmarks.train_throughput import main

    out = tmp_path / "rows.jsonl"
    args = ["--model", "gemma4-tiny", "--layers", "0", "--seq", "64", "--batch", "2", "--json", str(out)]
    assert main([*args, "--steps", "2", "--warmup", "1"]) == 0
    baseline, measured = (json.loads(line) for line in out.read_text().splitlines())
    assert main([*args, "--flops-only", str(measured["devices"])]) == 0
    counted = json.loads(out.read_text().splitlines()[-1])
    assert baseline["baseline"] == "bf16 matmul" and baseline["tflops"] > 0
    assert "error" not in measured, measured
    assert measured["layers"] == 2 and measured["stepSeconds"] > 0
    tokens = 2 * 64 * measured["devices"]  # micro batch 2 on each device (fsdp over them all)
    assert measured["tokensPerSecond"] == pytest.approx(tokens / measured["stepSeconds"], rel=1e-3)
    assert math.isfinite(measured["lossLast"])
    # One count for both: the measured row's FLOPs (per device) are the shapes-only count's.
    assert measured["tflopsPerStep"] == counted["tflopsPerStep"] > 0
    assert counted["gflopsPerToken"] == pytest.approx(counted["tflopsPerStep"] * 1e3 / 128, rel=1e-3)
