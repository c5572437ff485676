"""One Gemma 4 31B layer's train step compiled for a v5p-8 with each attention path: the masked one (every
T x T score, the mask in HBM) and splash attention with segment ids (attention.py), in the same run.

The trainer picks splash on TPU by itself; the masked path is measured here by making that choice say no
(`attention.use_splash`), so both compiles are the trainer's own step on the same model, batch and mesh.
Prints one JSON line per compile (HBM per chip: arguments, outputs, temporaries, total; TFLOP per chip
per micro-batch; compile seconds; which attention the compiled program runs) and the splash/masked ratios.

    .venv/bin/python benchmarks/attention_31b.py [--seq 2048] [--layers sliding,full] [--paths masked,splash]

A 31B layer at 2048 tokens takes several minutes to compile on a 2-core machine; at 4096 tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from typing import Any
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge_workloads.families import attention
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import GIB, compile_train_step, with_layers
from tpuforge_workloads.preflight.topology import slice_devices

KINDS = {"sliding": "sliding_attention", "full": "full_attention"}


def config(seq: int) -> TrainConfig:
    """The report's recipe on a v5p-8: LoRA rank 64 on the 7 targets, micro batch 1 x 8, remat on."""
    return TrainConfig(
        model_name="gemma4-31b",
        model_uri="gs://preflight/gemma4-31b",
        dataset_uri="gs://preflight/train.jsonl",
        lora=LoraSpec(rank=64, alpha=64, dropout=0.05),
        training=TrainingSpec(max_seq_len=seq, warmup_steps=1),
        mesh=MeshSpec(fsdp=1, tp=4),
        checkpoint=CheckpointSpec(uri="gs://preflight/checkpoints"),
        metrics_port=0,
    )


def measure(kind: str, seq: int, path: str) -> dict[str, Any]:
    text = gemma4_config.parse_config(tiny_model.hf_config(model_shape("gemma4-31b")))
    mesh = make_mesh(1, 4, slice_devices(TPU_SLICES["v5p-8"]))
    choice = mock.patch.object(attention, "use_splash", lambda seq_len: False) if path == "masked" else nullcontext()
    with choice:
        s = compile_train_step(with_layers(text, (KINDS[kind],)), config(seq), mesh, total_steps=10)
    return {
        "layer": kind,
        "maxSeqLen": seq,
        "path": path,
        "compiled": s.attention,
        "argumentsGiB": round(s.argument_bytes / GIB, 3),
        "outputsGiB": round(s.output_bytes / GIB, 3),
        "temporariesGiB": round(s.temp_bytes / GIB, 3),
        "hbmPerChipGiB": round(s.hbm_bytes / GIB, 3),
        "tflopsPerChip": round(s.flops / 1e12, 3),
        "compileSeconds": round(s.compile_seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", default="sliding,full")
    ap.add_argument("--paths", default="masked,splash")
    args = ap.parse_args(argv)
    rows = []
    for kind in args.layers.split(","):
        for path in args.paths.split(","):
            rows.append(measure(kind, args.seq, path))
            print(json.dumps(rows[-1]), flush=True)
        pair = {r["path"]: r for r in rows if r["layer"] == kind}
        if {"masked", "splash"} <= pair.keys():
            m, s = pair["masked"], pair["splash"]
            ratios = {k: round(s[k] / m[k], 3) for k in ("temporariesGiB", "hbmPerChipGiB", "tflopsPerChip") if m[k]}
            print(json.dumps({"layer": kind, "maxSeqLen": args.seq, "splash/masked": ratios}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
