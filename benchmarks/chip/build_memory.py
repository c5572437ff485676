"""The model build's memory on the devices at hand: the base with random weights made in place, the LoRA
adapters added (lora.AdapterBuild, as the trainer adds them), and what that held at its peak, beside what the
attempt holds at rest (base + adapters + the optimizer's two float32 moments) and XLA's analysis of the
compiled build (the preflight's figure). With `--base-quantization int8|int4` (QLoRA) each targeted weight is
quantized as it is made, as the loader quantizes it as it reads it, and "base" is the quantized base.

    python -m benchmarks.chip.build_memory [--model gemma4-31b] [--layers 6] [--base-quantization int8]
        [--json out.jsonl]

Run it in a process of its own: the device's peak is the process's.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jax
import numpy as np
from benchmarks.rows import emit
from benchmarks.train_throughput import GIB, decoder, layer_kinds, random_model, train_config
from flax import nnx

from tpuforge.api.finetune import BASE_QUANTIZATIONS
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import build_bytes, build_programs


def _bytes(tree: Any) -> int:
    """Bytes of the arrays of `tree` (int4 at half a byte)."""
    return sum(int(np.prod(x.shape)) * jax.dtypes.itemsize_bits(x.dtype) // 8 for x in jax.tree.leaves(tree))


def measure(model_name: str, layers: int, quantization: str = "none") -> dict[str, Any]:
    text = decoder(model_name, layers)
    devices = jax.local_devices()
    config = train_config(model_name, 2048, 1, "full", fsdp=len(devices), quantization=quantization)
    mesh = make_mesh(len(devices), 1, devices)
    with jax.set_mesh(mesh):
        base = lora.abstract_base(text)
    build = lora.AdapterBuild(base, config.lora, mesh, config.training.seed, lora.ADAPTER_DTYPE)
    # What the LoRA model holds besides the adapters: the base, quantized where QLoRA quantizes it.
    base_bytes, adapter_bytes = _bytes(build.rest), _bytes(build.adapters)
    compiled = build_bytes(build_programs(build, base, mesh))
    started = time.monotonic()
    with jax.set_mesh(mesh), mesh:
        model = random_model(text, config, mesh)
        jax.block_until_ready(nnx.state(model))
    n = len(devices)
    at_rest = (base_bytes + 3 * adapter_bytes) / n  # per device: base, adapters, AdamW's two moments
    row: dict[str, Any] = {
        "model": model_name,
        "layers": text.num_layers,
        "baseQuantization": quantization,
        "layerTypes": layer_kinds(text),
        "devices": n,
        "device": str(devices[0].device_kind),
        "buildSeconds": round(time.monotonic() - started, 1),
        "baseGiB": round(base_bytes / n / GIB, 3),
        "adaptersGiB": round(adapter_bytes / n / GIB, 3),
        "atRestGiB": round(at_rest / GIB, 3),
        "compiledBuildGiB": round(compiled / GIB, 3) if compiled else None,
    }
    stats = devices[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        row["devicePeakGiB"] = round(stats["peak_bytes_in_use"] / GIB, 3)
        row["peakOverAtRest"] = round(stats["peak_bytes_in_use"] / at_rest, 3)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma4-31b")
    ap.add_argument("--layers", type=int, default=6, help="0: the whole model")
    ap.add_argument("--base-quantization", default="none", choices=BASE_QUANTIZATIONS, help="QLoRA's base")
    ap.add_argument("--json", help="append the row here")
    args = ap.parse_args(argv)
    row = measure(args.model, args.layers, args.base_quantization)
    emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
