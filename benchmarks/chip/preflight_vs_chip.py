"""The preflight's figure for one TPU v5e chip beside the chip's own compile of the same step: the 31B cut to
2, 4 or 6 layers (both attention kinds kept, benchmarks/train_throughput.py) at a sequence length, micro-batch 1,
remat on, LoRA rank 64.

- `--side cpu` (a CPU host with libtpu): the preflight's figures, compiled for the v5e 1x1 topology as
  `tpuforge preflight` compiles them (three probes, extrapolated to each cut; run/estimate.py), for every
  cut at once;
- `--side chip` (on the TPU): the cut's whole step compiled for the chip itself, and whether libtpu fits it.

    python -m benchmarks.chip.preflight_vs_chip --side cpu|chip [--layers 2,4,6] [--seq 2048,4096] [--json out]
        [--hlo DIR] [--base-quantization none|int8|int4]

`--base-quantization`: QLoRA's base (spec.lora.baseQuantization), to check the preflight's extrapolation of a
quantized base's step against the chip's whole compile as well.

`--hlo DIR`: also write each cut's lowered program (StableHLO text, gzipped) as DIR/<side>-<layers>x<seq>.mlir.gz
and its sha256 in the row, to tell a difference of program from a difference of compiler between the sides, and
the compiled program (<side>-<layers>x<seq>.hlo.gz, where the compiler fits it) to diff the two compilers' work.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
from pathlib import Path
from typing import Any

from benchmarks.rows import emit
from benchmarks.train_throughput import decoder, layer_kinds, train_config

from tpuforge.api.catalog import TPU_SLICES
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight import estimate as est
from tpuforge_workloads.preflight.run import PROBES
from tpuforge_workloads.preflight.step import GIB, CompiledStep, compile_train_step, lower_train_step, with_layers

SLICE = TPU_SLICES["v5litepod-1"]
STEPS = 1000


def _row(
    side: str, cut: Any, seq: int, figures: est.PerChip, refused: bool, seconds: float, quantization: str
) -> dict[str, Any]:
    step = figures.total_bytes / GIB
    build = figures.build_bytes / GIB
    return {
        "side": side,
        "baseQuantization": quantization,
        "layers": cut.num_layers,
        "layerTypes": layer_kinds(cut),
        "maxSeqLen": seq,
        "stepGiB": round(step, 3),
        "argumentsGiB": round(figures.argument_bytes / GIB, 3),
        "temporariesGiB": round(figures.temp_bytes / GIB, 3),
        "buildGiB": round(build, 3),
        "refusedByCompiler": refused,
        "fits": not refused and max(step, build) <= SLICE.hbm_gib_per_chip,
        "compileSeconds": round(seconds, 1),
    }


def lowered_text(cut: Any, seq: int, mesh: Any, side: str, hlo: Path, quantization: str) -> str:
    """The cut's lowered train step, written gzipped under `hlo`, and the program as compiled where the
    compiler fits it (<side>-<layers>x<seq>.hlo.gz: optimised HLO with its schedule); the lowered one's sha256."""
    import jax

    hlo.mkdir(parents=True, exist_ok=True)
    with jax.set_mesh(mesh), mesh:
        lowered = lower_train_step(cut, train_config("gemma4-31b", seq, 1, "full", 1, quantization), mesh, STEPS)[0]
        text = lowered.as_text()
        with gzip.open(hlo / f"{side}-{cut.num_layers}x{seq}.mlir.gz", "wt") as f:
            f.write(text)
        try:
            compiled = lowered.compile().as_text()
        except jax.errors.JaxRuntimeError as e:
            compiled = f"// not compiled: {str(e)[:2000]}\n"
    with gzip.open(hlo / f"{side}-{cut.num_layers}x{seq}.hlo.gz", "wt") as f:
        f.write(compiled)
    return hashlib.sha256(text.encode()).hexdigest()


def cpu_side(layers: list[int], seq: int, hlo: Path | None, quantization: str) -> list[dict[str, Any]]:
    from tpuforge_workloads.preflight.topology import slice_devices

    text = decoder("gemma4-31b", 0)
    config = train_config("gemma4-31b", seq, 1, "full", 1, quantization)
    mesh = make_mesh(1, 1, slice_devices(SLICE))
    probes: list[CompiledStep] = [compile_train_step(with_layers(text, p), config, mesh, STEPS) for p in PROBES]
    seconds = sum(p.compile_seconds for p in probes)
    rows = []
    for n in layers:
        cut = decoder("gemma4-31b", n)
        refused = any(p.out_of_hbm for p in probes)
        rows.append(_row("cpu", cut, seq, est.extrapolate(probes, cut.layer_types), refused, seconds, quantization))
        if hlo is not None:
            rows[-1]["loweredSha256"] = lowered_text(cut, seq, mesh, "cpu", hlo, quantization)
    return rows


def chip_side(layers: list[int], seq: int, hlo: Path | None, quantization: str) -> list[dict[str, Any]]:
    import jax

    rows = []
    for n in layers:
        cut = decoder("gemma4-31b", n)
        mesh = make_mesh(1, 1, jax.local_devices()[:1])
        c = compile_train_step(cut, train_config("gemma4-31b", seq, 1, "full", 1, quantization), mesh, STEPS)
        row = _row("chip", cut, seq, est.PerChip.of(c), c.out_of_hbm, c.compile_seconds, quantization)
        row["device"] = str(mesh.devices.flat[0].device_kind)
        if hlo is not None:
            row["loweredSha256"] = lowered_text(cut, seq, mesh, "chip", hlo, quantization)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=("cpu", "chip"), required=True)
    ap.add_argument("--layers", default="2,4,6")
    ap.add_argument("--seq", default="2048,4096")
    ap.add_argument("--json", help="append each row here")
    ap.add_argument("--hlo", type=Path, help="write each cut's lowered program here (gzipped) and its sha256")
    ap.add_argument("--base-quantization", default="none", choices=("none", "int8", "int4"), help="QLoRA's base")
    args = ap.parse_args(argv)
    if args.side == "cpu":  # before any backend starts: on a host with libtpu, JAX would otherwise open a TPU
        import jax

        jax.config.update("jax_platforms", "cpu")
    layers = [int(x) for x in args.layers.split(",")]
    for seq in (int(x) for x in args.seq.split(",")):
        rows = (cpu_side if args.side == "cpu" else chip_side)(layers, seq, args.hlo, args.base_quantization)
        for row in rows:
            emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
