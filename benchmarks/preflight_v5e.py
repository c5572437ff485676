"""The preflight's verdicts for the catalog's large models on TPU v5e slices, compiled on this CPU host for each
slice's v5e topology (libtpu, no TPU), as `tpuforge preflight` compiles a job: the trainer's step and its model
build, three small decoders extrapolated to the whole model.

    python benchmarks/preflight_v5e.py [--models gemma4-31b,qwen3-8b] [--seq 3072] [--json out.jsonl]
        [--base-quantization none|int8|int4] [--cuts 1,2,4,8]

Each model is tried on the smallest v5e slice that holds its weights by the catalog's rule of thumb
(TRAIN_WEIGHT_SHARE, catalog.holds_for_training) and on the next smaller one, with the report's recipe (LoRA
rank 64 on the catalog's targets, micro-batch 1 x 8 accumulated, remat on), on the base as it is or quantized
(QLoRA, `--base-quantization`). docs/performance.md records the verdicts.

`--cuts N,...`: instead of the verdict, the step compiled whole at N sliding layers each (with remat on, as the
job runs), its arguments and temporaries per chip: how they grow with the layers, which the preflight takes as
linear from its probes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks.rows import emit

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import TPU_SLICES, holds_for_training, model_shape
from tpuforge_workloads import families
from tpuforge_workloads.families.gemma4 import tiny as tiny_gemma4
from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.run import SLIDING, preflight, with_remat
from tpuforge_workloads.preflight.step import GIB, compile_train_step, with_layers
from tpuforge_workloads.preflight.topology import slice_devices

V5E = [s for s in TPU_SLICES.values() if s.accelerator == "tpu-v5-lite-podslice"]
STEPS = 1244  # the report's run: one epoch of 10k rows


def decoder(model_name: str) -> Any:
    shape = model_shape(model_name)
    writer = tiny_gemma4 if shape.family == "gemma4" else tiny_qwen3
    return families.parse_config(writer.hf_config(shape))


def slices_for(model_name: str) -> list[str]:
    """The smallest v5e slice that holds the model by the catalog's rule, and the largest one that does not."""
    shape = model_shape(model_name)
    ordered = sorted(V5E, key=lambda s: s.chips)
    holds = [s.id for s in ordered if holds_for_training(shape, s)]
    short = [s.id for s in ordered if not holds_for_training(shape, s)]
    return short[-1:] + holds[:1]


def config(model_name: str, slice_id: str, seq: int, base_quantization: str = "none") -> TrainConfig:
    slc = TPU_SLICES[slice_id]
    shape = model_shape(model_name)
    return TrainConfig(
        model_name=model_name,
        model_uri=f"gs://preflight/{model_name}",
        dataset_uri="gs://preflight/train.jsonl",
        lora=LoraSpec(
            rank=64,
            alpha=64,
            dropout=0.05,
            target_modules=list(shape.lora_targets),
            base_quantization=base_quantization,
        ),
        training=TrainingSpec(max_seq_len=seq, micro_batch_size=1, gradient_accumulation_steps=8, remat=True),
        mesh=MeshSpec(fsdp=slc.default_fsdp, tp=slc.default_tp),
        checkpoint=CheckpointSpec(uri="gs://preflight/checkpoints"),
        metrics_port=0,
    )


def cuts(model_name: str, slice_id: str, seq: int, base_quantization: str, layers: list[int]) -> list[dict[str, Any]]:
    """The job's step (remat on) compiled whole at each number of sliding layers, for the slice's topology."""
    slc = TPU_SLICES[slice_id]
    job = with_remat(config(model_name, slice_id, seq, base_quantization), True)
    mesh = make_mesh(job.mesh.fsdp, job.mesh.tp, slice_devices(slc))
    rows = []
    for n in layers:
        c = compile_train_step(with_layers(decoder(model_name), (SLIDING,) * n), job, mesh, STEPS)
        rows.append(
            {
                "model": model_name,
                "slice": slice_id,
                "maxSeqLen": seq,
                "baseQuantization": base_quantization,
                "slidingLayers": n,
                "argumentsGiB": round(c.argument_bytes / GIB, 3),
                "temporariesGiB": round(c.temp_bytes / GIB, 3),
                "compileSeconds": round(c.compile_seconds),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gemma4-31b,qwen3-8b")
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--slices", help="comma-separated v5e slices (default: per model, see the docstring)")
    ap.add_argument("--json", help="append each verdict here as a JSON line")
    ap.add_argument("--base-quantization", default="none", choices=("none", "int8", "int4"), help="QLoRA's base")
    ap.add_argument("--cuts", help="comma-separated numbers of sliding layers: each compiled whole (no verdict)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for model_name in args.models.split(","):
        slice_ids = args.slices.split(",") if args.slices else slices_for(model_name)
        if args.cuts:
            layers = [int(x) for x in args.cuts.split(",")]
            for slice_id in slice_ids:
                for row in cuts(model_name, slice_id, args.seq, args.base_quantization, layers):
                    emit(row, args.json)
            continue
        text = decoder(model_name)
        for slice_id in slice_ids:
            report = preflight(
                text, config(model_name, slice_id, args.seq, args.base_quantization), TPU_SLICES[slice_id], STEPS
            )
            row = {"model": model_name, "maxSeqLen": args.seq, "baseQuantization": args.base_quantization}
            row.update(report.to_json())
            emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
