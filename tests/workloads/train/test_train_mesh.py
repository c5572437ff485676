"""Mesh invariance: one job on meshes of 4 virtual CPU devices laid out as fsdp 1 x tp 4, 2 x 2 and 4 x 1, with
microBatchSize scaled so that every mesh takes the same examples a step (microBatchSize x fsdp), trains on
the same records in the same order and reaches the same losses. The two-host slice against one process of
all its devices is test_train_multihost.py's. What a mesh does change (the same microBatchSize on a wider
fsdp is a bigger batch) is in the status (progress.examplesPerStep) and docs/training.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.models import TrainerProcess, read_summary, tiny_train_config
from tpuforge.api import MeshSpec, TrainConfig
from tpuforge_workloads.data.pipeline import MicroBatches
from tpuforge_workloads.train.plan import make_plan

pytestmark = pytest.mark.slow

STEPS = 6
EXAMPLES = 4  # a micro-batch's rows, on every mesh
MESHES = ((1, 4), (2, 2), (4, 1))
# The meshes add partial sums (over tp shards, over fsdp rows) in other orders, nothing else: the tolerance is
# test_train_multihost.py's for two hosts against one process.
RTOL = 1e-4


def _config(model: Path, data: Path, ckpt: Path, fsdp: int, tp: int) -> TrainConfig:
    config = tiny_train_config(str(model), str(data), str(ckpt), max_steps=STEPS, micro_batch_size=EXAMPLES // fsdp)
    config.mesh = MeshSpec(fsdp=fsdp, tp=tp)
    return config


def test_every_mesh_of_the_same_examples_a_step_sees_the_same_records_in_the_same_order(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    plans = [make_plan(_config(tiny_model_dir, chat_dataset, tmp_path / f"{f}x{t}", f, t)) for f, t in MESHES]
    assert {p.examples_per_step for p in plans} == {EXAMPLES * 2}  # accumulation 2
    reference = MicroBatches(plans[0].examples, plans[0].batch)
    for plan in plans[1:]:
        source = MicroBatches(plan.examples, plan.batch)
        for i in range(STEPS * 2):
            for key, value in reference[i].items():
                np.testing.assert_array_equal(source[i][key], value, err_msg=f"micro-batch {i} {key}")


def test_every_mesh_of_the_same_examples_a_step_reaches_the_same_losses(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    losses = {}
    for fsdp, tp in MESHES:
        config = _config(tiny_model_dir, chat_dataset, tmp_path / f"{fsdp}x{tp}" / "checkpoints", fsdp, tp)
        trainer = TrainerProcess(config, tmp_path / f"{fsdp}x{tp}")
        assert trainer.run() == 0, trainer.output()
        (attempt,) = read_summary(config.checkpoint.uri)["attempts"]
        assert attempt["examples_per_step"] == EXAMPLES * 2
        losses[(fsdp, tp)] = [attempt["losses"][str(s)] for s in range(1, STEPS + 1)]
    reference = np.array(losses[MESHES[0]])
    assert reference[-1] < reference[0]  # it learns
    for mesh in MESHES[1:]:
        np.testing.assert_allclose(losses[mesh], reference, rtol=RTOL, err_msg=f"mesh {mesh} against {MESHES[0]}")
