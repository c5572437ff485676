"""Spot preemption: SIGTERM -> checkpoint at the current step -> exit EXIT_PREEMPTED.

GKE sends SIGTERM when it reclaims a Spot VM, then SIGKILL after the pod's grace period. Before the
training loop runs there is nothing new to save, so SIGTERM ends the run at once (Preempted raised in the
main thread). Inside the loop it only sets a flag: the loop stops at the next optimizer-step boundary (a
step that has started finishes, gradient accumulation included, so the optimizer state is whole), saves a
checkpoint for that step, and the CLI exits with EXIT_PREEMPTED. A step that is still compiling when the
signal arrives delays this; the grace period must cover one step plus one checkpoint write.

On a multi-host slice a host that stops before the loop tells the others (hosts.announce_stop); each of them
then stops as if it got the SIGTERM too (`peer_stopped`), since the stopped host never joins their first
agreement.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


class Preempted(Exception):
    """SIGTERM before training started: nothing to checkpoint."""


class PreemptionWatch:
    def __init__(self) -> None:
        self.requested = False
        self.requested_at: float | None = None
        self._in_loop = False
        self.stopped_before_loop = False  # Preempted was raised in the main thread
        self.decided = False  # the outcome is being written: a later SIGTERM changes nothing
        # Run in a thread of its own on a SIGTERM before the loop: Preempted raised in the main thread can be
        # swallowed (logging's emit catches every exception) or wait for a call into C to return.
        self.on_stop_before_loop: Callable[[], None] | None = None
        self._previous: object = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.decided:
            return
        first = not self.requested
        self.requested = True
        self.requested_at = self.requested_at or time.monotonic()
        if not self._in_loop:
            if first:  # a second SIGTERM must not interrupt the handling of the first
                self.stopped_before_loop = True
                if self.on_stop_before_loop is not None:
                    threading.Thread(target=self.on_stop_before_loop, name="stop", daemon=True).start()
                raise Preempted("SIGTERM before training started")
            return
        if first:
            log.warning("SIGTERM: stopping at the end of this step to checkpoint")

    def decide(self) -> None:
        """The run's outcome is known and being written (the main thread, or a thread finishing for it)."""
        self.decided = True

    def peer_stopped(self, process_id: int) -> None:
        """Another host stopped before training: stop this one as if it got the SIGTERM too. In the loop its
        first agreement stops it instead (hosts.PeerStopped)."""
        if not (self._in_loop or self.requested or self.decided):
            log.warning("process %d stopped before training: stopping too", process_id)
            os.kill(os.getpid(), signal.SIGTERM)

    def enter_loop(self) -> None:
        """From now on (to the end of the run) SIGTERM only sets the flag. Raises Preempted if it already
        arrived."""
        self._in_loop = True
        if self.requested:
            self.stopped_before_loop = True
            raise Preempted("SIGTERM before training started")
