"""Adapter vs merged: one fine-tune served two ways, the merged model and the base with the LoRA adapter (vLLM
--enable-lora), given the same prompts in alternating rounds (`measure`); their ratios adapter / merged
(`ratios`), how often their greedy outputs agree (`agreement`) and the table of both (`report_compare`). For
the laptop run, the tiny base, a rank-8 adapter and the merged model made by the merge workload
(`adapter_inputs`)."""

from __future__ import annotations

import asyncio
import math
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.serving.load import Point, Result, drive, random_prompts, summarize
from benchmarks.serving.vllm_cpu import tiny_gemma4

LORA_RANK = 8
GREEDY_CHECKS = 8  # prompts whose greedy output must agree between the two ways
Output = tuple[int, ...] | str


@dataclass
class Side:
    """One way of serving the fine-tuned model, measured."""

    label: str
    point: Point
    outputs: list[Output]  # the greedy outputs of the check prompts, sent one at a time


@dataclass
class Prompts:
    """The same prompts for both sides: a warm-up round, the measured load and the greedy check."""

    warmup: list[list[int]]
    load: list[list[int]]
    check: list[list[int]]

    @classmethod
    def make(cls, seed: int, n: int, input_len: int, concurrency: int, vocab: range) -> Prompts:
        rng = random.Random(f"{seed}:adapter-vs-merged")  # none shared with the sweep's (see run_point)
        return cls(*(random_prompts(rng, k, input_len, vocab) for k in (concurrency, n, GREEDY_CHECKS)))


def adapter_inputs(root: Path, max_positions: int) -> tuple[Path, Path, Path, int]:
    """The tiny Gemma 4 base, a rank-8 LoRA checkpoint for it with nonzero B (a fresh adapter's zero B would
    change nothing) and our merge workload's output from it, merged model and PEFT adapter: (base dir, merged
    dir, adapter dir, vocabulary size)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from tpuforge.api import LoraSpec
    from tpuforge.api.configs import MergeConfig
    from tpuforge_workloads.families.gemma4 import tiny as tiny_model
    from tpuforge_workloads.merge import synthetic
    from tpuforge_workloads.merge.merge import run_merge
    from tpuforge_workloads.merge.plan import read_base_config
    from tpuforge_workloads.model import lora

    base, ckpt, merged = root / "base", root / "ckpt", root / "merged"
    vocab_size = tiny_gemma4(base, max_positions)
    spec = LoraSpec(rank=LORA_RANK, alpha=2.0 * LORA_RANK, dropout=0.0)
    tree = synthetic.lora_tree(read_base_config(str(base)), spec.rank, spec.target_modules)
    manifest = lora.manifest(tiny_model.MODEL_NAME, str(base), spec)
    synthetic.write_lora_checkpoint(str(ckpt), tree, manifest=manifest)
    run_merge(
        MergeConfig(
            model_name=tiny_model.MODEL_NAME,
            base_model_uri=str(base),
            checkpoint_uri=str(ckpt),
            output_uri=str(merged),
            lora=spec,
            write_adapter=True,
        )
    )
    # Found by its config rather than by a fixed path: where the merge puts the adapter is its own business.
    configs = sorted(merged.rglob("adapter_config.json"))
    if not configs:
        raise RuntimeError(f"the merge wrote no adapter_config.json under {merged}")
    return base, merged, configs[0].parent, vocab_size


def lora_args(adapter_name: str, adapter_dir: Path) -> tuple[str, ...]:
    return ("--enable-lora", "--max-lora-rank", str(LORA_RANK), "--max-loras", "1",
            "--lora-modules", f"{adapter_name}={adapter_dir}")  # fmt: skip


def greedy_outputs(url: str, model: str, prompts: list[list[int]], output_len: int) -> list[Output]:
    """Each prompt alone (no batching to vary the numerics), temperature 0: the token ids, or the text from a
    server that does not return ids."""
    results, _ = asyncio.run(drive(url, model, prompts, output_len, float("inf"), random.Random(0), concurrency=1))
    if errors := [r.error for r in results if not r.ok]:
        raise RuntimeError(f"greedy check against {model}: {errors[0]}")
    return [tuple(r.token_ids) if r.token_ids else r.text for r in results]


@dataclass
class Endpoint:
    label: str
    url: str
    model: str


def measure(
    merged: Endpoint, adapter: Endpoint, prompts: Prompts, output_len: int, concurrency: int, rounds: int
) -> tuple[Side, Side]:
    """Both ways, in alternating rounds (a machine whose load changes then changes both sides alike): a
    warm-up (the first use of an adapter loads it: a one-off, not the steady state compared here), then
    `rounds` slices of the load prompts, each sent at once with `concurrency` in flight to one side and then
    to the other, the first side alternating; then the greedy check of each."""
    ends = (merged, adapter)
    rng = random.Random(0)
    for e in ends:
        asyncio.run(drive(e.url, e.model, prompts.warmup, output_len, float("inf"), rng, concurrency))
    results: dict[str, list[Result]] = {e.label: [] for e in ends}
    seconds = dict.fromkeys(results, 0.0)
    step = math.ceil(len(prompts.load) / rounds)
    for r in range(rounds):
        batch = prompts.load[r * step : (r + 1) * step]
        for e in ends if r % 2 == 0 else ends[::-1]:
            got, duration = asyncio.run(drive(e.url, e.model, batch, output_len, float("inf"), rng, concurrency))
            results[e.label] += got
            seconds[e.label] += duration
    input_len = len(prompts.load[0])
    sides = [
        Side(
            e.label,
            summarize(input_len, float("inf"), results[e.label], seconds[e.label]),
            greedy_outputs(e.url, e.model, prompts.check, output_len),
        )
        for e in ends
    ]
    return sides[0], sides[1]


def agreement(a: list[Output], b: list[Output]) -> float:
    """The share of prompts whose outputs are identical."""
    if len(a) != len(b) or not a:
        raise ValueError(f"cannot compare {len(a)} outputs with {len(b)}")
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def ratios(adapter: Point, merged: Point) -> dict[str, float]:
    """adapter / merged: throughput below 1 and TTFT above 1 are what the adapter costs."""
    pairs = {
        "request_s": (adapter.request_s, merged.request_s),
        "output_tok_s": (adapter.output_tok_s, merged.output_tok_s),
        "ttft_ms_p50": (adapter.ttft_ms_median, merged.ttft_ms_median),
        "ttft_ms_p99": (adapter.ttft_ms_p99, merged.ttft_ms_p99),
    }
    return {k: a / m if m else float("nan") for k, (a, m) in pairs.items()}


def report_compare(merged: Side, adapter: Side, concurrency: int, output_len: int, rounds: int) -> dict[str, Any]:
    p = merged.point
    print(
        f"\nadapter vs merged: {p.requests} prompts of {p.input_len} tokens, {output_len} output tokens each, "
        f"{concurrency} in flight, in {rounds} alternating rounds"
    )
    print(f"{'':<22} {'req/s':>7} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'failed':>7}")
    for side in (merged, adapter):
        q = side.point
        print(
            f"{side.label:<22} {q.request_s:>7.2f} {q.output_tok_s:>10.1f} {q.ttft_ms_median:>12.1f}"
            f" {q.ttft_ms_p99:>12.1f} {q.failed:>7}"
        )
    r = ratios(adapter.point, merged.point)
    print(
        f"{'adapter / merged':<22} {r['request_s']:>7.2f} {r['output_tok_s']:>10.2f} {r['ttft_ms_p50']:>12.2f}"
        f" {r['ttft_ms_p99']:>12.2f}"
    )
    agree = agreement(merged.outputs, adapter.outputs)
    print(f"greedy output: merged and {adapter.label} agree on {agree:.0%} of {len(merged.outputs)} prompts")
    return {
        # qps None: all sent at once (JSON has no infinity)
        "merged": asdict(merged.point) | {"qps": None},
        "adapter": asdict(adapter.point) | {"qps": None},
        "ratios": r,
        "greedy_agreement": agree,
        "concurrency": concurrency,
        "rounds": rounds,
    }
