"""How a training run reports itself: FineTuneJob status.progress patches, Prometheus metrics, a run
summary JSON beside the checkpoints, and TensorBoard event files (tensorboard_log.py).

None of these may stop or slow training. Status patches go out from a background thread at most every
`interval` seconds (the latest values win; nothing queues up), and any error is logged and retried at the
next interval. The metrics server failing to bind is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tpuforge.api import CheckpointSave, JobRef, PreferenceProgress, Progress, RlProgress, display, now_rfc3339
from tpuforge.api.constants import FINETUNEJOB_PLURAL, GROUP, VERSION
from tpuforge_workloads import storage
from tpuforge_workloads.runtime.tensorboard import EventLog

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
            "tpuforge_trainer_tokens_per_second",
            "Real (non-padding) tokens trained per second over the last 30 s or 20 steps, whichever is longer.",
            registry=r,
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
        # DPO and ORPO only (an SFT run has none of these series): set=train is the last step, eval held out.
        self.preference_accuracy = Gauge(
            "tpuforge_trainer_preference_accuracy",
            "Preference pairs whose chosen answer has the higher reward (0 to 1).",
            ["set"],
            registry=r,
        )
        self.reward_margin = Gauge(
            "tpuforge_trainer_reward_margin", "Mean chosen minus rejected reward over the pairs.", ["set"], registry=r
        )
        self.reward = Gauge(
            "tpuforge_trainer_reward",
            "Mean reward of the chosen and the rejected answers (answer=chosen|rejected), or of the answers GRPO "
            "sampled (answer=sampled).",
            ["set", "answer"],
            registry=r,
        )
        # GRPO only: the last step's sampled answers.
        self.pass_rate = Gauge(
            "tpuforge_trainer_pass_rate", "Share of the last step's sampled answers the checker passed.", registry=r
        )
        self.kl = Gauge("tpuforge_trainer_kl", "Mean per-token KL of the model to the base, last step.", registry=r)
        self.checker_refusals = Counter(
            "tpuforge_trainer_checker_refusals",
            "Sampled answers the checker refused (its rules against gaming the test).",
            registry=r,
        )
        self.checker_share = Gauge(
            "tpuforge_trainer_checker_share", "Share of the last step's time spent in the checker.", registry=r
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
    attempt appends itself to the file left by the previous ones. A process that starts again under the same
    attempt number (a container restarted in place, the trainer CLI run again on the same checkpoints) is a
    record of its own, numbered by `restart`: the record it follows keeps the losses only it saw."""

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
                previous = list(json.loads(storage.read_text(uri)).get("attempts", []))
        except (storage.StorageError, ValueError) as e:
            log.warning("previous run summary %s unreadable (%s); starting a new one", uri, e)
        record: dict[str, Any] = {"attempt": attempt, "started_at": now_rfc3339(), "losses": {}}
        if restarts := sum(a.get("attempt") == attempt for a in previous):
            record["restart"] = restarts
        return cls(uri, config, record, previous)

    def record_loss(self, step: int, loss: float) -> None:
        self.attempt["losses"][str(step)] = loss

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "attempts": [*self.previous, self.attempt]}

    def write(self) -> None:
        try:
            storage.write_text(self.uri, json.dumps(self.to_json(), indent=2))
        except storage.StorageError as e:
            log.warning("run summary not written: %s", e)


def sample_markdown(sample: dict[str, str]) -> str:
    """A sample as TensorBoard's text plugin shows it (Markdown): prompt, answer and reference, each quoted
    as code so the model's text is shown as it is."""

    def block(text: str) -> str:
        return "\n".join("    " + line for line in (text or " ").splitlines())

    return "\n\n".join(
        f"**{name}**\n\n{block(sample.get(key, ''))}"
        for name, key in (("prompt", "prompt"), ("answer", "answer"), ("reference", "reference"))
    )


# Throughput is measured over at least this long and this many steps, whichever covers more: a single
# step's wall time says little under asynchronous dispatch (a step whose result was already waiting looks
# nearly free), and a window this size evens that out while still following real changes within a minute.
RATE_WINDOW_SECONDS = 30.0
RATE_WINDOW_STEPS = 20


@dataclass(frozen=True)
class _Mark:
    """A point where a step's result was on the host: the clock (pauses removed), the step, the tokens so far."""

    t: float
    step: int
    tokens: int


class ThroughputWindow:
    """Tokens/s and steps/s over the last RATE_WINDOW_SECONDS or RATE_WINDOW_STEPS, whichever is longer.

    `mark` is called once a step's result is ready (its loss is a host float), so the marks time finished
    device work, not dispatch. Pauses that are not training (evaluation) are cut out of the clock. With
    fewer marks than a full window, the rate covers every mark since the first finished step (the first step
    also compiles, so it only starts the clock), and, with a single mark, the time since training started.
    """

    def __init__(self, clock: Callable[[], float], start_step: int):
        self._clock = clock
        self._paused = 0.0
        self._start = _Mark(clock(), start_step, 0)
        self._marks: deque[_Mark] = deque()

    def now(self) -> float:
        return self._clock() - self._paused

    def mark(self, step: int, tokens_total: int) -> None:
        self._marks.append(_Mark(self.now(), step, tokens_total))
        # Keep the newest mark that still spans a full window, and nothing older.
        while len(self._marks) > 2 and self._full(self._marks[1]):
            self._marks.popleft()

    def restart(self) -> None:
        """A pause ended: the time since the last mark was not training."""
        last = self._marks[-1].t if self._marks else self._start.t
        self._paused += max(self.now() - last, 0.0)

    def _full(self, base: _Mark) -> bool:
        last = self._marks[-1]
        return last.t - base.t >= RATE_WINDOW_SECONDS and last.step - base.step >= RATE_WINDOW_STEPS

    def _span(self) -> tuple[float, int, int] | None:
        """Seconds, steps and tokens covered by the window."""
        if not self._marks:
            return None
        last = self._marks[-1]
        base = self._marks[0] if len(self._marks) > 1 else self._start
        seconds = last.t - base.t
        if seconds <= 0 or last.step <= base.step:
            return None
        return seconds, last.step - base.step, last.tokens - base.tokens

    def tokens_per_second(self) -> float | None:
        span = self._span()
        return span[2] / span[0] if span else None

    def seconds_per_step(self) -> float | None:
        span = self._span()
        return span[0] / span[1] if span else None


class RunProgress:
    """What the training loop reports after each step; fans out to metrics, the status reporter and the
    summary. Tokens/s and the ETA come from one ThroughputWindow, and the status, the log line and the gauge
    all carry the same rounded number."""

    def __init__(
        self,
        total_steps: int,
        metrics: TrainMetrics,
        summary: RunSummary,
        reporter: StatusReporter | None,
        start_step: int,
        last_checkpoint_step: int | None,
        clock: Callable[[], float] = time.monotonic,
        events: EventLog | None = None,
        skipped_records: int | None = None,
        examples_per_step: int | None = None,
        max_grad_norm: float | None = None,
    ):
        """`skipped_records`: malformed records left out (spec.dataset.skipInvalid; None when not skipping).
        `examples_per_step`: rows of one optimizer step (the effective batch). `max_grad_norm`: the clip's
        norm, to count the steps it scaled down."""
        self.max_grad_norm = max_grad_norm
        self.total_steps = total_steps
        self.examples_per_step = examples_per_step
        self.skipped_records = skipped_records
        self.metrics = metrics
        self.summary = summary
        self.reporter = reporter
        self.step = start_step
        self.loss: float | None = None
        self.tokens_per_second: float | None = None
        self.eta_seconds: int | None = None
        self.last_checkpoint_step = last_checkpoint_step
        self.last_checkpoint: CheckpointSave | None = None
        self._lock = threading.Lock()
        self._clock = clock
        self._window = ThroughputWindow(clock, start_step)
        self._step_started = clock()
        self._step_times: list[float] = []
        self._write_at_loss: int | None = None  # a saved checkpoint's step whose loss is not reported yet
        self.events = events
        self.preference: PreferenceProgress | None = None
        self.rl: RlProgress | None = None
        metrics.total_steps.set(total_steps)
        metrics.step.set(start_step)
        if last_checkpoint_step is not None:
            metrics.last_checkpoint_step.set(last_checkpoint_step)
        self._publish()

    def step_done(
        self, step: int, loss: float, tokens: int, tokens_total: int, learning_rate: float | None = None
    ) -> None:
        """Step `step` has finished: `loss` is its loss as a host float (so the device work is done),
        `tokens` its real tokens, `tokens_total` all real tokens trained on so far, `learning_rate` the one
        the step's update used."""
        now = self._clock()
        elapsed = now - self._step_started
        self._step_started = now
        self._window.mark(step, tokens_total)
        tps = self._window.tokens_per_second()
        per_step = self._window.seconds_per_step()
        with self._lock:
            self.step, self.loss = step, loss
            self.tokens_per_second = round(tps, 1) if tps is not None else None
            self.eta_seconds = math.ceil(max(self.total_steps - step, 0) * per_step) if per_step is not None else None
        self._step_times.append(elapsed)
        self.metrics.step.set(step)
        self.metrics.loss.set(loss)
        self.metrics.tokens.set(tokens_total)
        self.metrics.step_seconds.observe(elapsed)
        if self.tokens_per_second is not None:
            self.metrics.tokens_per_second.set(self.tokens_per_second)
        self.summary.record_loss(step, loss)
        if step == self._write_at_loss:
            self._write_at_loss = None
            self.summary.write()  # the checkpointed step's own loss, before a kill can lose it
        if self.events is not None:
            self.events.scalar("train/loss", loss, step)
            if self.tokens_per_second is not None:
                self.events.scalar("train/tokens_per_second", self.tokens_per_second, step)
            if learning_rate is not None:
                self.events.scalar("train/learning_rate", learning_rate, step)
        log.info(
            "step %d/%d loss %s tokens/s %s eta %s (step %.2fs, %d tokens)",
            step,
            self.total_steps,
            display.significant(loss),
            f"{self.tokens_per_second:.1f}" if self.tokens_per_second is not None else "-",
            display.duration(self.eta_seconds) if self.eta_seconds is not None else "-",
            elapsed,
            tokens,
        )
        self._publish()

    def restart_step_clock(self) -> None:
        """Call when a pause that is not training ends (e.g. evaluation)."""
        self._window.restart()
        self._step_started = self._clock()

    def checkpoint_saved(self, step: int, blocking_s: float) -> None:
        """Step `step` was saved. The summary is written now, and again once the step's loss arrives: the
        trainer reports step s's loss only after dispatching step s+1 (trainer.GradNorms), which is after the
        save, so a run killed later would otherwise resume at s+1 with step s's loss in no summary."""
        if str(step) not in self.summary.attempt["losses"]:
            self._write_at_loss = step
        self.metrics.checkpoint_seconds.labels("blocking").observe(blocking_s)
        self.summary.attempt.setdefault("checkpoints", []).append({"step": step, "blocking_s": round(blocking_s, 3)})
        self.summary.attempt["end_step"] = step
        self.summary.write()  # a run killed without warning still leaves its losses up to here
        if self.events is not None:
            self.events.sync()

    def checkpoint_committed(self, step: int, total_s: float, nbytes: int) -> None:
        """Called from Orbax's background thread once a checkpoint is durable: `total_s` since its save
        began, `nbytes` its files."""
        self.metrics.checkpoint_seconds.labels("commit").observe(total_s)
        self.metrics.last_checkpoint_step.set(step)
        with self._lock:
            self.last_checkpoint_step = step
            self.last_checkpoint = CheckpointSave(step=step, seconds=round(total_s, 3), bytes=nbytes)
        for c in self.summary.attempt.get("checkpoints", []):
            if c["step"] == step:
                c["commit_s"] = round(total_s, 3)
                c["bytes"] = nbytes
        self._publish()

    def grad_norm(self, step: int, norm: float) -> None:
        """The global norm of step `step`'s averaged gradient before clipping (SftTrainer's train step computes
        it); a norm over `max_grad_norm` is a step the clip scaled down, counted in the run summary
        (`clipped_steps`, per attempt) and in TensorBoard (train/clipped_steps)."""
        if self.events is not None:
            self.events.scalar("train/grad_norm", norm, step)
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            clipped = int(self.summary.attempt.get("clipped_steps", 0)) + 1
            self.summary.attempt["clipped_steps"] = clipped
            if self.events is not None:
                self.events.scalar("train/clipped_steps", clipped, step)

    def eval_done(self, step: int, loss: float) -> None:
        self.metrics.eval_loss.set(loss)
        self.summary.attempt.setdefault("eval_losses", {})[str(step)] = loss
        if self.events is not None:
            self.events.scalar("eval/loss", loss, step)
            self.events.sync()

    def preference_done(self, step: int, figures: dict[str, float], mode: str) -> None:
        """A preference step's (`mode` train) or evaluation's (eval) figures, means over its pairs: loss,
        accuracy (pairs whose chosen answer has the higher reward), reward margin, chosen and rejected
        rewards (train/preference.py). In the run summary (per attempt, by step) and TensorBoard
        (<mode>/preference/<figure>)."""
        rounded = {k: round(v, 6) for k, v in figures.items()}
        self.summary.attempt.setdefault(f"{mode}_preference", {})[str(step)] = rounded
        label = "eval" if mode == "eval" else "train"
        self.metrics.preference_accuracy.labels(label).set(figures["accuracy"])
        self.metrics.reward_margin.labels(label).set(figures["margin"])
        self.metrics.reward.labels(label, "chosen").set(figures["chosen_reward"])
        self.metrics.reward.labels(label, "rejected").set(figures["rejected_reward"])
        held_out = {
            "eval_step": step,
            "eval_accuracy": rounded["accuracy"],
            "eval_reward_margin": rounded["margin"],
            "eval_loss": rounded["loss"],
        }
        last_step = {
            "accuracy": rounded["accuracy"],
            "reward_margin": rounded["margin"],
            "chosen_reward": rounded["chosen_reward"],
            "rejected_reward": rounded["rejected_reward"],
        }
        with self._lock:
            before = self.preference or PreferenceProgress()
            self.preference = before.model_copy(update=held_out if mode == "eval" else last_step)
        if self.events is not None:
            for name, value in figures.items():
                self.events.scalar(f"{mode}/preference/{name}", value, step)
        log.info(
            "%s preference at step %d: accuracy %.3f margin %s chosen %s rejected %s",
            mode,
            step,
            figures["accuracy"],
            display.significant(figures["margin"]),
            display.significant(figures["chosen_reward"]),
            display.significant(figures["rejected_reward"]),
        )
        if mode == "eval":
            self._publish()  # a step's figures go with the step's own report

    def rl_done(self, step: int, figures: dict[str, Any]) -> None:
        """A GRPO step's figures (train/grpo.py, step_figures and summary): mean reward, pass rate, KL to the
        base, answer length, refusals and failures by category, the checker's share of the step. In the run
        summary (per attempt, by step), TensorBoard (train/rl/<figure>, train/rl/failures/<category>),
        Prometheus and status.progress.rl."""
        scalars = {k: v for k, v in figures.items() if isinstance(v, (int, float))}
        self.summary.attempt.setdefault("train_rl", {})[str(step)] = {
            **{k: round(float(v), 6) for k, v in scalars.items()},
            "failures": figures.get("failures", {}),
        }
        self.metrics.reward.labels("train", "sampled").set(figures["reward"])
        self.metrics.pass_rate.set(figures["pass_rate"])
        self.metrics.kl.set(figures.get("kl", 0.0))
        self.metrics.checker_refusals.inc(figures.get("refused", 0))
        self.metrics.checker_share.set(figures.get("checker_share", 0.0))
        with self._lock:
            before = self.rl or RlProgress()
            self.rl = before.model_copy(
                update={
                    "reward": round(figures["reward"], 6),
                    "pass_rate": round(figures["pass_rate"], 6),
                    "kl": round(figures.get("kl", 0.0), 6),
                    "response_tokens": round(figures.get("response_tokens", 0.0), 2),
                    "refused": int(figures.get("refused", 0)),
                    "refused_total": (before.refused_total or 0) + int(figures.get("refused", 0)),
                    "checker_share": round(figures.get("checker_share", 0.0), 4),
                }
            )
        if self.events is not None:
            for name, value in scalars.items():
                self.events.scalar(f"train/rl/{name}", float(value), step)
            for category, count in figures.get("failures", {}).items():
                self.events.scalar(f"train/rl/failures/{category}", float(count), step)
        log.info(
            "rl at step %d: reward %.3f pass rate %.3f kl %s answer tokens %.1f refused %d checker %.0f%% of the step",
            step,
            figures["reward"],
            figures["pass_rate"],
            display.significant(figures.get("kl", 0.0)),
            figures.get("response_tokens", 0.0),
            int(figures.get("refused", 0)),
            100 * figures.get("checker_share", 0.0),
        )

    def samples_done(self, step: int, samples: list[dict[str, str]]) -> None:
        """Greedy answers to held-out prompts at the evaluation of step `step`, each {"prompt", "answer",
        "reference"}: in the run summary (per attempt, by step) and as one TensorBoard text summary each."""
        self.summary.attempt.setdefault("samples", {})[str(step)] = samples
        if self.events is not None:
            for i, sample in enumerate(samples):
                self.events.text(f"samples/{i}", sample_markdown(sample), step)
            self.events.sync()
        for sample in samples:
            log.info("sample at step %d: %r -> %r", step, sample["prompt"], sample["answer"])

    def progress(self) -> Progress:
        with self._lock:
            step, loss, tps, eta, ckpt, save, pref, rl = (
                self.step,
                self.loss,
                self.tokens_per_second,
                self.eta_seconds,
                self.last_checkpoint_step,
                self.last_checkpoint,
                self.preference,
                self.rl,
            )
        return Progress(
            step=step,
            total_steps=self.total_steps,
            percent=round(100.0 * step / self.total_steps, 1) if self.total_steps else None,
            loss=round(loss, 6) if loss is not None else None,
            tokens_per_second=tps,
            eta_seconds=eta,
            last_checkpoint_step=ckpt,
            last_checkpoint=save,
            examples_per_step=self.examples_per_step,
            skipped_records=self.skipped_records,
            preference=pref,
            rl=rl,
            updated_at=now_rfc3339(),
        ).displayed()

    def _publish(self) -> None:
        if self.reporter is not None:
            self.reporter.update(self.progress())

    def step_times(self) -> list[float]:
        return list(self._step_times)
