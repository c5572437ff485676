"""The trainer's progress channel: status patches on a real FineTuneJob, Prometheus metrics, the run summary,
and a broken channel that never blocks the caller."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tpuforge.api import CheckpointSave, JobRef, Progress
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND, FINETUNEJOB_PLURAL, GROUP, VERSION
from tpuforge_sandbox.gcs import free_port
from tpuforge_workloads.runtime.progress import METRICS_ADDR_ENV, RunProgress, RunSummary, StatusReporter, TrainMetrics


def _progress(tmp_path: Path, reporter: StatusReporter | None, port: int = 0) -> RunProgress:
    summary = RunSummary.open(str(tmp_path), {"modelName": "gemma4-tiny"}, attempt=1)
    return RunProgress(100, TrainMetrics(port), summary, reporter, start_step=10, last_checkpoint_step=10)


def test_metrics_and_summary_follow_the_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_ADDR_ENV, "127.0.0.1")
    port = free_port()
    progress = _progress(tmp_path, None, port)
    progress.step_done(11, loss=2.5, tokens=4096, tokens_total=4096)
    progress.checkpoint_saved(11, 0.2)
    progress.checkpoint_committed(11, 1.5, 4096)
    progress.eval_done(11, 2.75)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in (
        "tpuforge_trainer_step 11.0",
        "tpuforge_trainer_total_steps 100.0",
        "tpuforge_trainer_loss 2.5",
        "tpuforge_trainer_eval_loss 2.75",
        "tpuforge_trainer_tokens 4096.0",
        "tpuforge_trainer_last_checkpoint_step 11.0",
        'tpuforge_trainer_checkpoint_seconds_count{phase="commit"} 1.0',
        "tpuforge_trainer_step_seconds_count 1.0",
    ):
        assert line in text, line
    p = progress.progress()
    assert (p.step, p.total_steps, p.loss, p.last_checkpoint_step, p.percent) == (11, 100, 2.5, 11, 11.0)
    assert p.tokens_per_second and p.tokens_per_second > 0 and p.eta_seconds is not None
    assert (p.percent_display, p.loss_display) == ("11%", "2.500") and p.eta_display
    summary = progress.summary.to_json()
    assert summary["attempts"][-1]["losses"] == {"11": 2.5}
    assert summary["attempts"][-1]["checkpoints"] == [{"step": 11, "blocking_s": 0.2, "commit_s": 1.5, "bytes": 4096}]
    assert p.last_checkpoint == CheckpointSave(step=11, seconds=1.5, bytes=4096)


def test_a_run_killed_after_a_checkpoint_keeps_the_checkpointed_steps_loss(tmp_path: Path) -> None:
    """The trainer saves step s before it reports step s's loss (it reports after dispatching s+1): the summary
    on disk must hold that loss once it arrives, so a run killed later and resumed at s+1 loses no step."""
    import json

    progress = _progress(tmp_path, None)
    progress.step_done(11, loss=2.5, tokens=10, tokens_total=10)
    progress.checkpoint_saved(12, 0.1)  # as the trainer orders it: the save, then step 12's loss
    on_disk = json.loads((tmp_path / "run_summary.json").read_text())["attempts"][-1]
    assert on_disk["losses"] == {"11": 2.5} and on_disk["end_step"] == 12
    progress.step_done(12, loss=2.25, tokens=10, tokens_total=20)
    progress.step_done(13, loss=2.0, tokens=10, tokens_total=30)  # then killed: nothing else written
    on_disk = json.loads((tmp_path / "run_summary.json").read_text())["attempts"][-1]
    assert on_disk["losses"] == {"11": 2.5, "12": 2.25}


class FakeClock:
    """A clock the test moves by hand: steps take exactly as long as the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_tokens_per_second_is_a_rate_over_the_window_not_the_last_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    summary = RunSummary.open(str(tmp_path), {"modelName": "gemma4-tiny"}, attempt=1)
    metrics = TrainMetrics()
    progress = RunProgress(400, metrics, summary, None, start_step=0, last_checkpoint_step=None, clock=clock)
    tokens_total = 0

    def steps(first: int, last: int, seconds: float, tokens: int = 1000) -> None:
        # Asynchronous dispatch: the host sees results in pairs, one after a full two-step wait and the
        # next almost at once (its result was already there), so a step's own wall time is meaningless.
        nonlocal tokens_total
        for step in range(first, last + 1):
            clock.t += 2 * seconds - 0.001 if step % 2 else 0.001
            tokens_total += tokens
            progress.step_done(step, loss=2.0, tokens=tokens, tokens_total=tokens_total)

    clock.t += 45.0  # the first step also compiles
    tokens_total += 1000
    progress.step_done(1, loss=2.0, tokens=1000, tokens_total=tokens_total)
    steps(2, 101, seconds=0.5)  # 2000 tokens/s
    p = progress.progress()
    assert p.tokens_per_second == pytest.approx(2000, rel=0.1)
    assert p.eta_seconds == pytest.approx((400 - 101) * 0.5, rel=0.1)

    clock.t += 120.0  # evaluation: not training time
    progress.restart_step_clock()
    caplog.set_level(logging.INFO, logger="tpuforge_workloads.runtime.progress")
    steps(102, 121, seconds=0.5)
    p = progress.progress()
    assert p.tokens_per_second == pytest.approx(2000, rel=0.1)

    steps(122, 221, seconds=1.0)  # slower: 1000 tokens/s, once the window holds only slow steps
    p = progress.progress()
    assert p.tokens_per_second == pytest.approx(1000, rel=0.1)
    assert p.eta_seconds == pytest.approx((400 - 221) * 1.0, rel=0.1)
    assert p.eta_display is not None and p.eta_display.startswith("2m")  # about 179 s

    # The status, the gauge and the log line carry the same number.
    gauge = metrics.registry.get_sample_value("tpuforge_trainer_tokens_per_second")
    assert gauge == p.tokens_per_second
    assert f"tokens/s {p.tokens_per_second:.1f} " in caplog.records[-1].getMessage()


def test_the_window_spans_at_least_20_steps_and_30_seconds(tmp_path: Path) -> None:
    clock = FakeClock()
    summary = RunSummary.open(str(tmp_path), {}, attempt=1)
    progress = RunProgress(1000, TrainMetrics(), summary, None, start_step=0, last_checkpoint_step=None, clock=clock)
    total = 0

    def step(n: int, seconds: float, tokens: int = 100) -> None:
        nonlocal total
        clock.t += seconds
        total += tokens
        progress.step_done(n, loss=1.0, tokens=tokens, tokens_total=total)

    for n in range(1, 400):  # fast steps, 1000 tokens/s: 30 s hold 300 of them
        step(n, 0.1)
    assert progress.progress().tokens_per_second == pytest.approx(1000, rel=0.01)
    step(400, 0.1, tokens=30_100)  # one step with a burst of tokens moves a 30 s window, not 300x
    assert progress.progress().tokens_per_second == pytest.approx((299 * 100 + 30_100) / 30, rel=0.01)
    for n in range(401, 411):  # slow: the window keeps 20 steps (10 fast, with the burst, and 10 slow), 31 s
        step(n, 3.0)
    assert progress.progress().tokens_per_second == pytest.approx((9 * 100 + 30_100 + 10 * 100) / 31, rel=0.01)


def test_a_port_in_use_leaves_training_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_ADDR_ENV, "127.0.0.1")
    port = free_port()
    TrainMetrics(port)
    assert TrainMetrics(port).port == 0  # logged, not raised


def test_a_failing_channel_never_blocks_and_keeps_retrying(tmp_path: Path) -> None:
    calls: list[float] = []

    def broken() -> Any:
        calls.append(time.monotonic())
        time.sleep(0.2)
        raise ConnectionRefusedError("no API server")

    reporter = StatusReporter(JobRef(namespace="ns", name="job"), interval=0.05, api_factory=broken)
    progress = _progress(tmp_path, reporter)
    started = time.monotonic()
    for step in range(11, 61):
        progress.step_done(step, loss=1.0, tokens=1, tokens_total=step)
    assert time.monotonic() - started < 0.5  # 50 steps never waited for the channel
    time.sleep(0.6)
    reporter.close(timeout=2)
    assert reporter.errors >= 2 and reporter.patches == 0


@pytest.mark.cluster
def test_progress_is_patched_into_the_finetunejob_status(api_client: Any, namespace: str, tmp_path: Path) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    spec = {
        "model": {"name": "gemma4-tiny", "uri": "gs://b/model"},
        "dataset": {"uri": "gs://b/data.jsonl"},
        "training": {"maxSeqLen": 64},
        "checkpoint": {"uri": "gs://b/run/checkpoints"},
        "output": {"uri": "gs://b/run/merged"},
        "serviceAccountName": "default",
    }
    body = {"apiVersion": API_VERSION, "kind": FINETUNEJOB_KIND, "metadata": {"name": "progress"}, "spec": spec}
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, body)
    reporter = StatusReporter(JobRef(namespace=namespace, name="progress"), interval=0.1, api_factory=lambda: api)
    progress = _progress(tmp_path, reporter)
    progress.step_done(11, loss=2.25, tokens=2048, tokens_total=2048)
    progress.checkpoint_committed(10, 1.0, 4096)

    deadline = time.monotonic() + 20
    while True:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, "progress")
        got = Progress.model_validate((obj.get("status") or {}).get("progress") or {})
        if got.step == 11 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    reporter.close()
    assert (got.step, got.total_steps, got.loss, got.last_checkpoint_step) == (11, 100, 2.25, 10)
    assert got.tokens_per_second and got.updated_at
    assert obj["spec"]["model"] == spec["model"]  # the status patch left the spec alone


def test_skipped_records_reach_status_progress(tmp_path: Path) -> None:
    summary = RunSummary.open(str(tmp_path), {"modelName": "gemma4-tiny"}, attempt=1)
    progress = RunProgress(
        100, TrainMetrics(), summary, None, start_step=0, last_checkpoint_step=None, skipped_records=3
    )
    progress.step_done(1, loss=2.5, tokens=64, tokens_total=64)
    wire = progress.progress().to_wire()
    assert wire["skippedRecords"] == 3 and Progress.model_validate(wire).skipped_records == 3
    assert "skippedRecords" not in _progress(tmp_path, None).progress().to_wire()


def test_a_restart_under_the_same_attempt_number_keeps_the_losses_before_it(tmp_path: Path) -> None:
    # The trainer CLI run again on its checkpoints (or a container restarted in place) reuses the attempt
    # number: the record of the run it resumes must stay, with the losses of the steps only that run took.
    first = RunSummary.open(str(tmp_path), {}, attempt=0)
    for step in range(1, 101):
        first.record_loss(step, 1.0 / step)
    first.write()
    second = RunSummary.open(str(tmp_path), {}, attempt=0)
    second.record_loss(101, 0.5)
    second.write()
    third = RunSummary.open(str(tmp_path), {}, attempt=1)
    third.write()
    attempts = json.loads((tmp_path / "run_summary.json").read_text())["attempts"]
    assert [(a["attempt"], a.get("restart")) for a in attempts] == [(0, None), (0, 1), (1, None)]
    assert len(attempts[0]["losses"]) == 100 and attempts[1]["losses"] == {"101": 0.5}


def test_preference_figures_reach_status_metrics_and_the_summary(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    progress = _progress(tmp_path, None)
    text = generate_latest(progress.metrics.registry).decode()
    assert "tpuforge_trainer_preference_accuracy{" not in text  # an SFT run has no preference series
    assert progress.progress().preference is None
    figures = {"loss": 0.4, "accuracy": 0.75, "margin": 1.5, "chosen_reward": 0.5, "rejected_reward": -1.0}
    progress.preference_done(11, figures, "train")
    progress.step_done(11, loss=0.4, tokens=512, tokens_total=512)
    progress.preference_done(12, {**figures, "accuracy": 0.5, "margin": 0.25, "loss": 0.6}, "eval")
    p = progress.progress().preference
    assert p is not None
    assert (p.accuracy, p.reward_margin, p.chosen_reward, p.rejected_reward) == (0.75, 1.5, 0.5, -1.0)
    assert (p.eval_step, p.eval_accuracy, p.eval_reward_margin, p.eval_loss) == (12, 0.5, 0.25, 0.6)
    wire = progress.progress().model_dump(by_alias=True, exclude_none=True)["preference"]
    assert wire["rewardMargin"] == 1.5 and wire["evalAccuracy"] == 0.5
    text = generate_latest(progress.metrics.registry).decode()
    for line in (
        'tpuforge_trainer_preference_accuracy{set="train"} 0.75',
        'tpuforge_trainer_preference_accuracy{set="eval"} 0.5',
        'tpuforge_trainer_reward_margin{set="eval"} 0.25',
        'tpuforge_trainer_reward{answer="rejected",set="train"} -1.0',
    ):
        assert line in text, line
    attempt = progress.summary.to_json()["attempts"][-1]
    assert attempt["train_preference"]["11"]["accuracy"] == 0.75 and attempt["eval_preference"]["12"]["loss"] == 0.6


def test_rl_figures_reach_status_metrics_tensorboard_and_the_summary(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    progress = _progress(tmp_path, None)
    assert progress.progress().rl is None
    figures = {
        "reward": 0.5, "pass_rate": 0.25, "kl": 0.01, "response_tokens": 40.0, "refused": 2, "checker_share": 0.3,
        "checker_seconds": 3.0, "rollout_seconds": 6.0, "step_seconds": 10.0, "loss": 0.1,
        "failures": {"refused": 2, "mismatch": 4},
    }  # fmt: skip
    progress.rl_done(1, figures)
    progress.rl_done(2, {**figures, "refused": 1, "pass_rate": 0.5})
    rl = progress.progress().rl
    assert rl is not None and (rl.reward, rl.pass_rate, rl.kl, rl.refused, rl.refused_total) == (0.5, 0.5, 0.01, 1, 3)
    assert progress.progress().model_dump(by_alias=True, exclude_none=True)["rl"]["passRate"] == 0.5
    text = generate_latest(progress.metrics.registry).decode()
    for line in (
        'tpuforge_trainer_reward{answer="sampled",set="train"} 0.5',
        "tpuforge_trainer_pass_rate 0.5",
        "tpuforge_trainer_checker_refusals_total 3.0",
        "tpuforge_trainer_checker_share 0.3",
    ):
        assert line in text, line
    attempt = progress.summary.to_json()["attempts"][-1]
    assert attempt["train_rl"]["1"]["failures"] == {"refused": 2, "mismatch": 4}
    assert attempt["train_rl"]["2"]["pass_rate"] == 0.5
