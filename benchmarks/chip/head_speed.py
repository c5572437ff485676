"""The output head's share of a train step at the 31B's shapes: the logits over Gemma 4's 262,144-token
vocabulary, its final soft-capping and the trainer's loss, forward and backward to the hidden states (the
embedding is frozen: no gradient for it), against the two matrix products alone (the logits and the hidden
states' gradient) at the same shapes. Two losses: `autodiff` (the model's float32 soft-capped logits and
model/loss.py's token_logps, differentiated by JAX, as the trainer computed it until the head had a gradient
of its own) and `headNll` (model/loss.py: head_nll, what the trainer computes now for Gemma 4).

    python -m benchmarks.chip.head_speed [--seq 2048,4096] [--json out.jsonl] [--tiny] [--topology v5litepod-1]

Rows: median ms of each over `--iters` calls after two warm-ups, and TFLOP/s of the two products (4 x tokens x
hidden x vocabulary). `--topology SLICE` compiles each for that TPU slice here instead (libtpu, no chip) and
gives XLA's figures: temporaries and the bytes the program reads and writes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax
import jax.numpy as jnp
from benchmarks.chip.splash_speed import timed
from benchmarks.rows import emit

from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge_workloads.model.loss import head_nll, token_logps

SOFTCAP = 30.0  # Gemma 4's final_logit_softcap (Tunix's Gemma 4 config)


def head_cases(t: int, hidden: int, vocab: int, concrete: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The head's inputs at these shapes (their shapes alone unless `concrete`) and each case's function."""
    x_shape, table_shape = (1, t, hidden), (vocab, hidden)
    targets = jax.random.randint(jax.random.key(2), (1, t), 0, vocab)
    weight = jnp.ones((1, t), jnp.float32)
    if concrete:
        keys = jax.random.split(jax.random.key(0), 2)
        x = (jax.random.normal(keys[0], x_shape, jnp.float32) * 0.5).astype(jnp.bfloat16)
        table = (jax.random.normal(keys[1], table_shape, jnp.bfloat16) * 0.02).astype(jnp.bfloat16)
        args: tuple[Any, ...] = (x, table)
    else:
        args = (jax.ShapeDtypeStruct(x_shape, jnp.bfloat16), jax.ShapeDtypeStruct(table_shape, jnp.bfloat16))

    def products(x: Any, table: Any) -> Any:  # the logits, then a gradient of their shape back to x
        logits = jnp.einsum("btd,vd->btv", x, table)
        return jnp.sum(jnp.einsum("btv,vd->btd", logits, table).astype(jnp.float32))

    def autodiff(x: Any, table: Any) -> Any:  # Tunix's head (bf16 product, float32 soft-cap) and token_logps
        logits = jnp.einsum("btd,vd->btv", x, table).astype(jnp.float32)
        logits = jnp.tanh(logits / SOFTCAP) * SOFTCAP
        return -jnp.sum(token_logps(logits, targets))

    def own(x: Any, table: Any) -> Any:
        return head_nll(x, table, targets, weight, SOFTCAP, jnp.bfloat16)

    cases = {"products": jax.jit(products), "autodiff": jax.jit(jax.grad(autodiff)), "headNll": jax.jit(jax.grad(own))}
    return args, cases


def head_rows(t: int, hidden: int, vocab: int, iters: int) -> list[dict[str, Any]]:
    args, cases = head_cases(t, hidden, vocab)
    flops = 4.0 * t * hidden * vocab
    rows = []
    for name, fn in cases.items():
        seconds = timed(fn, args, iters)
        row = {"case": name, "seq": t, "hidden": hidden, "vocab": vocab, "ms": round(seconds * 1e3, 3)}
        row["tflops"] = round(flops / seconds / 1e12, 2)
        row["platform"] = jax.devices()[0].platform
        rows.append(row)
    return rows


def compiled_rows(t: int, hidden: int, vocab: int, slice_id: str) -> list[dict[str, Any]]:
    """Each case compiled for one chip of the TPU slice `slice_id` on this host: XLA's memory and bytes."""
    from tpuforge_workloads.preflight.topology import slice_devices

    device = slice_devices(TPU_SLICES[slice_id])[0]
    args, cases = head_cases(t, hidden, vocab, concrete=False)
    sharding = jax.sharding.SingleDeviceSharding(device)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
    rows = []
    for name, fn in cases.items():
        compiled = fn.lower(*shapes).compile()
        mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        row = {"case": name, "seq": t, "topology": slice_id, "temporariesGiB": round(mem.temp_size_in_bytes / 2**30, 3)}
        row["bytesAccessedGiB"] = round(float(cost.get("bytes accessed", 0.0)) / 2**30, 2)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", default="2048,4096", help="comma-separated tokens in the row")
    ap.add_argument("--tiny", action="store_true", help="the tiny model's head (CPU)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--topology", help="compile for one chip of this catalog slice here (no chip): XLA's figures")
    ap.add_argument("--json", help="append each row here")
    args = ap.parse_args(argv)
    shape = model_shape("gemma4-tiny" if args.tiny else "gemma4-31b")
    for t in (int(s) for s in args.seq.split(",")):
        rows = (
            compiled_rows(t, shape.embed_dim, shape.vocab_size, args.topology)
            if args.topology
            else head_rows(t, shape.embed_dim, shape.vocab_size, 1 if args.tiny else args.iters)
        )
        for row in rows:
            emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
