"""The sweep over input length x request rate: one point's own prompts and load (`run_point`), and the table of
points with each point's TTFT against the shortest input's at the same rate and, for a TPU run, against the
source report's v6e-8 numbers (`report`)."""

from __future__ import annotations

import random

from benchmarks.serving.load import Point, drive, random_prompts, summarize

# The source report's vLLM-TPU numbers on v6e-8 (TP 8), to hold a TPU run against.
REPORT_TTFT_MS = {(4096, 4.0): 61.0}
REPORT_PEAK_OUTPUT_TOK_S = {4096: 1206.0, 512: 1403.0}


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
