"""What the preflight says of Gemma 4 31B LoRA SFT on v5p slices, and whether its per-layer extrapolation
holds. Everything is compiled in this run by libtpu for the real TPU topology, on this CPU machine.

1. Table: HBM per chip and TFLOP per chip per micro-batch of the whole 60-layer model (extrapolated from
   the preflight's three small compiles) for each slice x maxSeqLen x micro batch, and the largest micro
   batch that fits each (slice, maxSeqLen).
2. The extrapolation against a whole compile of the first `--check-layers` layers (ratio, target within
   5% on HBM and FLOPs).
3. The physical limit of a v5p-8 from these FLOPs (tokens/s at 100% of 459 TFLOP/s per chip), and the MFU
   that the report's measured 763 tokens/s on a v5p-8 corresponds to.

    .venv/bin/python benchmarks/preflight_31b.py [--slices v5p-8,v5p-16] [--seq 1024,2048,4096,8192]
        [--batch 1,2,4] [--check-layers 12] [--check-seq 4096] [--skip-mfu] [--skip-table]
        [--base-quantization none int8] [--json out.json]

Compiles are single-threaded for much of their time: on a 2-core machine each probe of 1-2 layers takes
about a minute, a 12-layer compile several.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight import estimate as est
from tpuforge_workloads.preflight.run import PROBES, preflight
from tpuforge_workloads.preflight.step import GIB, compile_train_step, with_layers
from tpuforge_workloads.preflight.topology import slice_devices

REPORT_TOKENS_PER_SECOND = 763.0  # the report's Gemma 4 31B LoRA SFT on a v5p-8
REPORT_SEQ = 3072  # its maxSeqLen (1 x 8 micro-batches of 3072 tokens)
STEPS = 1244  # its run: one epoch of 10k rows


def config_31b(
    slice_id: str, seq: int, batch: int, accumulation: int = 8, remat: bool = True, base_quantization: str = "none"
) -> TrainConfig:
    slc = TPU_SLICES[slice_id]
    return TrainConfig(
        model_name="gemma4-31b",
        model_uri="gs://preflight/gemma4-31b",
        dataset_uri="gs://preflight/train.jsonl",
        lora=LoraSpec(rank=64, alpha=64, dropout=0.05, base_quantization=base_quantization),  # type: ignore[arg-type]
        training=TrainingSpec(
            max_seq_len=seq, micro_batch_size=batch, gradient_accumulation_steps=accumulation, remat=remat
        ),
        mesh=MeshSpec(fsdp=slc.default_fsdp, tp=slc.default_tp),
        checkpoint=CheckpointSpec(uri="gs://preflight/checkpoints"),
        metrics_port=0,
    )


def text_31b() -> gemma4_config.Gemma4Text:
    return gemma4_config.parse_config(tiny_model.hf_config(model_shape("gemma4-31b")))


def table(
    slices: list[str], seqs: list[int], batches: list[int], quantizations: list[str] | None = None
) -> list[dict[str, Any]]:
    text = text_31b()
    rows = []
    runs = [(sl, sq, b, q) for sl in slices for sq in seqs for b in batches for q in quantizations or ["none"]]
    for slice_id, seq, batch, quantization in runs:
        config = config_31b(slice_id, seq, batch, base_quantization=quantization)
        r = preflight(text, config, TPU_SLICES[slice_id], STEPS)
        e = r.estimate
        row = {
            "slice": slice_id,
            "maxSeqLen": seq,
            "microBatch": batch,
            "fits": e.fits,
            "lowerBound": r.lower_bound,
            "hbmPerChipGiB": round(e.hbm_per_chip_gib, 2),
            "argumentsGiB": round(e.argument_gib, 2),
            "temporariesGiB": round(e.temp_gib, 2),
            # outputs not written over donated inputs, and the program (estimate.py)
            "otherGiB": round(e.hbm_per_chip_gib - e.argument_gib - e.temp_gib, 2),
            "tflopsPerMicroBatch": round(e.tflops_per_step / 8, 2),
            "compileSeconds": round(r.compile_seconds, 1),
        }
        if quantizations:
            row |= {"baseQuantization": quantization, "buildGiB": round(e.build_gib, 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def check_extrapolation(slice_id: str, layers: int, seq: int = 4096) -> dict[str, Any]:
    """The first `layers` layers of the 31B at maxSeqLen `seq`: compiled whole, and extrapolated from the
    probes."""
    slc = TPU_SLICES[slice_id]
    text = text_31b()
    cut = with_layers(text, text.layer_types[:layers])
    config = config_31b(slice_id, seq, 1)
    mesh = make_mesh(config.mesh.fsdp, config.mesh.tp, slice_devices(slc))
    t0 = time.monotonic()
    probes = [compile_train_step(with_layers(text, p), config, mesh, STEPS) for p in PROBES]
    probe_s = time.monotonic() - t0
    extrapolated = est.extrapolate(probes, cut.layer_types)
    whole = compile_train_step(cut, config, mesh, STEPS)
    w = est.PerChip.of(whole)
    return {
        "slice": slice_id,
        "layers": layers,
        "maxSeqLen": seq,
        "whole": {"hbmGiB": w.total_bytes / GIB, "tempGiB": w.temp_bytes / GIB, "tflops": w.flops / 1e12},
        "extrapolated": {
            "hbmGiB": extrapolated.total_bytes / GIB,
            "tempGiB": extrapolated.temp_bytes / GIB,
            "tflops": extrapolated.flops / 1e12,
        },
        "ratio_hbm": extrapolated.total_bytes / w.total_bytes,
        "ratio_flops": extrapolated.flops / w.flops,
        "probe_compile_s": probe_s,
        "whole_compile_s": whole.compile_seconds,
    }


def report_mfu() -> dict[str, Any]:
    """The MFU of the report's 763 tok/s on a v5p-8, and the v5p-8's physical limit, by XLA's FLOPs."""
    slc = TPU_SLICES["v5p-8"]
    r = preflight(text_31b(), config_31b("v5p-8", REPORT_SEQ, 1), slc, STEPS)
    fpt = r.estimate.flops_per_token * slc.chips  # the whole slice's FLOPs per token
    limit = slc.chips * slc.peak_tflops_per_chip * 1e12 / fpt
    return {
        "maxSeqLen": REPORT_SEQ,
        "hbmPerChipGiB": round(r.estimate.hbm_per_chip_gib, 2),
        "fits": r.estimate.fits,
        "tflopsPerMicroBatch": round(r.estimate.tflops_per_step / 8, 2),
        "compileSeconds": round(r.compile_seconds, 1),
        "flopsPerTokenSlice": fpt,
        "tokensPerSecondAt100PercentPeak": limit,
        "reportTokensPerSecond": REPORT_TOKENS_PER_SECOND,
        "reportMFU": est.mfu_of(REPORT_TOKENS_PER_SECOND, r.estimate.flops_per_token, slc),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slices", default="v5p-8,v5p-16")
    ap.add_argument("--seq", default="1024,2048,4096,8192")
    ap.add_argument("--batch", default="1,2,4")
    ap.add_argument("--check-layers", type=int, default=12, help="0 skips the whole-compile check")
    ap.add_argument("--check-seq", type=int, default=4096, help="maxSeqLen of the whole-compile check")
    ap.add_argument("--skip-mfu", action="store_true", help="skip the report's MFU (three probes at 3072)")
    ap.add_argument("--skip-table", action="store_true")
    ap.add_argument(
        "--base-quantization",
        nargs="+",
        choices=["none", "int8", "int4"],
        help="QLoRA: one table row per value (spec.lora.baseQuantization), with the model build's peak",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out: dict[str, Any] = {}
    if not args.skip_mfu:
        out["mfu"] = report_mfu()
        print(json.dumps(out["mfu"]), flush=True)
    if args.check_layers:
        out["extrapolation"] = check_extrapolation("v5p-8", args.check_layers, args.check_seq)
        print(json.dumps(out["extrapolation"]), flush=True)
    if not args.skip_table:
        slices = args.slices.split(",")
        seqs = [int(s) for s in args.seq.split(",")]
        rows = table(slices, seqs, [int(b) for b in args.batch.split(",")], args.base_quantization)
        out["table"] = rows
        for slice_id in slices:
            for seq in seqs:
                fit = [r["microBatch"] for r in rows if r["slice"] == slice_id and r["maxSeqLen"] == seq and r["fits"]]
                print(f"{slice_id} maxSeqLen {seq}: largest micro batch that fits: {max(fit) if fit else 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
