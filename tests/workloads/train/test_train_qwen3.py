"""The trainer CLI on qwen3-tiny, the second family end to end: its ChatML rows, Tunix's Qwen3 with LoRA on
Qwen3's seven projections, on an fsdp 2 x tp 2 mesh of 4 virtual CPU devices, model, data and checkpoints on
fake GCS. The targets are the spec's default, which stands for Qwen3's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.models import RUNS_BUCKET, TrainerProcess, read_summary, tiny_train_config
from tpuforge import api
from tpuforge.api import TrainResult
from tpuforge.api.catalog import QWEN3_LORA_TARGETS
from tpuforge_workloads import storage
from tpuforge_workloads.model import lora

pytestmark = pytest.mark.slow


def test_a_qwen3_job_trains_with_its_own_targets_and_checkpoints(
    gcs: Any, tiny_qwen3_model_gs: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    from tpuforge_sandbox.gcs import create_bucket

    create_bucket(gcs.url, RUNS_BUCKET)
    # What the operator hands the trainer: the spec's LoRA, left at its default, resolved for the model.
    spec = api.FineTuneJobSpec.model_validate(
        {
            "model": {"name": "qwen3-tiny", "uri": tiny_qwen3_model_gs},
            "dataset": {"uri": chat_dataset_gs},
            "lora": {"rank": 8, "alpha": 16.0},
            "training": {"maxSeqLen": 64},
            "checkpoint": {"uri": "gs://r/c"},
            "output": {"uri": "gs://r/o"},
            "serviceAccountName": "trainer",
        }
    )
    assert spec.lora.target_modules == list(QWEN3_LORA_TARGETS)
    config = tiny_train_config(
        tiny_qwen3_model_gs, chat_dataset_gs, f"gs://{RUNS_BUCKET}/qwen3/checkpoints", max_steps=16
    )
    config.model_name = "qwen3-tiny"
    config.lora = spec.lora
    config.mesh = api.MeshSpec(fsdp=2, tp=2)
    trainer = TrainerProcess(config, tmp_path / "run")
    assert trainer.run() == 0, trainer.output()
    result = TrainResult.model_validate_json(trainer.termination_message())
    assert result.step == 16, result.message
    losses = {int(k): v for a in read_summary(config.checkpoint.uri)["attempts"] for k, v in a["losses"].items()}
    first, last = np.mean([losses[1], losses[2]]), np.mean([losses[15], losses[16]])
    assert last < 0.8 * first, losses
    manifest = lora.read_manifest(config.checkpoint.uri)
    assert manifest is not None
    assert (manifest.model_name, sorted(manifest.target_modules)) == ("qwen3-tiny", sorted(QWEN3_LORA_TARGETS))
    steps = {int(n.split("/")[0]) for n in storage.list_files(config.checkpoint.uri) if n.split("/")[0].isdigit()}
    assert 16 in steps
