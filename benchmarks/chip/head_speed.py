"""The output head's share of a train step at the 31B's shapes: the logits over Gemma 4's 262,144-token
vocabulary, its final soft-capping and the trainer's loss (train/loss.py: token_logps in float32), forward and
backward to the hidden states (the embedding is frozen: no gradient for it), against the two matrix products
alone (the logits and the hidden states' gradient) at the same shapes.

    python -m benchmarks.chip.head_speed [--seq 2048,4096] [--json out.jsonl] [--tiny]

Rows: median ms of each over `--iters` calls after two warm-ups, and TFLOP/s of the two products (4 x tokens x
hidden x vocabulary). Where the head with its loss takes much longer than the products alone, the difference
is the elementwise work over the [tokens, vocabulary] logits (casts, soft-capping, log-softmax and their
gradients), each a pass over HBM, and the lever is to fuse or chunk it; where it is close, the head is not
where the step's time goes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax
import jax.numpy as jnp
from benchmarks.chip.splash_speed import timed
from benchmarks.rows import emit

from tpuforge.api.catalog import model_shape
from tpuforge_workloads.train.loss import token_logps

SOFTCAP = 30.0  # Gemma 4's final_logit_softcap (Tunix's Gemma 4 config)


def head_rows(t: int, hidden: int, vocab: int, iters: int) -> list[dict[str, Any]]:
    keys = jax.random.split(jax.random.key(0), 3)
    x = (jax.random.normal(keys[0], (1, t, hidden), jnp.float32) * 0.5).astype(jnp.bfloat16)
    table = (jax.random.normal(keys[1], (vocab, hidden), jnp.float32) * 0.02).astype(jnp.bfloat16)
    targets = jax.random.randint(keys[2], (1, t), 0, vocab)

    def products(x: Any, table: Any) -> Any:  # the logits, then a gradient of their shape back to x
        logits = jnp.einsum("btd,vd->btv", x, table)
        return jnp.sum(jnp.einsum("btv,vd->btd", logits, table).astype(jnp.float32))

    def with_loss(x: Any, table: Any) -> Any:  # Tunix's head (bf16 product, float32 soft-cap) and our loss
        logits = jnp.einsum("btd,vd->btv", x, table).astype(jnp.float32)
        logits = jnp.tanh(logits / SOFTCAP) * SOFTCAP
        return -jnp.sum(token_logps(logits, targets))

    flops = 4.0 * t * hidden * vocab
    rows = []
    for name, fn in (("products", jax.jit(products)), ("headWithLoss", jax.jit(jax.grad(with_loss)))):
        seconds = timed(fn, (x, table), iters)
        row = {"case": name, "seq": t, "hidden": hidden, "vocab": vocab, "ms": round(seconds * 1e3, 3)}
        row["tflops"] = round(flops / seconds / 1e12, 2)
        row["platform"] = jax.devices()[0].platform
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", default="2048,4096", help="comma-separated tokens in the row")
    ap.add_argument("--tiny", action="store_true", help="the tiny model's head (CPU)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="append each row here")
    args = ap.parse_args(argv)
    shape = model_shape("gemma4-tiny" if args.tiny else "gemma4-31b")
    for t in (int(s) for s in args.seq.split(",")):
        for row in head_rows(t, shape.embed_dim, shape.vocab_size, 1 if args.tiny else args.iters):
            emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
