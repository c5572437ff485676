"""The splash kernels' speed under each block layout (families/attention.py: LAYOUTS), forward and backward, at
the 31B's sliding and global layer shapes: which layout the trainer's attention should be built with.

One row per layout, layer kind and row length: the median time of the forward and of the forward with the
backward (dq, dk, dv) over `--iters` calls after two warm-ups, one row of micro-batch 1, and the attention's
model FLOP/s (the query-key pairs the mask allows, 4 x pairs x heads x head dim for the forward, 2.5 times that
for the backward) so the layouts compare on one scale. A layout the compiler refuses (blocks outgrowing the
kernel's scoped memory) gives a row with its error. On CPU (`--tiny`) the kernels run in interpret mode: the
rows say only that every layout runs.

    python -m benchmarks.chip.splash_speed [--tiny] [--seq 2048,4096] [--layouts uniform,fused] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks.chip.splash_check import CASES, TINY
from benchmarks.rows import emit

from tpuforge_workloads.families import attention


def allowed_pairs(t: int, window: int | None) -> int:
    """The (query, key) pairs a causal mask of `t` tokens allows, within `window` back when given."""
    w = t if window is None else min(window, t)
    return w * (w + 1) // 2 + (t - w) * w


def timed(fn: Any, args: tuple[Any, ...], iters: int) -> float:
    """Median seconds of `fn(*args)` over `iters` calls after two warm-ups."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(layout: str, kind: str, shape: tuple[int, int, int, int | None], t: int, iters: int) -> dict[str, Any]:
    heads, kv, dim, window = shape
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(0, 1, (1, t, n, dim)), jnp.bfloat16) for n in (heads, kv, kv))
    ids = jnp.ones((1, t), jnp.int32)
    cotangent = jnp.asarray(rng.normal(0, 1, (1, t, heads, dim)), jnp.bfloat16)
    row: dict[str, Any] = {"layout": layout, "kind": kind, "seq": t, "heads": heads, "kvHeads": kv, "headDim": dim}
    row["platform"] = jax.devices()[0].platform
    blocks = attention.block_sizes(t, layout)
    row["blocks"] = {f.name: getattr(blocks, f.name) for f in dataclasses.fields(blocks) if "layout" not in f.name}

    def forward(q: Any, k: Any, v: Any) -> Any:
        return attention.splash_attention(q, k, v, ids, window, (None, None, None, None))

    def loss(q: Any, k: Any, v: Any) -> Any:
        return jnp.sum((forward(q, k, v) * cotangent).astype(jnp.float32))

    try:
        with attention.blocks_layout(layout):  # the kernels are built as each function is traced
            fwd = jax.jit(forward).lower(q, k, v).compile()
            both = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    except Exception as e:  # a layout the compiler refuses is a row, not the end of the run
        return {**row, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    row["forwardMs"] = round(timed(fwd, (q, k, v), iters) * 1e3, 3)
    row["forwardBackwardMs"] = round(timed(both, (q, k, v), iters) * 1e3, 3)
    flops = 4.0 * allowed_pairs(t, window) * heads * dim
    row["forwardTflops"] = round(flops / row["forwardMs"] / 1e9, 2)
    row["forwardBackwardTflops"] = round(3.5 * flops / row["forwardBackwardMs"] / 1e9, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU: interpret mode)")
    ap.add_argument("--seq", help="comma-separated row lengths (default 2048,4096; --tiny 1024)")
    ap.add_argument("--layouts", help=f"comma-separated (default all: {','.join(attention.LAYOUTS)})")
    ap.add_argument("--cases", help="comma-separated layer kinds (default: all)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="append each row here")
    args = ap.parse_args(argv)
    cases = TINY if args.tiny else CASES
    seqs = [int(s) for s in (args.seq or ("1024" if args.tiny else "2048,4096")).split(",")]
    layouts = args.layouts.split(",") if args.layouts else list(attention.LAYOUTS)
    if unknown := set(layouts) - set(attention.LAYOUTS):
        ap.error(f"--layouts: {', '.join(sorted(unknown))} unknown; known: {', '.join(attention.LAYOUTS)}")
    kinds = args.cases.split(",") if args.cases else list(cases)
    if unknown := set(kinds) - set(cases):
        ap.error(f"--cases: {', '.join(sorted(unknown))} unknown; known: {', '.join(cases)}")
    for t in seqs:
        for kind in kinds:
            for layout in layouts:
                emit(speed(layout, kind, cases[kind], t, 1 if args.tiny else args.iters), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
