"""The trainer CLI end to end on the tiny Gemma 4 model, 4 virtual CPU devices (fsdp=1, tp=4), model,
data and checkpoints on fake GCS: learning, checkpoint layout, resume after a kill, SIGTERM preemption."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.models import RUNS_BUCKET, TrainerProcess, TrainingRun, read_summary
from tpuforge.api import TrainResult
from tpuforge.api.constants import EXIT_PREEMPTED
from tpuforge_sandbox.gcs import free_port
from tpuforge_workloads import storage
from tpuforge_workloads.model import lora
from tpuforge_workloads.runtime import eval_record
from tpuforge_workloads.runtime.progress import METRICS_ADDR_ENV

pytestmark = pytest.mark.slow


def _same_losses(run: dict[int, float], reference: dict[int, float], steps: range) -> None:
    got = np.array([run[s] for s in steps])
    want = np.array([reference[s] for s in steps])
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"steps {list(steps)}")


def test_loss_decreases_on_a_learnable_dataset(tiny_training_run: TrainingRun) -> None:
    run = tiny_training_run
    assert run.exit_code == 0, run.output
    result = TrainResult.model_validate_json(run.termination_message)
    assert result.message.startswith("Trained to step 16 of 16"), result.message
    assert (result.step, result.total_steps, result.stopped_early) == (16, 16, None)
    # Every evaluation after step 0 is in the record beside the checkpoints; the result names the best one.
    record = eval_record.read(run.config.checkpoint.uri)
    assert sorted(record.losses) == list(range(2, 17, 2))
    assert result.best is not None and (result.best.step, result.best.loss) == record.best()
    assert result.last_eval is not None and result.last_eval.step == 16
    losses = run.losses()
    assert sorted(losses) == list(range(1, 17))
    first, last = np.mean([losses[1], losses[2]]), np.mean([losses[15], losses[16]])
    assert last < 0.7 * first, losses
    attempt = run.summary["attempts"][0]
    assert attempt["eval_losses"]["16"] < attempt["eval_losses"]["0"]


def test_checkpoints_keep_the_latest_and_are_readable_without_the_model(tiny_training_run: TrainingRun) -> None:
    import orbax.checkpoint as ocp
    from etils import epath

    uri = tiny_training_run.config.checkpoint.uri
    steps = sorted(int(n.split("/")[0]) for n in storage.list_files(uri) if n.split("/")[0].isdigit())
    assert sorted(set(steps)) == [14, 16]  # every 2 steps, keep 2
    manifest = lora.read_manifest(uri)
    assert manifest is not None
    assert (manifest.model_name, manifest.rank, manifest.alpha) == ("gemma4-tiny", 8, 16.0)
    # What the merge does: restore the raw tree of the adapters, no model needed.
    tree = ocp.PyTreeCheckpointer().restore(epath.Path(storage.join(uri, "16", manifest.params_item)))
    q = tree["layers"]["1"]["attn"]["q_einsum"]
    assert q["w_lora_a"]["value"].shape == (128, 8) and q["w_lora_b"]["value"].shape == (8, 8, 128)
    assert np.abs(q["w_lora_b"]["value"]).max() > 0  # B starts at zero: training moved it
    assert set(tree["layers"]["0"]["attn"]) == {"q_einsum", "kv_einsum", "attn_vec_einsum"}
    assert set(tree["layers"]["1"]["attn"]) == {"q_einsum", "k_einsum", "attn_vec_einsum"}
    data_state = json.loads(storage.read_text(storage.join(uri, "16", "data_iterator", "process_0-of-1.json")))
    assert data_state  # the Grain iterator's position (one file per process)
    # Each durable save's duration and size, as the status's lastCheckpoint reports them: the step's files.
    last = tiny_training_run.summary["attempts"][-1]["checkpoints"][-1]
    assert last["step"] == 16 and last["commit_s"] > 0
    step_bytes = storage.dir_bytes(storage.join(uri, "16"))
    assert 0.9 * step_bytes <= last["bytes"] <= step_bytes


def test_progress_channel_failure_does_not_stop_training(tiny_training_run: TrainingRun) -> None:
    # The reference run reported to an API server that refuses connections, and still finished.
    assert tiny_training_run.exit_code == 0
    assert "progress patch to default/reference failed" in tiny_training_run.output


def test_resume_after_a_kill_continues_at_the_checkpoint_with_the_same_losses(
    tiny_training_run: TrainingRun, tmp_path: Path
) -> None:
    reference = tiny_training_run
    config = reference.config.model_copy(deep=True)
    config.job = None
    config.checkpoint.uri = f"gs://{RUNS_BUCKET}/killed/checkpoints"
    first = TrainerProcess(config, tmp_path / "first").start()
    first.wait_for_line("step 5/16")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)  # no warning, no last checkpoint
    first.wait()
    from tpuforge_workloads.train.checkpoints import latest_step

    resumed_at = latest_step(config.checkpoint.uri)
    assert resumed_at is not None and 2 <= resumed_at < 16

    second = TrainerProcess(config, tmp_path / "second")
    assert second.run() == 0, second.output()
    attempts = read_summary(config.checkpoint.uri)["attempts"]
    assert attempts[-1]["start_step"] == resumed_at
    resumed = {int(k): v for k, v in attempts[-1]["losses"].items()}
    assert min(resumed) == resumed_at + 1
    _same_losses(resumed, reference.losses(), range(resumed_at + 1, 17))


def test_sigterm_checkpoints_the_current_step_and_resume_loses_nothing(
    tiny_training_run: TrainingRun, tmp_path: Path
) -> None:
    reference = tiny_training_run
    config = reference.config.model_copy(deep=True)
    config.job = None
    config.checkpoint.uri = f"gs://{RUNS_BUCKET}/preempted/checkpoints"
    config.metrics_port = free_port()
    first = TrainerProcess(config, tmp_path / "first", env={METRICS_ADDR_ENV: "127.0.0.1"}).start()
    first.wait_for_line("step 3/16")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{config.metrics_port}/metrics", timeout=5).read().decode()
    assert "tpuforge_trainer_total_steps 16.0" in metrics
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait() == EXIT_PREEMPTED, first.output()
    message = first.termination_message()
    assert message.startswith("Preempted at step "), message
    step = int(message.removeprefix("Preempted at step ").split(";")[0])
    assert 3 <= step < 16
    from tpuforge_workloads.train.checkpoints import latest_step

    assert latest_step(config.checkpoint.uri) == step  # a checkpoint at the step it stopped at
    stopped = read_summary(config.checkpoint.uri)["attempts"][-1]
    assert max(int(k) for k in stopped["losses"]) == step and stopped["exit_code"] == EXIT_PREEMPTED

    config.metrics_port = 0
    second = TrainerProcess(config, tmp_path / "second")
    assert second.run() == 0, second.output()
    resumed = read_summary(config.checkpoint.uri)["attempts"][-1]
    assert resumed["start_step"] == step  # zero steps lost
    _same_losses({int(k): v for k, v in resumed["losses"].items()}, reference.losses(), range(step + 1, 17))
