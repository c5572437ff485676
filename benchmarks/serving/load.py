"""One load against an OpenAI-compatible endpoint, as `vllm bench serve` drives it: streamed completions of
token-id prompts (`one_request`), sent Poisson at a rate or all at once with a cap on those in flight (`drive`),
and what came back summed up as one point (`summarize`: TTFT mean, median and p99, TPOT, output tokens/s,
requests/s)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp


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
