"""A keyed work queue for level-based reconciles on asyncio.

Watch events only say "look at this object again": requests for one key fold together, one run per key at a
time (so two runs never race on the same object), a request made during a run gives exactly one more run,
a delayed request (a deadline, a TTL) keeps the earliest time asked for, and a run that raises is retried
with a per-key exponential backoff. At most `concurrency` runs go at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

BACKOFF_FIRST = 0.5
BACKOFF_MAX = 60.0


@dataclass
class _KeyState:
    running: bool = False
    dirty: bool = False
    timer: asyncio.TimerHandle | None = None
    due: float = 0.0
    failures: int = 0


def backoff(failures: int) -> float:
    return float(min(BACKOFF_FIRST * 2.0 ** max(failures - 1, 0), BACKOFF_MAX))


class KeyedQueue(Generic[K]):
    """`work(key)` returns when to look at the key again (seconds), or None for "only on the next event"."""

    def __init__(self, work: Callable[[K], Awaitable[float | None]], concurrency: int, name: str = "queue"):
        self._work = work
        self._slots = asyncio.Semaphore(concurrency)
        self._keys: dict[K, _KeyState] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._name = name
        self._closed = False

    def request(self, key: K, delay: float = 0.0) -> None:
        """Reconcile `key` now (or in `delay` seconds). Call from the event loop's thread."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        state = self._keys.setdefault(key, _KeyState())
        if delay > 0:
            due = loop.time() + delay
            if state.timer is not None and state.due <= due:
                return
            if state.timer is not None:
                state.timer.cancel()
            state.timer, state.due = loop.call_later(delay, self._fire, key), due
            return
        if state.running:
            state.dirty = True
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.running = True
        task = loop.create_task(self._run(key, state), name=f"{self._name}:{key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fire(self, key: K) -> None:
        state = self._keys.get(key)
        if state is not None:
            state.timer = None
        self.request(key)

    def forget(self, key: K) -> None:
        """Drop pending timers for a deleted object (a run in progress finishes)."""
        state = self._keys.get(key)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
        if not state.running:
            del self._keys[key]

    def __len__(self) -> int:
        return len(self._keys)

    async def _run(self, key: K, state: _KeyState) -> None:
        again: float | None = None
        try:
            while True:
                state.dirty = False
                async with self._slots:
                    try:
                        again = await self._work(key)
                        state.failures = 0
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        state.failures += 1
                        again = backoff(state.failures)
                        log.exception("%s: reconciling %s failed; retrying in %.1fs", self._name, key, again)
                if not state.dirty or self._closed:
                    break
        finally:
            state.running = False
        if again is not None:
            self.request(key, again)
        elif state.timer is None and self._keys.get(key) is state:
            del self._keys[key]

    async def close(self) -> None:
        self._closed = True
        for state in self._keys.values():
            if state.timer is not None:
                state.timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
