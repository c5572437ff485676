"""How a training run reports itself: FineTuneJob status.progress patches, Prometheus metrics, and a run
summary JSON beside the checkpoints.

None of these may stop or slow training. Status patches go out from a background thread at most every
`interval` seconds (the latest values win; nothing queues up), and any error is logged and retried at the
next interval. The metrics server failing to bind is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from tpuforge.api import JobRef, Progress, now_rfc3339
from tpuforge.api.constants import FINETUNEJOB_PLURAL, GROUP, VERSION
from tpuforge_workloads import storage

log = logging.getLogger(__name__)

SUMMARY_FILE = "run_summary.json"
# The metrics server binds here; the sandbox, which runs pods as local processes, sets 127.0.0.1.
METRICS_ADDR_ENV = "TPUFORGE_METRICS_ADDR"


class TrainMetrics:
    """The trainer's Prometheus metrics, in a registry of their own, served on `port` (0: not served)."""

    def __init__(self, port: int = 0):
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("tpuforge_trainer_step", "Optimizer steps completed.", registry=r)
        self.total_steps = Gauge("tpuforge_trainer_total_steps", "Optimizer steps the run will take.", registry=r)
        self.loss = Gauge("tpuforge_trainer_loss", "Training loss of the last step.", registry=r)
        self.eval_loss = Gauge(
            "tpuforge_trainer_eval_loss", "Mean loss over the eval set, last evaluation.", registry=r
        )
        self.tokens_per_second = Gauge(
            "tpuforge_trainer_tokens_per_second", "Real (non-padding) tokens trained per second, last step.", registry=r
        )
        self.tokens = Gauge("tpuforge_trainer_tokens", "Real tokens trained on so far.", registry=r)
        self.step_seconds = Histogram(
            "tpuforge_trainer_step_seconds",
            "Wall time of one optimizer step.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80),
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            "tpuforge_trainer_checkpoint_seconds",
            "Checkpoint duration: 'blocking' is the pause in training, 'commit' until it is durable.",
            ["phase"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.last_checkpoint_step = Gauge(
            "tpuforge_trainer_last_checkpoint_step", "Step of the last committed checkpoint.", registry=r
        )
        self.port = 0
        if port:
            addr = os.environ.get(METRICS_ADDR_ENV, "0.0.0.0")
            try:
                start_http_server(port, addr=addr, registry=r)
                self.port = port
            except OSError as e:
                log.warning("metrics server not started on %s:%d: %s; training continues", addr, port, e)


def kube_custom_objects() -> Any:
    """A CustomObjectsApi with in-cluster credentials, else $KUBECONFIG (the sandbox)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return client.CustomObjectsApi()


class StatusReporter:
    """Patches `status.progress` of the job's FineTuneJob (JSON merge patch on the status subresource) from
    a background thread, at most every `interval` seconds and only when something changed."""

    def __init__(self, job: JobRef, interval: float, api_factory: Callable[[], Any] = kube_custom_objects):
        self.job = job
        self.interval = interval
        self._api_factory = api_factory
        self._api: Any = None
        self._lock = threading.Lock()
        self._latest: Progress | None = None
        self._sent: Progress | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.patches = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="status-reporter", daemon=True)
        self._thread.start()

    def update(self, progress: Progress) -> None:
        """Record the latest progress; never blocks."""
        with self._lock:
            self._latest = progress

    def _run(self) -> None:
        while not self._stop.is_set():
            self._send()
            self._wake.wait(self.interval)
            self._wake.clear()

    def _send(self) -> None:
        with self._lock:
            progress = self._latest
        if progress is None or (self._sent is not None and _same(progress, self._sent)):
            return
        try:
            if self._api is None:
                self._api = self._api_factory()
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.job.namespace,
                FINETUNEJOB_PLURAL,
                self.job.name,
                {"status": {"progress": progress.to_wire()}},
                _content_type="application/merge-patch+json",
                _request_timeout=10,
            )
            self._sent = progress
            self.patches += 1
        except Exception as e:
            self.errors += 1
            if self.errors in (1, 10) or self.errors % 100 == 0:  # a broken channel must not flood the log
                log.warning(
                    "progress patch to %s/%s failed (%d so far): %s", self.job.namespace, self.job.name, self.errors, e
                )

    def close(self, timeout: float = 10.0) -> None:
        """Send the latest progress one last time (bounded by `timeout`) and stop."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            final = threading.Thread(target=self._send, daemon=True)
            final.start()
            final.join(timeout)


def _same(a: Progress, b: Progress) -> bool:
    return a.model_dump(exclude={"updated_at"}) == b.model_dump(exclude={"updated_at"})


@dataclass
class RunSummary:
    """The run summary JSON: the config, and per attempt its steps, losses, timings and devices. Each
    attempt appends itself to the file left by the previous ones."""

    uri: str
    config: dict[str, Any]
    attempt: dict[str, Any] = field(default_factory=dict)
    previous: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def open(cls, checkpoint_uri: str, config: dict[str, Any], attempt: int) -> RunSummary:
        uri = storage.join(checkpoint_uri, SUMMARY_FILE)
        previous: list[dict[str, Any]] = []
        try:
            if storage.is_file(uri):
                previous = [
                    a for a in json.loads(storage.read_text(uri)).get("attempts", []) if a.get("attempt") != attempt
                ]
        except (storage.StorageError, ValueError) as e:
            log.warning("previous run summary %s unreadable (%s); starting a new one", uri, e)
        return cls(uri, config, {"attempt": attempt, "started_at": now_rfc3339(), "losses": {}}, previous)

    def record_loss(self, step: int, loss: float) -> None:
        self.attempt["losses"][str(step)] = loss

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "attempts": [*self.previous, self.attempt]}

    def write(self) -> None:
        try:
            storage.write_text(self.uri, json.dumps(self.to_json(), indent=2))
        except storage.StorageError as e:
            log.warning("run summary not written: %s", e)


class RunProgress:
    """What the training loop reports after each step; fans out to metrics, the status reporter and the
    summary. Tokens/s is over the step's wall time, measured here between reports."""

    def __init__(
        self,
        total_steps: int,
        metrics: TrainMetrics,
        summary: RunSummary,
        reporter: StatusReporter | None,
        start_step: int,
        last_checkpoint_step: int | None,
    ):
        self.total_steps = total_steps
        self.metrics = metrics
        self.summary = summary
        self.reporter = reporter
        self.step = start_step
        self.loss: float | None = None
        self.tokens_per_second: float | None = None
        self.last_checkpoint_step = last_checkpoint_step
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._step_started = time.monotonic()
        self._step_times: list[float] = []
        metrics.total_steps.set(total_steps)
        metrics.step.set(start_step)
        if last_checkpoint_step is not None:
            metrics.last_checkpoint_step.set(last_checkpoint_step)
        self._publish()

    def step_done(self, step: int, loss: float, tokens: int, tokens_total: int) -> None:
        now = time.monotonic()
        elapsed = now - self._step_started
        self._step_started = now
        with self._lock:
            self.step, self.loss = step, loss
            self.tokens_per_second = tokens / elapsed if elapsed > 0 else None
        self._step_times.append(elapsed)
        self.metrics.step.set(step)
        self.metrics.loss.set(loss)
        self.metrics.tokens.set(tokens_total)
        self.metrics.step_seconds.observe(elapsed)
        if self.tokens_per_second is not None:
            self.metrics.tokens_per_second.set(self.tokens_per_second)
        self.summary.record_loss(step, loss)
        log.info(
            "step %d/%d loss %.4f %s tokens/s %.2fs",
            step,
            self.total_steps,
            loss,
            f"{self.tokens_per_second:.0f}" if self.tokens_per_second else "-",
            elapsed,
        )
        self._publish()

    def restart_step_clock(self) -> None:
        """Call when a pause that is not training ends (e.g. evaluation)."""
        self._step_started = time.monotonic()

    def checkpoint_saved(self, step: int, blocking_s: float) -> None:
        self.metrics.checkpoint_seconds.labels("blocking").observe(blocking_s)
        self.summary.attempt.setdefault("checkpoints", []).append({"step": step, "blocking_s": round(blocking_s, 3)})
        self.summary.attempt["end_step"] = step
        self.summary.write()  # a run killed without warning still leaves its losses up to here

    def checkpoint_committed(self, step: int, total_s: float) -> None:
        """Called from Orbax's background thread once a checkpoint is durable."""
        self.metrics.checkpoint_seconds.labels("commit").observe(total_s)
        self.metrics.last_checkpoint_step.set(step)
        with self._lock:
            self.last_checkpoint_step = step
        for c in self.summary.attempt.get("checkpoints", []):
            if c["step"] == step:
                c["commit_s"] = round(total_s, 3)
        self._publish()

    def eval_done(self, step: int, loss: float) -> None:
        self.metrics.eval_loss.set(loss)
        self.summary.attempt.setdefault("eval_losses", {})[str(step)] = loss

    def progress(self) -> Progress:
        with self._lock:
            step, loss, tps, ckpt = self.step, self.loss, self.tokens_per_second, self.last_checkpoint_step
        eta = None
        if self._step_times and step < self.total_steps:
            recent = self._step_times[-20:]
            eta = int(sum(recent) / len(recent) * (self.total_steps - step))
        return Progress(
            step=step,
            total_steps=self.total_steps,
            percent=round(100.0 * step / self.total_steps, 1) if self.total_steps else None,
            loss=round(loss, 6) if loss is not None else None,
            tokens_per_second=round(tps, 1) if tps is not None else None,
            eta_seconds=eta,
            last_checkpoint_step=ckpt,
            updated_at=now_rfc3339(),
        )

    def _publish(self) -> None:
        if self.reporter is not None:
            self.reporter.update(self.progress())

    def step_times(self) -> list[float]:
        return list(self._step_times)
