"""`tpuforge sandbox tensorboard JOB`, as the demo prints it: the FineTuneJob's event files, copied out of the
sandbox's GCS and served by TensorBoard on loopback, read back through TensorBoard's own HTTP API. The loss
curve of a real tiny training run comes back step for step, and scores the job writes while TensorBoard runs
come in with the next copy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, eventually, until
from tests.fixtures.models import RUNS_BUCKET, TrainingRun
from tpuforge.api.constants import TENSORBOARD_SUBDIR
from tpuforge_sandbox import Sandbox, gcs_objects
from tpuforge_sandbox.procs import free_port
from tpuforge_workloads.runtime.tensorboard import EventLog

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

START = 90.0  # TensorBoard's start (its imports) on a busy 2-core machine


def get(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def tags(port: int) -> dict[str, Any] | None:
    """The scalars plugin's runs and tags, or None while TensorBoard does not answer yet."""
    try:
        found: dict[str, Any] = get(port, "/data/plugin/scalars/tags")
    except (urllib.error.URLError, ConnectionError):
        return None
    return found or None


def curve(port: int, run: str, tag: str) -> dict[int, float]:
    return {step: value for _wall, step, value in get(port, "/data/plugin/scalars/scalars", run=run, tag=tag)}


def test_the_printed_command_serves_the_jobs_loss_curve_and_what_it_adds(
    sandbox: Sandbox,
    sandbox_env: dict[str, str],
    api_client: client.ApiClient,
    namespace: str,
    tiny_training_run: TrainingRun,
) -> None:
    run = tiny_training_run
    assert run.exit_code == 0, run.output
    # The job's checkpoint folder holds the reference run's event files, as its trainer would have left them.
    source = f"{run.config.checkpoint.uri}/{TENSORBOARD_SUBDIR}"
    checkpoints = f"gs://{RUNS_BUCKET}/tensorboard-cli/{namespace}/checkpoints"
    events = f"{checkpoints}/{TENSORBOARD_SUBDIR}"
    bucket, prefix = gcs_objects.split_uri(source)
    copied = gcs_objects.list_objects(sandbox.gcs_url, source)
    assert copied, f"the reference run wrote no event files in {source}"
    for obj in copied:
        data = gcs_objects.read(sandbox.gcs_url, f"gs://{bucket}/{obj.name}")
        gcs_objects.upload(sandbox.gcs_url, events + obj.name[len(prefix) :], data)
    Cluster(api_client, namespace).create("tuned", checkpoint={"uri": checkpoints})

    port = free_port()
    command = ["sandbox", "tensorboard", "tuned", "-n", namespace, "--port", str(port), "--every", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuforge.cli", *command],
        env={**os.environ, **sandbox_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        runs = until(lambda: tags(port), f"TensorBoard on port {port}", timeout=START)
        assert "train/loss" in runs["train"], runs
        assert curve(port, "train", "train/loss") == pytest.approx(run.losses())

        log = EventLog(f"{events}/eval", sync_interval=3600)
        log.scalar("eval/exactMatch", 0.75, 16)
        log.close()

        def scores_in() -> None:
            assert "eval/exactMatch" in (tags(port) or {}).get("eval", {})

        eventually(scores_in, "the evaluation's run to come in with a copy", timeout=60)
        assert curve(port, "eval", "eval/exactMatch") == {16: 0.75}
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it: TensorBoard stops with it
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert f"http://127.0.0.1:{port}/" in output and "stopping TensorBoard" in output, output
    with pytest.raises(urllib.error.URLError):
        get(port, "/data/plugin/scalars/tags")
    logdir = sandbox.dir / "tensorboard" / namespace / "tuned"
    assert {p.parent.name for p in logdir.rglob("*tfevents*")} == {"train", "eval"}
