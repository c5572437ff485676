"""Training throughput, MFU and memory of the trainer's own step on the devices at hand (an accelerator where
there is one, else CPU), for a model of the catalog, whole or cut to its first layers, with random weights.

The step is the one the trainer runs (train/trainer.py: Tunix PeftTrainer with our loss, gradient accumulation
off, model and optimizer donated) on the model the trainer builds (the family's Tunix model with the trainer's
attention, Qwix LoRA on the catalog's targets added in place (lora.AdapterBuild), remat as asked, every array
placed by its partition spec). Only the weights differ: random, so no checkpoint is read.

Each configuration runs in a process of its own (a configuration that runs out of memory loses only itself,
and one process holds a TPU at a time), as does the baseline; this process only starts them and prints their
rows. Measured per configuration:

- step time: median of `--steps` timed steps after `--warmup` (each blocked on its loss); tokens/s;
- MFU: the model FLOPs of a LoRA step (model_flops.py: forward and backward without recomputation, causal
  attention counted as the half it is, a sliding window as its width) over the chips' datasheet peak; and
  beside it the hardware utilisation (hfu): XLA's FLOP count of the step lowered on CPU (preflight/step.py),
  remat's recomputation and attention's dense masked product included;
- memory: the compiled step's memory analysis on these devices (arguments, temporaries, outputs not written
  over donated inputs, program: the preflight's figure, compiled here as it compiles it, the trainer's first
  step then loading that program from the compile cache), the model build's (adapters added to the base),
  and the device's own peak where it reports one; peakMemoryGiB is the larger;
- the loss of the first and last step, per loss target (the trainer's loss), and the first step's time;
- the baseline, measured on the same device: a square bf16 matrix product's FLOP/s, and the step's XLA
  FLOP/s as a ratio of it.

A cut keeps at least one layer of each attention kind: where the first N layers hold no global layer (the
31B's first is layer 6), the cut's last layer is the model's first global one (the row's layerTypes says so).

    python benchmarks/train_throughput.py [--model gemma4-31b] [--layers 6,12] [--seq 3072] [--batch 1,2]
        [--steps 8] [--warmup 2] [--remat off|full|saveAttention|saveMatmuls] [--splash-layout NAME] [--no-flops]
        [--base-quantization none|int8|int4]
        [--json out.jsonl] [--timeout 900]
    python benchmarks/train_throughput.py --flops-only 1 --layers 6,12,0     (the FLOP counts alone)

Without arguments on a CPU-only host it runs the tiny model whole (make bench); --layers 0 is the whole model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from benchmarks.rows import emit
from flax import nnx

from benchmarks import model_flops
from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import model_shape
from tpuforge.api.finetune import BASE_QUANTIZATIONS, REMAT_POLICIES
from tpuforge_workloads import families
from tpuforge_workloads.data.pipeline import BATCH_ARRAYS
from tpuforge_workloads.families import attention
from tpuforge_workloads.families.decoder import Decoder
from tpuforge_workloads.families.gemma4 import tiny as tiny_gemma4
from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import (
    NoCheckpoints,
    compile_train_step,
    lower_train_step,
    lowered_flops,
    with_layers,
)
from tpuforge_workloads.runtime import compile_cache
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


def train_config(model: str, seq: int, batch: int, remat: str, fsdp: int, quantization: str = "none") -> TrainConfig:
    """`remat`: off, or what remat keeps (spec.training.rematPolicy); `quantization`: the base's for QLoRA
    (spec.lora.baseQuantization)."""
    on = remat != "off"
    training = TrainingSpec(
        max_seq_len=seq,
        micro_batch_size=batch,
        gradient_accumulation_steps=1,
        remat=on,
        remat_policy=remat if on else "full",
    )
    return TrainConfig(
        model_name=model,
        model_uri=f"gs://benchmark/{model}",
        dataset_uri="gs://benchmark/train.jsonl",
        lora=LoraSpec(
            rank=64,
            alpha=64,
            dropout=0.0,
            target_modules=list(model_shape(model).lora_targets),
            base_quantization=quantization,
        ),
        training=training,
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


def random_model(text: Decoder, config: TrainConfig, mesh: Any) -> Any:
    """The trainer's model (train/loop.py: build_model, adapt_for_training) on random base weights made on the
    devices, each array created where its partition spec puts it (nothing is built on the host or moved), one
    at a time and handed to the LoRA build as the loader hands each (with QLoRA, quantized as it is made)."""
    with jax.set_mesh(mesh):
        model = lora.abstract_base(text)
        build = lora.AdapterBuild(model, config.lora, mesh, config.training.seed, lora.ADAPTER_DTYPE)
    variables = dict(nnx.to_flat_state(nnx.state(model)))
    shardings = dict(nnx.to_flat_state(nnx.get_named_sharding(nnx.state(model), mesh)))

    fills: dict[tuple[Any, ...], Any] = {}
    for i, path in enumerate(list(variables)):
        variable = variables.pop(path)  # not held here after: `placed` may replace it in the model
        leaf, sharding = variable.get_value(), lora.value_of(shardings[path])
        sig = (leaf.shape, leaf.dtype, sharding)
        if sig not in fills:
            shape, dtype = leaf.shape, leaf.dtype
            fills[sig] = jax.jit(
                lambda k, shape=shape, dtype=dtype: spread(k, shape, dtype),
                out_shardings=sharding,
            )
        variable.set_value(fills[sig](jnp.uint32(i)))
        del variable
        build.placed(model, path)
    return adapt_for_training(model, config, mesh, build=build)


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
        # The micro-batch's loss targets (model/loss.py): the loss is per target whatever the rows.
        "loss_denominator": np.full((rows,), rows * (seq - 1), np.float32),
    }
    assert set(BATCH_ARRAYS) <= set(host)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
    return {k: jax.device_put(v, sharding) for k, v in host.items()}


def step_flops(text: Decoder, config: TrainConfig) -> float:
    """XLA's FLOP count of the trainer's step, lowered from shapes alone (preflight/step.py) on CPU devices:
    CUDA's backend gives no count for a lowered program. Off TPU the step takes the same attention path on
    every platform (the dense mask), so the CPU lowering is the accelerator's program before optimisation."""
    fsdp = config.mesh.fsdp
    cpus = jax.devices("cpu")
    mesh = make_mesh(fsdp, 1, cpus[:fsdp] if len(cpus) >= fsdp else jax.local_devices())
    with jax.set_mesh(mesh), mesh:
        step, _ = lower_train_step(text, config, mesh, TOTAL_STEPS)
        return lowered_flops(step)


class CutError(ValueError):
    """A cut that cannot hold one layer of each attention kind."""


def decoder(model_name: str, layers: int) -> Decoder:
    """The catalog model's decoder cut to `layers` layers (0: all of them), holding at least one layer of each
    attention kind the model has: its first `layers` layers, or, where those lack a kind, the first ones with
    the model's first layer of each missing kind last."""
    shape = model_shape(model_name)
    writer = tiny_gemma4 if shape.family == "gemma4" else tiny_qwen3
    text = families.parse_config(writer.hf_config(shape))
    if not layers:
        return text
    kinds = list(dict.fromkeys(text.layer_types))
    first = list(text.layer_types[:layers])
    missing = [k for k in kinds if k not in first]
    if len(kinds) > layers:
        raise CutError(
            f"--layers {layers}: {model_name} has {len(kinds)} attention kinds ({', '.join(kinds)}); a cut needs at "
            f"least {len(kinds)} layers to hold one of each"
        )
    return with_layers(text, tuple(first[: layers - len(missing)] + missing))


def layer_kinds(text: Decoder) -> str:
    """e.g. "5 sliding_attention + 1 full_attention"."""
    counts = {k: text.layer_types.count(k) for k in dict.fromkeys(text.layer_types)}
    return " + ".join(f"{n} {k}" for k, n in counts.items())


def flops_row(
    model_name: str, layers: int, seq: int, batch: int, remat: str, fsdp: int, quantization: str = "none"
) -> dict[str, Any]:
    """The FLOP count alone, from shapes (no device run): to complete rows measured with --no-flops."""
    text = decoder(model_name, layers)
    flops = step_flops(text, train_config(model_name, seq, batch, remat, fsdp, quantization))
    tokens = batch * seq * fsdp
    return {
        "model": model_name,
        "layers": text.num_layers,
        "maxSeqLen": seq,
        "microBatch": batch,
        "remat": remat,
        "baseQuantization": quantization,
        "tflopsPerStep": float(f"{flops / 1e12:.4g}"),
        "gflopsPerToken": float(f"{flops * fsdp / tokens / 1e9:.4g}"),
    }


def _gib(n: float) -> float:
    return round(n / GIB, 3)


def measure(
    model_name: str,
    layers: int,
    seq: int,
    batch: int,
    remat: str,
    steps: int,
    warmup: int,
    count_flops: bool = True,
    quantization: str = "none",
) -> dict[str, Any]:
    """One configuration trained for `warmup` + `steps` steps on every local device (fsdp over them). Run it in
    a process of its own (`run_config`): the device's peak memory is the process's."""
    text = decoder(model_name, layers)
    devices = jax.local_devices()
    config = train_config(model_name, seq, batch, remat, fsdp=len(devices), quantization=quantization)
    mesh = make_mesh(len(devices), 1, devices)
    rows = batch * len(devices)
    row: dict[str, Any] = {
        "model": model_name,
        "layers": text.num_layers,
        "layerTypes": layer_kinds(text),
        "maxSeqLen": seq,
        "microBatch": batch,
        "remat": remat,
        "baseQuantization": quantization,
        "devices": len(devices),
        "device": str(devices[0].device_kind),
        "jax": jax.__version__,
    }
    flops = step_flops(text, config) if count_flops else 0.0
    cache_dir = tempfile.mkdtemp(prefix="tpuforge-bench-cache-")
    config.compile_cache_uri = cache_dir
    # The step compiled as the preflight compiles it, here for these devices: XLA's memory analysis of the
    # program the trainer then runs (its first step loads it from the compile cache).
    compiled = compile_train_step(text, config, mesh, TOTAL_STEPS)
    row["compiled"] = {
        "argumentsGiB": _gib(compiled.argument_bytes),
        "temporariesGiB": _gib(compiled.temp_bytes),
        "outputsGiB": _gib(compiled.output_bytes - compiled.alias_bytes),
        "codeGiB": _gib(compiled.code_bytes),
        "stepGiB": _gib(compiled.hbm_bytes),
        "buildGiB": _gib(compiled.build_bytes),
        "compileSeconds": round(compiled.compile_seconds, 1),
        "attention": compiled.attention,
    }
    if compiled.out_of_hbm:
        row["error"] = f"does not fit: the compiler needs at least {_gib(compiled.temp_bytes)} GiB of temporaries"
        return row
    started = time.monotonic()
    inputs = compile_cache.key_inputs(text, config, TOTAL_STEPS, mesh.devices)
    with compile_cache.open_cache(cache_dir, inputs) as cache, jax.set_mesh(mesh), mesh:
        # Tunix's kernels read the legacy mesh context, the model the new one.
        model = random_model(text, config, mesh)
        jax.block_until_ready(nnx.state(model))
        row["buildSeconds"] = round(time.monotonic() - started, 1)
        model_state = [(path, v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
        trainer = make_trainer(model, config, TOTAL_STEPS, NoCheckpoints())
        batch_arrays = random_batch(config, text.vocab_size, mesh)
        train_step, _ = trainer.jit_train_and_eval_step()
        started = time.monotonic()
        loss, _, _ = train_step(batch_arrays)
        row["firstStepSeconds"] = round(time.monotonic() - started, 1)  # loading or compiling included
        row["lossFirst"] = round(float(loss), 4)
        for _ in range(max(0, warmup - 1)):
            jax.block_until_ready(train_step(batch_arrays))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss, _, _ = train_step(batch_arrays)
            loss.block_until_ready()
            times.append(time.perf_counter() - t0)
        row["lossLast"] = round(float(loss), 4)
    row["stepCacheHit"] = bool(cache and cache.counts["hits"])
    step_s = statistics.median(times)
    row.update(
        stepSeconds=round(step_s, 4),
        stepSecondsMin=round(min(times), 4),
        tokensPerSecond=round(rows * seq / step_s, 1),
    )
    model_total = model_flops.step_flops(text, model_state, rows, seq)
    row["modelTflopsPerStep"] = float(f"{model_total / len(devices) / 1e12:.4g}")  # per device
    peak = peak_tflops(devices[0])
    if peak:
        row.update(peakTflops=peak, mfu=round(model_total / len(devices) / step_s / (peak * 1e12), 4))
    if flops:
        achieved = flops / step_s / 1e12  # per device: each runs its share of the step
        row.update(tflopsPerStep=float(f"{flops / 1e12:.4g}"), achievedTflopsPerDevice=float(f"{achieved:.4g}"))
        if peak:
            row["hfu"] = round(achieved / peak, 4)
    stats = devices[0].memory_stats() or {}
    device_peak = stats.get("peak_bytes_in_use")
    if device_peak is not None:
        row["devicePeakGiB"] = _gib(device_peak)  # this process's: the build and every step
    row["peakMemoryGiB"] = max(row["compiled"]["stepGiB"], row["compiled"]["buildGiB"], row.get("devicePeakGiB", 0.0))
    return row


def baseline_row(device: Any, n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"baseline": "bf16 matmul", "n": n, "device": str(device.device_kind)}
    row["platform"] = device.platform
    row["tflops"] = float(f"{matmul_tflops(device, n):.4g}")
    peak = peak_tflops(device)
    if peak:
        row["ofPeak"] = round(row["tflops"] / peak, 3)
    return row


ROW_MARK = "BENCHMARK-ROW "


def in_child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this script with `args` in a process of its own; its row (or why there is none)."""
    cmd = [sys.executable, "-m", "benchmarks.train_throughput", *args]
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(ROW_MARK):
            return json.loads(line[len(ROW_MARK) :])  # type: ignore[no-any-return]
    return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"}


def child(args: argparse.Namespace) -> int:
    """One configuration, or the baseline (`--baseline`), in this process: its row, marked, on stdout."""
    logging.basicConfig(level=logging.WARNING)
    if args.baseline is not None:
        device = jax.local_devices()[0]
        row = baseline_row(device, args.baseline or (1024 if device.platform == "cpu" else 8192))
    else:
        c = json.loads(args.one)
        # The step's compile cache (measure: mkdtemp) goes in a folder of this process's, removed at its end.
        scratch = tempfile.TemporaryDirectory(prefix="tpuforge-bench-")
        tempfile.tempdir = scratch.name
        try:
            with attention.blocks_layout(c["splashLayout"]):  # the step's kernels are built as it is traced
                row = measure(
                    c["model"],
                    c["layers"],
                    c["seq"],
                    c["batch"],
                    c["remat"],
                    args.steps,
                    args.warmup,
                    c["flops"],
                    c["baseQuantization"],
                )
            row["splashLayout"] = c["splashLayout"]
        except CutError as e:
            row = {"error": str(e)}
        finally:
            tempfile.tempdir = None
            scratch.cleanup()
    print(ROW_MARK + json.dumps(row), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a catalog model (default: gemma4-31b on an accelerator, gemma4-tiny on CPU)")
    ap.add_argument("--layers", help="comma-separated; 0 is the whole model (default: 6,12; on CPU 0)")
    ap.add_argument("--seq", help="comma-separated maxSeqLen (default: 3072, the report's; on CPU 128)")
    ap.add_argument("--batch", help="comma-separated micro batch (default: 1; on CPU 2)")
    ap.add_argument(
        "--remat", default="full", choices=("off", *REMAT_POLICIES), help="off, or what remat keeps (default full)"
    )
    ap.add_argument(
        "--splash-layout",
        default=attention.layout,
        choices=attention.LAYOUTS,
        help=f"the splash kernels' block layout (default {attention.layout})",
    )
    ap.add_argument(
        "--base-quantization",
        default="none",
        choices=BASE_QUANTIZATIONS,
        help="QLoRA: the frozen base's quantization (default none)",
    )
    ap.add_argument("--no-flops", action="store_true", help="skip XLA's FLOP count (one more trace of the step)")
    ap.add_argument("--flops-only", type=int, metavar="DEVICES", help="only the FLOP counts, for a mesh of fsdp=N")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--matmul", type=int, default=0, help="baseline matrix size (0: 8192 on GPU/TPU, 1024 on CPU)")
    ap.add_argument("--json", help="append each result here as a JSON line")
    ap.add_argument("--timeout", type=float, default=900, help="seconds each configuration may take")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: one configuration (JSON)
    ap.add_argument("--baseline", type=int, help=argparse.SUPPRESS)  # a child: the baseline
    args = ap.parse_args(argv)
    if args.one is not None or args.baseline is not None:
        return child(args)
    logging.basicConfig(level=logging.WARNING)

    baseline = None
    if args.flops_only:
        platform = "cpu"
    else:  # the baseline's process also says what the devices are, so this one never touches them
        baseline = in_child(["--baseline", str(args.matmul)], args.timeout)
        emit(baseline, args.json)
        platform = baseline.get("platform", "cpu")
    for name, value in zip(
        ("model", "layers", "seq", "batch"), CPU_DEFAULTS if platform == "cpu" else DEFAULTS, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, value)
    remat = args.remat
    for layers in (int(x) for x in args.layers.split(",")):
        for seq in (int(x) for x in args.seq.split(",")):
            for batch in (int(x) for x in args.batch.split(",")):
                if args.flops_only:
                    row = flops_row(args.model, layers, seq, batch, remat, args.flops_only, args.base_quantization)
                    emit(row, args.json)
                    continue
                config = {"model": args.model, "layers": layers, "seq": seq, "batch": batch, "remat": remat}
                config["splashLayout"] = args.splash_layout
                config["baseQuantization"] = args.base_quantization
                flags = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
                row = in_child(["--one", json.dumps({**config, "flops": not args.no_flops}), *flags], args.timeout)
                if "error" in row:
                    row = {**config, **row}
                if baseline and baseline.get("tflops") and row.get("achievedTflopsPerDevice"):
                    row["ofBaseline"] = round(row["achievedTflopsPerDevice"] / baseline["tflops"], 3)
                emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
