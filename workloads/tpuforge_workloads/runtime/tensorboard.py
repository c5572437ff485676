"""TensorBoard event files for a run, written locally and copied to a gs:// (or local) run directory.

The writer is tensorboardX's: it writes the event-file format TensorBoard reads without TensorFlow, it is
already in the trainer's environment (Tunix's metrics backends bring it), and it is a small pure-Python
package the evaluator image adds beside vLLM. TensorBoard's own package would bring a web server and its
dependencies into both images just to write a file.

Each EventLog writes one event file of its own (named by its start time and host) in a local
temporary directory; `sync` copies it whole to the run directory with storage.write_bytes, under the same
name. A GCS object appears whole or not at all, so a reader (TensorBoard on a laptop, polling the bucket)
sees the file as of some sync, never half of one; no commit marker is needed for a file that is only ever
replaced by a longer copy of itself. A resumed run opens a new EventLog: a new file beside the old ones, which
stay as they are. It starts with a restart marker at its first step (`purge_step`), so TensorBoard drops
what the interrupted attempt logged past the checkpoint it resumed from and draws the resumed values instead.

Nothing here may stop or slow training: writes go to tensorboardX's queue, copies to GCS run on a background
thread, and every error is logged and the event log carries on (or, at open, is skipped).
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from tpuforge_workloads import storage

log = logging.getLogger(__name__)

# How often the background thread copies the event file to the run directory when something was written;
# `sync()` (a checkpoint, an evaluation) asks for a copy at once.
SYNC_INTERVAL_SECONDS = 60.0


def without_torch() -> None:
    """For a JAX program's entry point, before its first import of Tunix: tensorboardX (which Tunix imports
    whole, through its metrics backends) imports torch wherever torch is installed, 3 s of start-up that the
    program never uses. Marked absent, torch is not loaded and tensorboardX takes numpy's arrays, as in the
    trainer's image, which has no torch. Where torch is already loaded nothing changes."""
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]


class EventLog:
    """Scalars and text for one TensorBoard run directory `uri` (gs:// or local)."""

    def __init__(self, uri: str, purge_step: int | None = None, sync_interval: float = SYNC_INTERVAL_SECONDS):
        from tensorboardX import SummaryWriter

        self.uri = uri
        self._local = Path(tempfile.mkdtemp(prefix="tpuforge-tensorboard-"))
        # tensorboardX flushes by itself every flush_secs; the sync thread flushes before each copy anyway.
        self._writer = SummaryWriter(
            logdir=str(self._local),
            purge_step=purge_step,
            flush_secs=int(max(sync_interval, 1)),
            # tensorboardX names the file by the second and the host; the nanoseconds keep two writers of one
            # second apart (never one file over another) and in the order they started, which TensorBoard reads.
            filename_suffix=f".{time.time_ns()}.tpuforge",
        )
        self._interval = sync_interval
        self._lock = threading.Lock()  # one copy at a time; close() waits for a running one
        self._dirty = False
        self._closed = False
        self._copied: dict[str, int] = {}  # local file name -> size last copied
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.syncs = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="tensorboard-sync", daemon=True)
        self._thread.start()

    def scalar(self, tag: str, value: float, step: int) -> None:
        try:
            self._writer.add_scalar(tag, float(value), global_step=int(step))
            self._dirty = True
        except Exception as e:  # the run goes on without this point
            self._error("write", e)

    def text(self, tag: str, text: str, step: int) -> None:
        try:
            self._writer.add_text(tag, text, global_step=int(step))
            self._dirty = True
        except Exception as e:
            self._error("write", e)

    def sync(self) -> None:
        """Ask for a copy to the run directory now (from the background thread); never blocks."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._dirty and not self._stop.is_set():
                self._copy()

    def _copy(self) -> None:
        with self._lock:
            self._dirty = False
            try:
                if not self._closed:
                    self._writer.flush()
                for path in sorted(self._local.iterdir()):
                    size = path.stat().st_size
                    if self._copied.get(path.name) == size:
                        continue
                    storage.write_bytes(storage.join(self.uri, path.name), path.read_bytes())
                    self._copied[path.name] = size
                self.syncs += 1
            except Exception as e:
                self._dirty = True  # try again at the next sync
                self._error("copy to " + self.uri, e)

    def _error(self, what: str, e: Exception) -> None:
        self.errors += 1
        if self.errors in (1, 10) or self.errors % 100 == 0:  # a broken bucket must not flood the log
            log.warning("TensorBoard event %s failed (%d so far): %s", what, self.errors, e)

    def close(self, timeout: float = 10.0) -> None:
        """Write out what is queued, copy it one last time (waiting at most `timeout` seconds for a copy
        already under way) and stop."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            self._closed = True
            try:
                self._writer.close()
            except Exception as e:
                self._error("close", e)
        final = threading.Thread(target=self._copy, daemon=True)
        final.start()
        final.join(timeout)
        if not final.is_alive():
            shutil.rmtree(self._local, ignore_errors=True)


def open_run(uri: str, purge_step: int | None = None, sync_interval: float = SYNC_INTERVAL_SECONDS) -> EventLog | None:
    """An EventLog for `uri`, or None (logged) when one cannot be opened here (tensorboardX missing, no
    temporary directory): the run goes on without TensorBoard files."""
    try:
        return EventLog(uri, purge_step, sync_interval)
    except Exception as e:
        log.warning("no TensorBoard event files at %s: %s: %s", uri, type(e).__name__, e)
        return None


def write_scalars(uri: str, scalars: dict[str, float], step: int, texts: dict[str, str] | None = None) -> bool:
    """One event file at `uri` holding `scalars` (and `texts`) at `step`, copied before returning; False (logged)
    when it could not be written. For a program that reports once, such as the evaluation's score step."""
    events = open_run(uri, sync_interval=3600.0)
    if events is None:
        return False
    for tag, value in scalars.items():
        events.scalar(tag, value, step)
    for tag, text in (texts or {}).items():
        events.text(tag, text, step)
    events.close()
    return events.errors == 0
