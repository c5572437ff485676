"""The tiny Gemma 4 LoRA run the step-time benchmarks (train_overhead.py, train_multihost.py) time: rank 8
without dropout, packed rows, a short warm-up, no rematerialisation, checkpoints only at the end and no
metrics server; each benchmark chooses the batch shape and the mesh."""

from __future__ import annotations

from pathlib import Path

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec


def train_config(
    model_dir: Path,
    data: Path,
    ckpt: Path,
    steps: int,
    *,
    seq: int,
    micro_batch: int,
    accumulation: int,
    mesh: MeshSpec,
) -> TrainConfig:
    return TrainConfig(
        model_name="gemma4-tiny",
        model_uri=str(model_dir),
        dataset_uri=str(data),
        lora=LoraSpec(rank=8, alpha=16.0, dropout=0.0),
        training=TrainingSpec(
            max_seq_len=seq,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=accumulation,
            max_steps=steps,
            learning_rate=1e-3,
            warmup_steps=1,
            packing=True,
            remat=False,
        ),
        mesh=mesh,
        # Checkpoints only at the end: the comparisons are about the step, not checkpoint I/O.
        checkpoint=CheckpointSpec(uri=str(ckpt), every_steps=10_000, keep=1),
        metrics_port=0,
    )
