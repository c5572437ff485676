"""Spot preemption: SIGTERM -> checkpoint at the current step -> exit EXIT_PREEMPTED.

GKE sends SIGTERM when it reclaims a Spot VM, then SIGKILL after the pod's grace period. Before the
training loop runs there is nothing new to save, so SIGTERM ends the run at once (Preempted raised in the
main thread). Inside the loop it only sets a flag: the loop stops at the next optimizer-step boundary (a
step that has started finishes, gradient accumulation included, so the optimizer state is whole), saves a
checkpoint for that step, and the CLI exits with EXIT_PREEMPTED. A step that is still compiling when the
signal arrives delays this; the grace period must cover one step plus one checkpoint write.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

log = logging.getLogger(__name__)


class Preempted(Exception):
    """SIGTERM before training started: nothing to checkpoint."""


class PreemptionWatch:
    def __init__(self) -> None:
        self.requested = False
        self.requested_at: float | None = None
        self._in_loop = False
        self._previous: object = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        first = not self.requested
        self.requested = True
        self.requested_at = self.requested_at or time.monotonic()
        if not self._in_loop:
            raise Preempted("SIGTERM before training started")
        if first:
            log.warning("SIGTERM: stopping at the end of this step to checkpoint")

    def enter_loop(self) -> None:
        """From now on (to the end of the run) SIGTERM only sets the flag. Raises Preempted if it already
        arrived."""
        self._in_loop = True
        if self.requested:
            raise Preempted("SIGTERM before training started")
