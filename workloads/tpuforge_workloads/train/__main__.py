"""python -m tpuforge_workloads.train --config PATH [--termination-log PATH]

Exit codes: 0 trained to the last step, or stopped early (training.earlyStopping); EXIT_BAD_CONFIG (2) config
or input unusable, found before training; EXIT_PREEMPTED (83) SIGTERM handled, checkpoint saved (message starts
with "Preempted"); 1 any other failure. The termination log gets one line saying which, and why; after exit 0
that line is a TrainResult (JSON) whose `message` says it in words, and which names the best evaluated step.

On a multi-host slice (TPUFORGE_NUM_PROCESSES > 1, see hosts.py) every host runs this; process 0 alone
reports the job's progress, writes the run summary and serves the job-level metrics, and every process
serves its own step and checkpoint timings on /metrics. A host that stops before training (SIGTERM while
loading) stops the others too, and every host leaves the slice only once all are done (hosts.leave).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import statistics
import sys
import threading
import time
from typing import Any

from tpuforge.api import TrainResult
from tpuforge.api.constants import (
    EXIT_BAD_CONFIG,
    EXIT_PREEMPTED,
    SPOT_NOTICE_ENV,
    TENSORBOARD_SUBDIR,
    TENSORBOARD_TRAIN_RUN,
    TERMINATION_LOG,
    TERMINATION_PREEMPTED,
)
from tpuforge_workloads import storage
from tpuforge_workloads.families.decoder import ModelError
from tpuforge_workloads.runtime import tensorboard as tensorboard_log
from tpuforge_workloads.runtime import termination, tpu_access
from tpuforge_workloads.runtime.progress import METRICS_ADDR_ENV, RunProgress, RunSummary, StatusReporter, TrainMetrics
from tpuforge_workloads.train import hosts as slice_hosts
from tpuforge_workloads.train import rollcall, shutdown_notice
from tpuforge_workloads.train.hosts import Hosts, HostsError, PeerStopped
from tpuforge_workloads.train.plan import BadInput, Plan, load_config, make_plan
from tpuforge_workloads.train.preemption import Preempted, PreemptionWatch

log = logging.getLogger("tpuforge_workloads.train")


def write_termination(path: str, message: str) -> None:
    """One line for `kubectl describe` / the operator."""
    log.info("termination message: %s", " ".join(message.split()))
    termination.write(path, message, one_line=True)


def finished_message(outcome: Any, checkpoint_uri: str) -> TrainResult:
    """The result of a run that ended well (trained to the end, or stopped early), in words and numbers."""
    loss = f"{outcome.loss:.4f}" if outcome.loss is not None else "n/a"
    best = outcome.best
    best_said = f"best step {best.step} (eval loss {best.loss:.4f})" if best is not None else None
    stop = outcome.stopped_early
    if stop is not None:
        improve = f" by more than {stop.min_delta:g}" if stop.min_delta else ""
        head = (
            f"Stopped early at step {outcome.step} of {outcome.total_steps}: eval loss did not improve{improve} "
            f"for {stop.evals} evals"
        )
    else:
        head = f"Trained to step {outcome.step} of {outcome.total_steps}"
    parts = [head, f"loss {loss}", *([best_said] if best_said else []), f"checkpoints in {checkpoint_uri}"]
    return TrainResult(
        message="; ".join(parts),
        step=outcome.step,
        total_steps=outcome.total_steps,
        loss=outcome.loss,
        best=best,
        last_eval=outcome.last_eval,
        stopped_early=stop,
    )


def _latest_checkpoint(uri: str) -> int | None:
    try:
        from tpuforge_workloads.train.checkpoints import latest_step

        return latest_step(uri)
    except Exception:
        return None


def _step_timings(progress: RunProgress | None) -> dict[str, Any]:
    times = progress.step_times() if progress else []
    if not times:
        return {}
    steady = times[1:] or times
    return {
        "first_step_s": round(times[0], 3),
        "median_step_s": round(statistics.median(steady), 4),
        "steps_timed": len(times),
    }


class ProcessSummary(RunSummary):
    """The run summary on a process other than 0: kept (its step times make the exit message), never
    written; process 0 writes the job's."""

    def write(self) -> None:
        pass


def process_metrics(port: int) -> TrainMetrics:
    """A process other than 0 serves only what is its own: step and checkpoint timings. The job-level
    series (step, loss, tokens) come from process 0 alone, so sums over a slice's pods count them once."""
    from prometheus_client import CollectorRegistry, start_http_server

    metrics = TrainMetrics(0)
    if port:
        served = CollectorRegistry()
        served.register(metrics.step_seconds)
        served.register(metrics.checkpoint_seconds)
        addr = os.environ.get(METRICS_ADDR_ENV, "0.0.0.0")
        try:
            start_http_server(port, addr=addr, registry=served)
            metrics.port = port
        except OSError as e:
            log.warning("metrics server not started on %s:%d: %s; training continues", addr, port, e)
    return metrics


# After a SIGTERM before training (this host's or another's): how long the main thread has to write the
# outcome by itself before another thread does it for it. It cannot while blocked in a collective that waits
# for a stopped host, and Preempted raised into it can be swallowed (logging catches every exception).
STOP_GRACE_S = 10.0


def train(plan: Plan, watch: PreemptionWatch, termination_log: str, hosts: Hosts = Hosts()) -> int:
    """Run the JAX part with reporting around it; returns the exit code."""
    c = plan.config
    port = slice_hosts.metrics_port(c.metrics_port)
    metrics = TrainMetrics(port) if hosts.primary else process_metrics(port)
    summary_type = RunSummary if hosts.primary else ProcessSummary
    summary = summary_type.open(c.checkpoint.uri, c.to_wire(), c.attempt)
    summary.attempt["data"] = plan.stats.to_json()
    summary.attempt["examples_per_step"] = plan.examples_per_step
    if plan.eval_stats:
        summary.attempt["eval_data"] = plan.eval_stats.to_json()
    reporter = StatusReporter(c.job, c.progress_interval_seconds) if c.job and hosts.primary else None
    timings: dict[str, float] = {}
    box: list[RunProgress] = []

    def progress_factory(start_step: int, committed: int | None) -> RunProgress:
        events = None
        if hosts.primary:
            # A resumed attempt's file starts where it resumed: TensorBoard drops what the interrupted one
            # logged past that step.
            uri = storage.join(c.checkpoint.uri, TENSORBOARD_SUBDIR, TENSORBOARD_TRAIN_RUN)
            events = tensorboard_log.open_run(uri, purge_step=start_step + 1 if start_step else None)
            if events is not None:
                summary.attempt["tensorboard"] = uri
                log.info("TensorBoard event files in %s", uri)
        progress = RunProgress(
            plan.total_steps,
            metrics,
            summary,
            reporter,
            start_step,
            committed,
            events=events,
            skipped_records=plan.skipped_records,
            examples_per_step=plan.examples_per_step,
            max_grad_norm=c.training.max_grad_norm,
        )
        box.append(progress)
        summary.attempt["start_step"] = start_step
        return box[0]

    finishing = threading.Lock()

    def finish(code: int, message: str, terminated: str | None = None) -> None:
        """Record the outcome (summary, termination message) and leave the slice (no return on several hosts).
        Once: a second caller waits for the first to end the process."""
        if not finishing.acquire(blocking=False):
            threading.Event().wait()
        watch.decide()
        progress = box[0] if box else None
        timings["total_s"] = time.monotonic() - started
        summary.attempt.update(
            {
                "exit_code": code,
                "message": message,
                "timings": {**{k: round(v, 3) for k, v in timings.items()}, **_step_timings(progress)},
            }
        )
        try:
            if progress is not None and progress.events is not None:
                progress.events.close()
            summary.write()
        finally:
            if reporter is not None:
                reporter.close()
            write_termination(termination_log, terminated or message)
            slice_hosts.leave(hosts, code)

    def stop_before_training(who: int | None) -> None:
        """From a thread of its own: this host (who None) or process `who` stopped before training. Tell the
        others, or stop this host too; then, unless the main thread has written the outcome meanwhile, write
        it from here."""
        if who is None:
            slice_hosts.announce_stop(hosts)
        else:
            watch.peer_stopped(who)
        time.sleep(STOP_GRACE_S)
        if not watch.decided:
            log.warning("the main thread has not stopped %.0f s after the SIGTERM: finishing from here", STOP_GRACE_S)
            by = "" if who is None else f" (process {who} stopped first)"
            finish(EXIT_PREEMPTED, f"{TERMINATION_PREEMPTED} before training started{by}")

    code, message = 1, "Training failed"
    result: TrainResult | None = None
    started = time.monotonic()
    watch.on_stop_before_loop = lambda: stop_before_training(None)
    try:
        rollcall.initialize(hosts)  # before anything else of JAX
        slice_hosts.on_peer_stop(hosts, stop_before_training)
        import jax

        from tpuforge_workloads.train import loop  # JAX starts here, after the input checks

        summary.attempt["devices"] = [str(d) for d in jax.devices()]
        summary.attempt["host"] = platform.node()
        if hosts.multi:
            summary.attempt["processes"] = hosts.num_processes
        outcome = loop.run(plan, watch, progress_factory, timings, hosts)
        if outcome.preempted:
            code = EXIT_PREEMPTED
            message = f"{TERMINATION_PREEMPTED} at step {outcome.step}; checkpoint saved"
        else:
            code = 0
            result = finished_message(outcome, c.checkpoint.uri)
            message = result.message
            if result.stopped_early is not None:
                summary.attempt["stopped_early"] = result.stopped_early.to_wire()
        summary.attempt["end_step"] = outcome.step
        if outcome.compile_cache is not None:
            summary.attempt["compile_cache"] = outcome.compile_cache
    except (Preempted, PeerStopped):
        watch.decide()
        code = EXIT_PREEMPTED
        step = _latest_checkpoint(c.checkpoint.uri)
        message = f"{TERMINATION_PREEMPTED} before training started; latest checkpoint: step {step or 0}"
    except (BadInput, ModelError) as e:
        code, message = EXIT_BAD_CONFIG, f"Bad config: {e}"
    except HostsError as e:  # a host did not join the slice (named)
        log.error("%s", e)
        code, message = 1, f"Training failed: {e}"
    except Exception as e:
        denied = tpu_access.device_denied(e)
        if watch.stopped_before_loop:  # Preempted raised into code that turned it into another error
            log.warning("stopping before training: %s: %s", type(e).__name__, e)
            code, message = EXIT_PREEMPTED, f"{TERMINATION_PREEMPTED} before training started"
        elif denied is not None:
            log.error("%s", denied)  # the first thing the log says, before libtpu's own words
            code, message = 1, f"Training failed: {denied}"
        else:
            log.exception("training failed")
            code, message = 1, f"Training failed: {type(e).__name__}: {e}"
    finish(code, message, result.model_dump_json(by_alias=True, exclude_none=True) if result else None)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_workloads.train", description="LoRA SFT of Gemma 4")
    parser.add_argument("--config", required=True, help="TrainConfig JSON written by the operator")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help=f"default {TERMINATION_LOG}")
    parser.add_argument(
        "--compile-cache", metavar="URI", help="gs:// or local directory of compiled steps (default: the config's)"
    )
    args = parser.parse_args(argv)
    # force: absl (imported by the ML stack) has already put a handler on the root logger.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    # Orbax and Tunix log every file operation and step at INFO; the run logs its own progress.
    logging.getLogger("absl").setLevel(logging.WARNING)

    watch = PreemptionWatch()
    watch.install()
    if os.environ.get(SPOT_NOTICE_ENV):
        # The notice comes before the node's SIGTERM and its ~15 s: the same stop, started sooner.
        shutdown_notice.watch(lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        hosts = slice_hosts.from_env()
        config = load_config(args.config)
        if args.compile_cache:
            config.compile_cache_uri = args.compile_cache
        plan = make_plan(config, write_manifest=hosts.primary)
    except (BadInput, HostsError) as e:
        log.error("%s", e)
        write_termination(args.termination_log, f"Bad config: {e}")
        return EXIT_BAD_CONFIG
    except Preempted:
        write_termination(args.termination_log, f"{TERMINATION_PREEMPTED} before training started; nothing to save")
        return EXIT_PREEMPTED
    s = plan.stats
    if plan.skipped:
        log.warning(
            "%d malformed records skipped (dataset.skipInvalid); the first: %s",
            len(plan.skipped),
            "; ".join(plan.skipped[:5]),
        )
    log.info(
        "%d records -> %d examples (%d dropped over length, %d truncated, %d without loss tokens, %d held out); "
        "%d steps",
        s.records,
        s.examples,
        s.dropped_over_length,
        s.truncated,
        s.dropped_no_loss,
        s.held_out,
        plan.total_steps,
    )
    return train(plan, watch, args.termination_log, hosts)


if __name__ == "__main__":
    tensorboard_log.without_torch()  # every host, every attempt: 3 s sooner to its first step where torch is
    sys.exit(main())
