"""TensorBoard event files, read back with TensorBoard's own reader: the event log's scalars and text at their
steps (on fake GCS, as a run writes them), a resumed attempt's file beside the first one with TensorBoard
showing the resumed values, the reference training run's curves and samples, and the evaluation's scores."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.fixtures.models import RUNS_BUCKET, TrainingRun, eval_config, tiny_train_config
from tpuforge.api.constants import TENSORBOARD_SUBDIR, TENSORBOARD_TRAIN_RUN
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate import score
from tpuforge_workloads.runtime import tensorboard as tensorboard_log
from tpuforge_workloads.runtime.progress import RunProgress, RunSummary, TrainMetrics, sample_markdown


def read_run(uri: str, local: Path) -> EventAccumulator:
    """Every event file of the run directory `uri`, as TensorBoard loads a run."""
    storage.download_dir(uri, local)
    acc = EventAccumulator(str(local), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars(tag)}


def texts(acc: EventAccumulator, tag: str) -> dict[int, str]:
    """A text summary by step (tensorboardX files text under `<tag>/text_summary`)."""
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")}


def test_scalars_and_text_at_their_steps_and_a_resumed_attempt_beside_the_first(gcs: Any, tmp_path: Path) -> None:
    from tpuforge_sandbox.gcs import create_bucket

    create_bucket(gcs.url, RUNS_BUCKET)
    uri = f"gs://{RUNS_BUCKET}/tensorboard-unit/tensorboard/train"
    first = tensorboard_log.EventLog(uri, sync_interval=3600)
    for step in range(1, 7):
        first.scalar("train/loss", 10.0 - step, step)
    first.text("samples/0", "**answer**\n\n    Lima", 4)
    first.sync()  # copied by the background thread while the run goes on
    first.close()
    assert first.errors == 0 and first.syncs >= 1
    acc = read_run(uri, tmp_path / "one")
    assert scalars(acc, "train/loss") == {s: 10.0 - s for s in range(1, 7)}
    assert texts(acc, "samples/0") == {4: "**answer**\n\n    Lima"}

    # Preempted after step 6, resumed from the checkpoint at step 4: a second file, steps 5.. again.
    second = tensorboard_log.EventLog(uri, purge_step=5, sync_interval=3600)
    for step in range(5, 9):
        second.scalar("train/loss", 100.0 + step, step)
    second.close()
    assert len(list(storage.list_files(uri))) == 2
    resumed = {1: 9.0, 2: 8.0, 3: 7.0, 4: 6.0, 5: 105.0, 6: 106.0, 7: 107.0, 8: 108.0}
    assert scalars(read_run(uri, tmp_path / "two"), "train/loss") == resumed
    # TensorBoard itself reads gs:// (without TensorFlow, through fsspec's GCS backend, on the emulator here).
    direct = EventAccumulator(uri)
    direct.Reload()
    assert scalars(direct, "train/loss") == resumed


def test_run_progress_writes_what_the_trainer_reports(tmp_path: Path) -> None:
    uri = str(tmp_path / "tensorboard" / "train")
    events = tensorboard_log.EventLog(uri, sync_interval=3600)
    summary = RunSummary.open(str(tmp_path), {"modelName": "gemma4-tiny"}, attempt=1)
    progress = RunProgress(
        10, TrainMetrics(), summary, None, start_step=0, last_checkpoint_step=None, events=events, max_grad_norm=0.4
    )
    progress.grad_norm(1, 0.5)  # over the clip's norm: a clipped step
    progress.step_done(1, loss=3.0, tokens=100, tokens_total=100, learning_rate=1e-4)
    progress.grad_norm(2, 0.25)
    progress.step_done(2, loss=2.0, tokens=100, tokens_total=200, learning_rate=2e-4)
    progress.eval_done(2, 2.5)
    sample = {"prompt": "Capital of Peru?", "answer": "Lima", "reference": "Lima"}
    progress.samples_done(2, [sample])
    events.close()
    acc = read_run(uri, tmp_path / "read")
    assert scalars(acc, "train/loss") == {1: 3.0, 2: 2.0}
    assert scalars(acc, "train/grad_norm") == {1: 0.5, 2: 0.25}
    assert scalars(acc, "train/clipped_steps") == {1: 1.0} and summary.attempt["clipped_steps"] == 1
    assert scalars(acc, "train/learning_rate") == pytest.approx({1: 1e-4, 2: 2e-4})
    assert set(scalars(acc, "train/tokens_per_second")) <= {1, 2} and scalars(acc, "train/tokens_per_second")
    assert scalars(acc, "eval/loss") == {2: 2.5}
    assert texts(acc, "samples/0") == {2: sample_markdown(sample)}
    assert summary.attempt["samples"] == {"2": [sample]}


def test_the_reference_run_logs_its_curves_and_samples(tiny_training_run: TrainingRun, tmp_path: Path) -> None:
    run = tiny_training_run
    assert run.exit_code == 0, run.output
    c = run.config
    uri = storage.join(c.checkpoint.uri, TENSORBOARD_SUBDIR, TENSORBOARD_TRAIN_RUN)
    attempt = run.summary["attempts"][-1]
    assert attempt["tensorboard"] == uri
    acc = read_run(uri, tmp_path)
    steps = list(range(1, c.training.max_steps + 1))  # type: ignore[operator]
    # Tunix evaluates before the first step too: step 0 is the base model's loss and answers.
    evals = list(range(0, c.training.max_steps + 1, c.checkpoint.every_steps))  # type: ignore[operator]
    assert scalars(acc, "train/loss") == pytest.approx({int(k): v for k, v in attempt["losses"].items()})
    assert sorted(scalars(acc, "train/loss")) == steps
    assert sorted(scalars(acc, "train/grad_norm")) == steps
    assert all(v > 0 for v in scalars(acc, "train/grad_norm").values())
    rates = scalars(acc, "train/learning_rate")
    # Warmup from 0 over warmupSteps, the peak, then cosine decay towards 0.
    assert rates[1] == 0.0 and rates[c.training.warmup_steps + 1] == pytest.approx(c.training.learning_rate)
    assert rates[steps[-1]] < rates[c.training.warmup_steps + 1]
    assert set(scalars(acc, "train/tokens_per_second")) >= set(steps[1:])
    assert scalars(acc, "eval/loss") == pytest.approx({int(k): v for k, v in attempt["eval_losses"].items()})
    assert sorted(scalars(acc, "eval/loss")) == evals
    # training.evalSamples (default 2) answers per evaluation, as text and in the summary.
    n = c.training.eval_samples
    assert n == 2 and sorted(attempt["samples"]) == sorted(str(s) for s in evals)
    for step in evals:
        samples = attempt["samples"][str(step)]
        assert len(samples) == n and all(s["prompt"] and s["reference"] for s in samples)
        for i, sample in enumerate(samples):
            assert texts(acc, f"samples/{i}")[step] == sample_markdown(sample)


def test_the_evaluation_scores_go_beside_the_training_run(gcs: Any, tmp_path: Path) -> None:
    from tpuforge_sandbox.gcs import create_bucket

    create_bucket(gcs.url, RUNS_BUCKET)
    c = tiny_train_config("gs://models/m", "gs://data/d.jsonl", f"gs://{RUNS_BUCKET}/scores/checkpoints")
    cfg = eval_config(c, f"gs://{RUNS_BUCKET}/reference/output/adapter", c.dataset_uri, tmp_path)
    result = {"metrics": {"loss": 1.5, "exactMatch": 0.75}, "baseMetrics": {"loss": 3.0, "exactMatch": 0.0}}
    score.write_tensorboard(cfg, {**result, "examples": 4}, 16)
    uri = score.tensorboard_uri(cfg)
    assert uri == storage.join(c.checkpoint.uri, TENSORBOARD_SUBDIR, "eval")
    acc = read_run(uri, tmp_path / "eval")
    assert scalars(acc, "eval/loss") == {16: 1.5} and scalars(acc, "eval/exactMatch") == {16: 0.75}
    assert scalars(acc, "eval_base/loss") == {16: 3.0} and scalars(acc, "eval_base/exactMatch") == {16: 0.0}
    assert "4 records" in texts(acc, "eval/report")[16]


def test_a_jax_program_started_without_torch_loads_none_and_still_logs(tmp_path: Path) -> None:
    """The trainer's, the preflight's and the evaluation loss's entry points mark torch absent before Tunix loads
    tensorboardX: in the project's venv (which has torch) that keeps it out, and the event file is written all
    the same."""
    program = textwrap.dedent(
        f"""
        import sys
        from tpuforge_workloads.runtime import tensorboard
        tensorboard.without_torch()
        import tunix.sft
        assert sys.modules["torch"] is None, "torch was loaded"
        log = tensorboard.EventLog({str(tmp_path / "run")!r}, sync_interval=3600)
        log.scalar("train/loss", 1.5, 1)
        log.close()
        assert log.errors == 0
        """
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert scalars(read_run(str(tmp_path / "run"), tmp_path / "read"), "train/loss") == {1: 1.5}
