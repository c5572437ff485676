"""Training throughput and MFU of the trainer's own step on the devices at hand (an accelerator where there is
one, else CPU), for a Gemma 4 model of the catalog, whole or cut to its first layers, with random weights.

The step is the one the trainer runs (train/trainer.py: Tunix PeftTrainer with our loss, gradient accumulation
off, model and optimizer donated) on the model the trainer builds (Tunix Gemma 4, Qwix LoRA on the catalog's
targets, remat as asked, every array placed by its partition spec). Only the weights differ: random, so no
checkpoint is read. Measured in this run, per configuration:

- step time: median of `--steps` timed steps after `--warmup` (each blocked on its loss);
- tokens/s (micro batch x maxSeqLen per step);
- FLOPs per step: XLA's count of the step lowered from shapes alone (preflight/step.py), before optimisation,
  remat's recomputation included; and MFU: the FLOP/s achieved by that count over the chip's datasheet peak;
- the baseline, measured in the same run on the same device: a square bf16 matrix product's FLOP/s, and the
  step's FLOP/s as a ratio of it;
- peak device memory (where the backend reports it: the process's peak, model building included) and the
  first step's time (the compile included).

    python benchmarks/train_throughput.py [--model gemma4-31b] [--layers 6,12] [--seq 3072] [--batch 1,2]
        [--steps 8] [--warmup 2] [--no-flops] [--json out.jsonl]
    python benchmarks/train_throughput.py --flops-only 1 --layers 6,12,0     (the FLOP counts alone)

Without arguments on a CPU-only host it runs the tiny model whole (make bench); --layers 0 is the whole model.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import model_shape
from tpuforge_workloads.data.pipeline import BATCH_ARRAYS
from tpuforge_workloads.model import attention, gemma4
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import NoCheckpoints, lower_train_step, lowered_flops, with_layers
from tpuforge_workloads.tiny import gemma4 as tiny_model
from tpuforge_workloads.train.loop import adapt_for_training
from tpuforge_workloads.train.trainer import make_trainer

# Dense bf16 peak per chip, TFLOP/s, by the vendors' datasheets (no sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v5p": 459.0, "TPU v6e": 918.0, "TPU v5 lite": 197.0}
GIB = 1024**3
# --model, --layers, --seq, --batch when not given: the 31B's first one and two periods of 6 layers at the
# report's maxSeqLen on an accelerator; on CPU (make bench, a laptop) the tiny model, whole.
DEFAULTS = ("gemma4-31b", "6,12", "3072", "1")
CPU_DEFAULTS = ("gemma4-tiny", "0", "128", "2")
TOTAL_STEPS = 1000  # the learning-rate schedule's length; it does not change the step's cost


def peak_tflops(device: Any) -> float | None:
    kind = str(getattr(device, "device_kind", ""))
    return next((v for k, v in PEAK_TFLOPS.items() if k.lower() in kind.lower()), None)


def matmul_tflops(device: Any, n: int) -> float:
    """The baseline: a square bf16 matrix product's achieved TFLOP/s on `device` (median of 10)."""
    a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), device)
    b = jax.device_put(jnp.ones((n, n), jnp.bfloat16), device)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def train_config(model: str, seq: int, batch: int, remat: bool, fsdp: int) -> TrainConfig:
    return TrainConfig(
        model_name=model,
        model_uri=f"gs://benchmark/{model}",
        dataset_uri="gs://benchmark/train.jsonl",
        lora=LoraSpec(rank=64, alpha=64, dropout=0.0),
        training=TrainingSpec(max_seq_len=seq, micro_batch_size=batch, gradient_accumulation_steps=1, remat=remat),
        mesh=MeshSpec(fsdp=fsdp, tp=1),
        checkpoint=CheckpointSpec(uri="gs://benchmark/checkpoints"),
        metrics_port=0,
    )


def spread(seed: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """Weights in [-0.02, 0.02] (to bfloat16 rounding) from a multiplicative hash of each element's index: one
    fused elementwise loop, where jax.random's threefry holds several copies of a 1.4-billion-entry embedding
    as it works (24 GB on CPU for the 31B's)."""
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(shape)):
        index = index * jnp.uint32(shape[axis]) + jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    hashed = (index + seed * jnp.uint32(0x9E3779B9)) * jnp.uint32(2654435761)
    return ((hashed >> 8).astype(jnp.float32) * (0.04 / 2**24) - 0.02).astype(dtype)


def random_model(text: gemma4.Gemma4Text, config: TrainConfig, mesh: Any) -> Any:
    """The trainer's model (train/loop.py: adapt_for_training) on random base weights made on the devices,
    each array created where its partition spec puts it (nothing is built on the host or moved)."""
    from tunix.models.gemma4 import model as gm

    cfg = gemma4.tunix_config(text)
    with jax.set_mesh(mesh):
        abstract = nnx.eval_shape(lambda: gm.Gemma4(cfg, rngs=nnx.Rngs(params=0)))
    graph_def, abs_state = nnx.split(abstract)
    shardings = nnx.get_named_sharding(abs_state, mesh)
    leaves, tree = jax.tree.flatten(abs_state)
    placed = jax.tree.leaves(shardings)

    fills: dict[tuple[Any, ...], Any] = {}
    values = []
    for i, (leaf, sharding) in enumerate(zip(leaves, placed, strict=True)):
        sig = (leaf.shape, leaf.dtype, sharding)
        if sig not in fills:
            shape, dtype = leaf.shape, leaf.dtype
            fills[sig] = jax.jit(
                lambda k, shape=shape, dtype=dtype: spread(k, shape, dtype),
                out_shardings=sharding,
            )
        values.append(fills[sig](jnp.uint32(i)))
    state = jax.tree.unflatten(tree, values)
    return adapt_for_training(attention.install(nnx.merge(graph_def, state)), config, mesh)


def random_batch(config: TrainConfig, vocab: int, mesh: Any) -> dict[str, Any]:
    """One micro-batch of whole rows (one example each: no padding), sharded over fsdp as the feed does."""
    t = config.training
    rows, seq = t.micro_batch_size * mesh.shape["fsdp"], t.max_seq_len
    rng = np.random.default_rng(0)
    host = {
        "input_tokens": rng.integers(3, vocab, (rows, seq), dtype=np.int32),
        "input_mask": np.ones((rows, seq), bool),
        "segment_ids": np.ones((rows, seq), np.int32),
        "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy(),
        "loss_denominator": np.full((rows,), seq - 1, np.float32),
    }
    assert set(BATCH_ARRAYS) <= set(host)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
    return {k: jax.device_put(v, sharding) for k, v in host.items()}


def step_flops(text: gemma4.Gemma4Text, config: TrainConfig) -> float:
    """XLA's FLOP count of the trainer's step, lowered from shapes alone (preflight/step.py) on CPU devices:
    CUDA's backend gives no count for a lowered program. Off TPU the step takes the same attention path on
    every platform (the dense mask), so the CPU lowering is the accelerator's program before optimisation."""
    fsdp = config.mesh.fsdp
    cpus = jax.devices("cpu")
    mesh = make_mesh(fsdp, 1, cpus[:fsdp] if len(cpus) >= fsdp else jax.local_devices())
    with jax.set_mesh(mesh), mesh:
        return lowered_flops(lower_train_step(text, config, mesh, TOTAL_STEPS))


def decoder(model_name: str, layers: int) -> gemma4.Gemma4Text:
    """The catalog model's decoder, cut to its first `layers` layers (0: all of them)."""
    text = gemma4.parse_config(tiny_model.hf_config(model_shape(model_name)))
    return with_layers(text, text.layer_types[:layers]) if layers else text


def flops_row(model_name: str, layers: int, seq: int, batch: int, remat: bool, fsdp: int) -> dict[str, Any]:
    """The FLOP count alone, from shapes (no device run): to complete rows measured with --no-flops."""
    text = decoder(model_name, layers)
    flops = step_flops(text, train_config(model_name, seq, batch, remat, fsdp))
    tokens = batch * seq * fsdp
    return {
        "model": model_name,
        "layers": text.num_layers,
        "maxSeqLen": seq,
        "microBatch": batch,
        "remat": remat,
        "tflopsPerStep": float(f"{flops / 1e12:.4g}"),
        "gflopsPerToken": float(f"{flops * fsdp / tokens / 1e9:.4g}"),
    }


def measure(
    model_name: str, layers: int, seq: int, batch: int, remat: bool, steps: int, warmup: int, count_flops: bool = True
) -> dict[str, Any]:
    """One configuration trained for `warmup` + `steps` steps on every local device (fsdp over them)."""
    text = decoder(model_name, layers)
    devices = jax.local_devices()
    config = train_config(model_name, seq, batch, remat, fsdp=len(devices))
    mesh = make_mesh(len(devices), 1, devices)
    row: dict[str, Any] = {
        "model": model_name,
        "layers": text.num_layers,
        "maxSeqLen": seq,
        "microBatch": batch,
        "remat": remat,
        "devices": len(devices),
        "device": str(devices[0].device_kind),
        "jax": jax.__version__,
    }
    flops = step_flops(text, config) if count_flops else 0.0
    started = time.monotonic()
    with jax.set_mesh(mesh), mesh:  # Tunix's kernels read the legacy mesh context, the model the new one
        model = random_model(text, config, mesh)
        jax.block_until_ready(nnx.state(model))
        row["buildSeconds"] = round(time.monotonic() - started, 1)
        trainer = make_trainer(model, config, TOTAL_STEPS, NoCheckpoints())
        batch_arrays = random_batch(config, text.vocab_size, mesh)
        train_step, _ = trainer.jit_train_and_eval_step()
        started = time.monotonic()
        loss, _, _ = train_step(batch_arrays)
        row["firstStepSeconds"] = round(time.monotonic() - started, 1)  # the compile included
        row["lossFirst"] = round(float(loss), 3)
        for _ in range(max(0, warmup - 1)):
            jax.block_until_ready(train_step(batch_arrays))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss, _, _ = train_step(batch_arrays)
            loss.block_until_ready()
            times.append(time.perf_counter() - t0)
        row["lossLast"] = round(float(loss), 3)
    step_s = statistics.median(times)
    row.update(
        stepSeconds=round(step_s, 4),
        stepSecondsMin=round(min(times), 4),
        tokensPerSecond=round(batch * seq * len(devices) / step_s, 1),
    )
    if flops:
        achieved = flops / step_s / 1e12  # per device: each runs its share of the step
        row.update(tflopsPerStep=float(f"{flops / 1e12:.4g}"), achievedTflopsPerDevice=float(f"{achieved:.4g}"))
        peak = peak_tflops(devices[0])
        if peak:
            row.update(peakTflops=peak, mfu=round(achieved / peak, 4))
    stats = devices[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        row["peakMemoryGiB"] = round(stats["peak_bytes_in_use"] / GIB, 2)  # the process's peak so far
    return row


def baseline_row(device: Any, n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"baseline": "bf16 matmul", "n": n, "device": str(device.device_kind)}
    row["tflops"] = round(matmul_tflops(device, n), 1)
    peak = peak_tflops(device)
    if peak:
        row["ofPeak"] = round(row["tflops"] / peak, 3)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a catalog model (default: gemma4-31b on an accelerator, gemma4-tiny on CPU)")
    ap.add_argument("--layers", help="comma-separated; 0 is the whole model (default: 6,12; on CPU 0)")
    ap.add_argument("--seq", help="comma-separated maxSeqLen (default: 3072, the report's; on CPU 128)")
    ap.add_argument("--batch", help="comma-separated micro batch (default: 1; on CPU 2)")
    ap.add_argument("--no-remat", action="store_true")
    ap.add_argument("--no-flops", action="store_true", help="skip XLA's FLOP count (one more trace of the step)")
    ap.add_argument("--flops-only", type=int, metavar="DEVICES", help="only the FLOP counts, for a mesh of fsdp=N")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--matmul", type=int, default=0, help="baseline matrix size (0: 8192 on GPU/TPU, 1024 on CPU)")
    ap.add_argument("--json", help="append each result here as a JSON line")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    on_cpu = jax.local_devices()[0].platform == "cpu"
    for name, value in zip(("model", "layers", "seq", "batch"), CPU_DEFAULTS if on_cpu else DEFAULTS, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)

    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    device = jax.local_devices()[0]
    baseline = None
    if not args.flops_only:
        baseline = baseline_row(device, args.matmul or (1024 if device.platform == "cpu" else 8192))
        emit(baseline)
    remat = not args.no_remat
    for layers in (int(x) for x in args.layers.split(",")):
        for seq in (int(x) for x in args.seq.split(",")):
            for batch in (int(x) for x in args.batch.split(",")):
                if args.flops_only:
                    emit(flops_row(args.model, layers, seq, batch, remat, args.flops_only))
                    continue
                try:
                    row = measure(args.model, layers, seq, batch, remat, args.steps, args.warmup, not args.no_flops)
                except Exception as e:  # one configuration that does not fit must not lose the others
                    emit(
                        {
                            "model": args.model,
                            "layers": layers,
                            "maxSeqLen": seq,
                            "microBatch": batch,
                            "error": str(e)[:500],
                        }
                    )
                    continue
                if baseline and row.get("achievedTflopsPerDevice"):
                    row["ofBaseline"] = round(row["achievedTflopsPerDevice"] / baseline["tflops"], 3)
                emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
