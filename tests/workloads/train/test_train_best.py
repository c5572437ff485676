"""The best checkpoint and early stopping: the eval record's rules, the checkpoint manager keeping the best step
past `keep`, the merge taking the best finished step, and a trainer run (the tiny model, fake GCS) that stops
early, exits 0 and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.merge_inputs import Inputs, config, make_inputs
from tests.fixtures.models import RUNS_BUCKET, TrainerProcess, tiny_train_config
from tpuforge.api import EarlyStoppingSpec, TrainResult
from tpuforge.api.configs import MergeConfig
from tpuforge_workloads import storage
from tpuforge_workloads.merge import synthetic
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.lora_checkpoint import checkpoint_steps
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.merge.plan import make_plan
from tpuforge_workloads.model.adapters import read_adapter_manifest
from tpuforge_workloads.runtime import eval_record
from tpuforge_workloads.train.eval_tracking import EvalTracking


def test_the_best_is_the_lowest_loss_the_earlier_step_on_a_tie() -> None:
    r = eval_record.EvalRecord({100: 1.0, 200: 0.8, 300: 0.8, 400: 0.9})
    assert r.best() == (200, 0.8)
    assert r.best(among=[100, 300, 400, 500]) == (300, 0.8)  # only finished steps count
    assert r.best(among=[500]) is None and eval_record.EvalRecord().best() is None
    r.drop_after(250)
    assert r.losses == {100: 1.0, 200: 0.8}
    assert eval_record.EvalRecord.from_json(r.to_json()) == r


def test_evals_without_improvement_count_from_the_last_one_that_beat_the_best_by_min_delta() -> None:
    r = eval_record.EvalRecord({1: 2.0, 2: 1.5, 3: 1.49, 4: 1.6, 5: 1.45})
    assert r.evals_without_improvement(0.0) == 0  # step 5 is the best yet
    assert r.evals_without_improvement(0.1) == 3  # 3, 4 and 5 are each within 0.1 of 1.5
    assert eval_record.EvalRecord().evals_without_improvement(0.0) == 0


def test_tracking_stops_after_patience_evals_skips_step_zero_and_writes_the_record(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    t = EvalTracking(uri, EarlyStoppingSpec(patience=2, min_delta=0.05), write=True)
    t.evaluated(0, 9.0)  # the base model: no checkpoint to select
    for step, loss in ((10, 1.0), (20, 0.9), (30, 0.88), (40, 0.91)):
        assert not t.should_stop()
        t.evaluated(step, loss)
    assert t.should_stop() and t.stopped_early is not None
    assert (t.stopped_early.step, t.stopped_early.evals) == (40, 2)
    assert t.protected_steps() == [30] and t.best() is not None and t.best().loss == 0.88
    assert eval_record.read(uri).losses == {10: 1.0, 20: 0.9, 30: 0.88, 40: 0.91}
    # A resumed attempt (from step 20) forgets what came after and decides again as it re-evaluates.
    again = EvalTracking(uri, EarlyStoppingSpec(patience=2, min_delta=0.05), write=False)
    again.resumed_at(20)
    assert again.record.losses == {10: 1.0, 20: 0.9} and not again.should_stop()


def test_the_checkpoint_manager_keeps_the_best_step_beyond_keep(tmp_path: Path, jax_devices: Any) -> None:
    import jax.numpy as jnp
    from flax import nnx

    from tpuforge_workloads.train.checkpoints import TrainCheckpoints

    class Adapter(nnx.Module):
        def __init__(self) -> None:
            self.a = nnx.LoRAParam(jnp.zeros((2, 2)))

    uri = str(tmp_path / "ckpt")
    record = eval_record.EvalRecord()
    losses = {2: 1.0, 4: 0.5, 6: 0.7, 8: 0.9}

    def best_step() -> list[int]:
        best = record.best()
        return [best[0]] if best else []

    ckpts = TrainCheckpoints(uri, every_steps=2, keep=1, data_iterator=None, protect=best_step)
    model = Adapter()
    for step, loss in losses.items():
        model.a[...] = jnp.full((2, 2), float(step))
        assert ckpts.save(step, model)
        ckpts._manager.wait_until_finished()  # this test's order: each save committed before its eval
        record.add(step, loss)  # the trainer evaluates after saving
    ckpts.save(8, model, force=True)  # the final save of an already saved step changes nothing
    ckpts.close()
    assert checkpoint_steps(uri) == [4, 8]  # keep=1 alone would leave [8]
    restored = Adapter()
    step, _ = TrainCheckpoints(uri, 2, 1, None).maybe_restore(restored, step=4)
    assert step == 4 and float(restored.a[...][0, 0]) == 4.0


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """A synthetic LoRA checkpoint with steps 10, 20 and 30 (same factors), and an eval record whose best
    finished step is 20 (step 40 was evaluated, but its save never finished)."""
    inputs = make_inputs(str(tmp_path_factory.mktemp("best")))
    for step in (20, 30):
        synthetic.write_lora_checkpoint(inputs.ckpt, inputs.tree, step)
    eval_record.write(inputs.ckpt, eval_record.EvalRecord({10: 1.0, 20: 0.6, 30: 0.7, 40: 0.1}))
    return inputs


def test_the_merge_takes_the_best_finished_step_with_select_best(three_steps: Inputs, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    assert make_plan(config(three_steps, out, select="best")).lora.step == 20
    assert make_plan(config(three_steps, out)).lora.step == 30  # select last: the latest
    assert make_plan(config(three_steps, out, select="best", step=10)).lora.step == 10  # the operator's choice wins


def test_select_best_without_an_eval_record_names_the_missing_eval_set(tmp_path: Path) -> None:
    inputs = make_inputs(str(tmp_path / "none"))
    with pytest.raises(MergeInputError, match=r"eval_losses.json.*spec.dataset.evalUri"):
        make_plan(config(inputs, str(tmp_path / "out"), select="best"))


@pytest.mark.slow
def test_a_run_that_stops_early_keeps_its_best_step_exits_0_and_the_merge_exports_that_step(
    gcs: Any, tiny_model_gs: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    from tpuforge_sandbox.gcs import create_bucket

    create_bucket(gcs.url, RUNS_BUCKET)
    ckpt = f"gs://{RUNS_BUCKET}/early/checkpoints"
    # No evaluation beats another by 100: the second one (step 4) stops the run, with patience 1.
    c = tiny_train_config(tiny_model_gs, chat_dataset_gs, ckpt)
    c.eval_uri = chat_dataset_gs.replace("demo-chat", "demo-eval")
    c.training.early_stopping = EarlyStoppingSpec(patience=1, min_delta=100.0)
    c.checkpoint.keep = 1
    c.checkpoint.select = "best"
    trainer = TrainerProcess(c, tmp_path / "run")
    assert trainer.run() == 0, trainer.output()

    result = TrainResult.model_validate_json(trainer.termination_message())
    assert result.stopped_early is not None and result.stopped_early.step == 4 and result.step == 4
    assert result.message.startswith("Stopped early at step 4 of 16: eval loss did not improve by more than 100")
    record = eval_record.read(ckpt)
    assert sorted(record.losses) == [2, 4]
    assert result.best is not None and (result.best.step, result.best.loss) == record.best()
    assert checkpoint_steps(ckpt) == sorted({result.best.step, 4})  # the best and the latest, keep=1
    summary = json.loads(storage.read_text(storage.join(ckpt, "run_summary.json")))
    assert summary["attempts"][-1]["stopped_early"]["step"] == 4

    out = f"gs://{RUNS_BUCKET}/early/output"
    run_merge(
        MergeConfig(
            model_name=c.model_name,
            base_model_uri=c.model_uri,
            checkpoint_uri=ckpt,
            output_uri=out,
            lora=c.lora,
            write_merged=False,
            select="best",
        )
    )
    _, info = read_adapter_manifest(storage.join(out, "adapter"))
    assert info.step == result.best.step
