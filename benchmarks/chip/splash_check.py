"""Splash attention with segment ids (families/attention.py), forward and backward, against the masked reference
(softmax over the keys each query may see, in float32): Gemma 4's sliding and global layers at the 31B's head
shapes, and packed rows (several examples and padding in one row). On TPU the kernels are compiled; on CPU
they run in Pallas interpret mode (`--tiny` shapes).

    python -m benchmarks.chip.splash_check [--tiny] [--seq 4096] [--layouts uniform,fused] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks.rows import emit

from tpuforge_workloads.families import attention
from tpuforge_workloads.families.attention import splash_attention

# (heads, kv heads, head dim, window) of the 31B's layers, and a tiny stand-in for CPU.
CASES = {
    "sliding": (32, 16, 256, 1024),
    "global": (32, 4, 512, None),
}
TINY = {"sliding": (4, 2, 64, 96), "global": (4, 1, 128, None)}


def reference(q: Any, k: Any, v: Any, ids: Any, window: int | None) -> Any:
    """softmax(q k^T) v over the same example's earlier keys (within `window`), in float32."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    t = q.shape[1]
    pos = jnp.arange(t)
    allowed = (pos[:, None] >= pos[None, :]) & (ids[:, :, None] == ids[:, None, :])
    if window is not None:
        allowed &= pos[:, None] - pos[None, :] < window
    scores = jnp.einsum("btnh,bsnh->bnts", q, k)
    scores = jnp.where(allowed[:, None], scores, -jnp.inf)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)


def segments(t: int, packed: bool) -> np.ndarray:
    """One whole example, or three examples and padding in one row."""
    ids = np.ones((1, t), np.int32)
    if packed:
        ids[0, t // 4 : t // 2] = 2
        ids[0, t // 2 : 7 * t // 8] = 3
        ids[0, 7 * t // 8 :] = 0
    return ids


def check(
    name: str, heads: int, kv: int, dim: int, window: int | None, t: int, packed: bool, layout: str = "uniform"
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(0, 1, (1, t, n, dim)), jnp.bfloat16) for n in (heads, kv, kv))
    q = q / jnp.sqrt(jnp.bfloat16(dim))
    ids = jnp.asarray(segments(t, packed))
    cotangent = jnp.asarray(rng.normal(0, 1, (1, t, heads, dim)), jnp.float32)

    def loss(fn: Any) -> Any:
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * cotangent)

    kernel = lambda q, k, v: splash_attention(q, k, v, ids, window, (None, None, None, None))  # noqa: E731
    masked = lambda q, k, v: reference(q, k, v, ids, window)  # noqa: E731
    with attention.blocks_layout(layout):  # the kernels are built as they are traced
        out = jax.jit(kernel)(q, k, v).astype(jnp.float32)
        grads = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(masked)(q, k, v)
    want_grads = jax.jit(jax.grad(loss(masked), argnums=(0, 1, 2)))(q, k, v)

    def rel(a: Any, b: Any) -> float:
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-9))

    return {
        "case": name + (" packed" if packed else ""),
        "layout": layout,
        "platform": jax.devices()[0].platform,
        "seq": t,
        "heads": heads,
        "kvHeads": kv,
        "headDim": dim,
        "window": window,
        "forwardRelErr": rel(out, want),
        **{f"d{x}RelErr": rel(g, w) for x, g, w in zip("qkv", grads, want_grads, strict=True)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU: interpret mode)")
    ap.add_argument("--seq", type=int, help="row length (default 4096; --tiny 256)")
    ap.add_argument("--cases", help="comma-separated layer kinds to check (default: all)")
    ap.add_argument("--layouts", default="uniform", help="comma-separated block layouts (attention.LAYOUTS)")
    ap.add_argument("--json", help="append each case's row here")
    args = ap.parse_args(argv)
    t = args.seq or (256 if args.tiny else 4096)
    cases = TINY if args.tiny else CASES
    wanted = args.cases.split(",") if args.cases else list(cases)
    if unknown := set(wanted) - set(cases):
        ap.error(f"--cases: {', '.join(sorted(unknown))} unknown; known: {', '.join(cases)}")
    for name, (heads, kv, dim, window) in ((n, cases[n]) for n in wanted):
        for layout in args.layouts.split(","):
            for packed in (False, True):
                emit(check(name, heads, kv, dim, window, t, packed, layout), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
