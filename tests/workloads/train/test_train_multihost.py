"""The trainer on an emulated two-host slice: two CLI processes joined by jax.distributed, 4 virtual CPU devices
each, train the tiny Gemma 4 on an fsdp=2 x tp=4 mesh spanning both (model, data and checkpoints on fake
GCS), against one process with all 8 devices: same losses, one checkpoint, SIGTERM on one host stops both
at the same step, and a two-process resume continues at the same data position."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.models import (
    RUNS_BUCKET,
    TrainerProcess,
    TrainingRun,
    devices_env,
    read_summary,
    slice_trainers,
    tiny_train_config,
)
from tpuforge.api import MeshSpec, TrainConfig, TrainResult
from tpuforge.api.constants import EXIT_PREEMPTED
from tpuforge_sandbox.gcs import create_bucket, free_port
from tpuforge_workloads import storage
from tpuforge_workloads.runtime.progress import METRICS_ADDR_ENV
from tpuforge_workloads.train.hosts import ENV_METRICS_PORT

pytestmark = pytest.mark.slow

STEPS = 10
# Cross-process (gloo) and in-process reductions may add in another order.
RTOL = 1e-4


def _config(model_uri: str, dataset_uri: str, name: str) -> TrainConfig:
    config = tiny_train_config(
        model_uri, dataset_uri, f"gs://{RUNS_BUCKET}/multihost-{name}/checkpoints", max_steps=STEPS
    )
    config.mesh = MeshSpec(fsdp=2, tp=4)
    config.eval_uri = dataset_uri.replace("demo-chat", "demo-eval")
    return config


def _losses(summary_attempt: dict[str, object], key: str = "losses") -> dict[int, float]:
    values = summary_attempt.get(key) or {}
    assert isinstance(values, dict)
    return {int(k): float(v) for k, v in values.items()}


def _same(got: dict[int, float], want: dict[int, float], steps: range) -> None:
    np.testing.assert_allclose(
        [got[s] for s in steps], [want[s] for s in steps], rtol=RTOL, err_msg=f"steps {list(steps)}"
    )


def _outputs(trainers: list[TrainerProcess]) -> str:
    return "\n".join(f"--- host {i}\n{t.output()}" for i, t in enumerate(trainers))


def _codes(trainers: list[TrainerProcess], timeout: float) -> list[int | None]:
    """Exit codes; None for a process still running after `timeout` (then killed)."""
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for t in trainers:
        try:
            codes.append(t.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def _run(trainers: list[TrainerProcess]) -> list[int]:
    for t in trainers:
        t.start()
    return [t.wait() for t in trainers]


@pytest.fixture(scope="module")
def one_process_run(
    gcs: object, tiny_model_gs: str, chat_dataset_gs: str, tmp_path_factory: pytest.TempPathFactory
) -> TrainingRun:
    """The reference: the same config and seed in one process that has all 8 devices."""
    create_bucket(gcs.url, RUNS_BUCKET)  # type: ignore[attr-defined]
    config = _config(tiny_model_gs, chat_dataset_gs, "one-process")
    trainer = TrainerProcess(config, tmp_path_factory.mktemp("one-process"), env=devices_env(8))
    code = trainer.run()
    assert code == 0, trainer.output()
    summary = read_summary(config.checkpoint.uri)
    return TrainingRun(config, code, trainer.termination_message(), summary, trainer.output(last=None))


def test_two_hosts_train_like_one_process_with_all_their_devices(one_process_run: TrainingRun, tmp_path: Path) -> None:
    reference = one_process_run.summary["attempts"][0]
    config = _config(one_process_run.config.model_uri, one_process_run.config.dataset_uri, "two-hosts")
    trainers = slice_trainers(config, tmp_path, hosts=2)
    assert _run(trainers) == [0, 0], _outputs(trainers)
    for t in trainers:
        said = TrainResult.model_validate_json(t.termination_message()).message
        assert said.startswith(f"Trained to step {STEPS} of {STEPS}"), said
    assert "process 1 of 2, rows 2..3 of each batch" in trainers[1].output(last=None)

    (attempt,) = read_summary(config.checkpoint.uri)["attempts"]  # written by process 0 alone
    assert attempt["processes"] == 2 and len(attempt["devices"]) == 8
    _same(_losses(attempt), _losses(reference), range(1, STEPS + 1))
    _same(_losses(attempt, "eval_losses"), _losses(reference, "eval_losses"), range(0, STEPS + 1, 2))
    # Every host ran the sample decode over the mesh spanning both; process 0 reported the answers.
    assert sorted(attempt["samples"], key=int) == [str(s) for s in range(0, STEPS + 1, 2)], _outputs(trainers)
    assert all(len(samples) == 2 for samples in attempt["samples"].values())
    # One checkpoint per step, holding each process's data position.
    names = storage.list_files(storage.join(config.checkpoint.uri, str(STEPS), "data_iterator"))
    assert {"process_0-of-2.json", "process_1-of-2.json"} <= set(names), names
    assert attempt["timings"]["steps_timed"] == STEPS
    # Each host read only its rows of each tensor: half of the checkpoint (plus the two 4-byte layer scalars,
    # which every host reads whole), not all of it.
    total = attempt["timings"]["model_bytes"]
    assert 0.5 * total <= attempt["timings"]["model_bytes_read"] < 0.51 * total
    assert reference["timings"]["model_bytes_read"] == total
    for t in trainers:
        (line,) = [x for x in t.output(last=None).splitlines() if "bytes of decoder tensors" in x]
        assert "(50%)" in line, line


def test_sigterm_on_one_host_while_loading_stops_every_host(
    gcs: object, tiny_model_gs: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    """Before the first agreement the signalled host stops at once and the other stops too, instead of waiting
    for it at that agreement; neither is aborted by JAX's coordination client as the other leaves."""
    create_bucket(gcs.url, RUNS_BUCKET)  # type: ignore[attr-defined]
    config = _config(tiny_model_gs, chat_dataset_gs, "loading")
    hosts = slice_trainers(config, tmp_path, hosts=2)
    for t in hosts:
        t.start()
    hosts[1].wait_for_line("joined the slice")
    assert hosts[1].proc is not None
    hosts[1].proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert _codes(hosts, timeout=120) == [EXIT_PREEMPTED, EXIT_PREEMPTED], _outputs(hosts)
    assert time.monotonic() - started < 60, _outputs(hosts)
    assert all("before training started" in t.termination_message() for t in hosts), _outputs(hosts)
    (attempt,) = read_summary(config.checkpoint.uri)["attempts"]
    assert attempt["exit_code"] == EXIT_PREEMPTED and "before training started" in attempt["message"]


def test_a_host_that_never_starts_is_named_when_the_join_times_out(
    gcs: object, tiny_model_gs: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    create_bucket(gcs.url, RUNS_BUCKET)  # type: ignore[attr-defined]
    config = _config(tiny_model_gs, chat_dataset_gs, "never-joined")
    (first, _) = slice_trainers(config, tmp_path, hosts=2, env={"TPUFORGE_JOIN_TIMEOUT_SECONDS": "3"})
    assert first.run(timeout=120) == 1, first.output()  # not aborted by JAX's own join timeout (134)
    message = first.termination_message()
    assert message.startswith("Training failed: process 1 of 2 did not join the slice within 3 s"), message


def test_sigterm_on_one_host_checkpoints_one_step_on_both_and_a_resume_loses_nothing(
    one_process_run: TrainingRun, tmp_path: Path
) -> None:
    reference = one_process_run.summary["attempts"][0]
    config = _config(one_process_run.config.model_uri, one_process_run.config.dataset_uri, "preempted")
    ports = [free_port(), free_port()]
    first = slice_trainers(config, tmp_path / "first", hosts=2, env={METRICS_ADDR_ENV: "127.0.0.1"})
    for t, port in zip(first, ports, strict=True):
        t.env[ENV_METRICS_PORT] = str(port)  # two hosts on one machine: a port each
        t.start()
    first[1].wait_for_line("step 3/")
    scraped = [urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode() for p in ports]
    assert f"tpuforge_trainer_total_steps {STEPS}.0" in scraped[0]  # the job's series: process 0 only
    assert "tpuforge_trainer_total_steps" not in scraped[1] and "tpuforge_trainer_step_seconds_count" in scraped[1]

    assert first[1].proc is not None
    first[1].proc.send_signal(signal.SIGTERM)  # one host's notice
    assert [t.wait() for t in first] == [EXIT_PREEMPTED, EXIT_PREEMPTED], _outputs(first)
    messages = [t.termination_message() for t in first]
    assert messages[0] == messages[1] and messages[0].startswith("Preempted at step "), messages
    step = int(messages[0].removeprefix("Preempted at step ").split(";")[0])
    assert 3 <= step < STEPS
    from tpuforge_workloads.train.checkpoints import latest_step

    assert latest_step(config.checkpoint.uri) == step

    config.metrics_port = 0
    second = slice_trainers(config, tmp_path / "second", hosts=2)
    assert _run(second) == [0, 0], _outputs(second)
    resumed = read_summary(config.checkpoint.uri)["attempts"][-1]
    assert resumed["start_step"] == step  # zero steps lost
    _same(_losses(resumed), _losses(reference), range(step + 1, STEPS + 1))
