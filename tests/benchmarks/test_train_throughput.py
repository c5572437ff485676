"""The training benchmark (benchmarks/train_throughput.py) on the tiny model: it trains the trainer's own step
on random weights, each configuration in a process of its own, with the compiled step's memory, the model's
FLOPs beside XLA's count (from shapes alone, as the preflight counts), and the loss per token; and its cuts
of the 31B keep both attention kinds."""

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


def test_a_cut_keeps_one_layer_of_each_attention_kind_or_is_refused() -> None:
    from benchmarks.train_throughput import CutError, decoder

    sliding, full = "sliding_attention", "full_attention"
    whole = decoder("gemma4-31b", 0)
    assert whole.layer_types[:6] == (sliding,) * 5 + (full,)  # the 31B's first global layer is its sixth
    assert decoder("gemma4-31b", 2).layer_types == (sliding, full)
    assert decoder("gemma4-31b", 4).layer_types == (sliding,) * 3 + (full,)
    assert decoder("gemma4-31b", 6).layer_types == whole.layer_types[:6]
    assert decoder("qwen3-8b", 1).layer_types == (full,)
    with pytest.raises(CutError, match="--layers 1: gemma4-31b has 2 attention kinds"):
        decoder("gemma4-31b", 1)


def test_model_flops_count_causal_and_sliding_attention_by_the_keys_each_query_sees() -> None:
    from benchmarks.model_flops import attended_keys

    assert attended_keys(4, None) == 1 + 2 + 3 + 4
    assert attended_keys(6, 2) == 1 + 2 + 2 + 2 + 2 + 2
    assert attended_keys(4, 8) == attended_keys(4, None)


def test_the_benchmark_trains_the_tiny_model_each_configuration_in_its_own_process(tmp_path: Path) -> None:
    from benchmarks.train_throughput import main

    out = tmp_path / "rows.jsonl"
    args = ["--model", "gemma4-tiny", "--layers", "0", "--seq", "64", "--json", str(out)]
    assert main([*args, "--batch", "1,2", "--steps", "2", "--warmup", "1"]) == 0
    baseline, one, two = (json.loads(line) for line in out.read_text().splitlines())
    assert main([*args, "--batch", "2", "--flops-only", str(two["devices"])]) == 0
    counted = json.loads(out.read_text().splitlines()[-1])
    assert baseline["baseline"] == "bf16 matmul" and baseline["tflops"] > 0
    for measured in (one, two):
        assert "error" not in measured, measured
        assert measured["layers"] == 2 and measured["stepSeconds"] > 0
        assert measured["layerTypes"] == "1 sliding_attention + 1 full_attention"
        assert math.isfinite(measured["lossLast"])
        # Memory from the compiled step (the preflight's figure) and its build, the larger of them and the
        # device's own peak; the build holds the base once, so it needs less than the step.
        compiled = measured["compiled"]
        parts = ("argumentsGiB", "temporariesGiB", "outputsGiB", "codeGiB")
        assert compiled["stepGiB"] == pytest.approx(sum(compiled[k] for k in parts), abs=0.01)
        assert 0 < compiled["buildGiB"] < compiled["stepGiB"] <= measured["peakMemoryGiB"]
        # The model's FLOPs leave out remat's recomputation and the masked product's upper half: less than XLA's.
        assert 0 < measured["modelTflopsPerStep"] < measured["tflopsPerStep"]
    tokens = 2 * 64 * two["devices"]  # micro batch 2 on each device (fsdp over them all)
    assert two["tokensPerSecond"] == pytest.approx(tokens / two["stepSeconds"], rel=1e-3)
    # The loss is per loss target: a micro-batch of 2 rows reports what one of 1 row does, not twice it.
    assert two["lossFirst"] == pytest.approx(one["lossFirst"], rel=0.1)
    # One count for both: the measured row's FLOPs (per device) are the shapes-only count's.
    assert two["tflopsPerStep"] == counted["tflopsPerStep"] > 0
    assert counted["gflopsPerToken"] == pytest.approx(counted["tflopsPerStep"] * 1e3 / 128, rel=1e-3)
