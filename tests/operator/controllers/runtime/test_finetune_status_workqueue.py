"""The keyed work queue behind the reconciles: one run per key at a time, requests fold together, the
earliest delay wins, failures back off."""

from __future__ import annotations

import asyncio

from tpuforge.controllers.runtime.workqueue import KeyedQueue, backoff


def test_requests_during_a_run_fold_into_one_more_run_and_never_overlap() -> None:
    async def scenario() -> tuple[list[str], int]:
        runs: list[str] = []
        active = 0
        peak = 0
        gate = asyncio.Event()

        async def work(key: str) -> float | None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            runs.append(key)
            await gate.wait()
            active -= 1
            return None

        q: KeyedQueue[str] = KeyedQueue(work, concurrency=4)
        q.request("a")
        await asyncio.sleep(0.01)
        for _ in range(5):
            q.request("a")
        gate.set()
        await asyncio.sleep(0.05)
        await q.close()
        return runs, peak

    runs, peak = asyncio.run(scenario())
    assert runs == ["a", "a"]
    assert peak == 1


def test_concurrency_is_bounded_across_keys() -> None:
    async def scenario() -> int:
        active = 0
        peak = 0

        async def work(key: int) -> float | None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.01)
            active -= 1
            return None

        q: KeyedQueue[int] = KeyedQueue(work, concurrency=3)
        for k in range(20):
            q.request(k)
        await asyncio.sleep(0.2)
        await q.close()
        return peak

    assert asyncio.run(scenario()) == 3


def test_the_earliest_delay_wins_and_a_returned_delay_requeues() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        times: list[float] = []

        async def work(key: str) -> float | None:
            times.append(loop.time() - start)
            return 0.05 if len(times) == 1 else None

        q: KeyedQueue[str] = KeyedQueue(work, concurrency=1)
        q.request("k", delay=0.5)
        q.request("k", delay=0.05)
        q.request("k", delay=0.3)
        await asyncio.sleep(0.4)
        await q.close()
        return times

    times = asyncio.run(scenario())
    assert len(times) == 2
    assert 0.04 <= times[0] < 0.25 and times[1] - times[0] >= 0.04


def test_a_failing_run_is_retried_with_backoff() -> None:
    async def scenario() -> int:
        calls = 0

        async def work(key: str) -> float | None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("apiserver unavailable")
            return None

        q: KeyedQueue[str] = KeyedQueue(work, concurrency=1)
        q.request("k")
        await asyncio.sleep(backoff(1) + 0.2)
        await q.close()
        return calls

    assert asyncio.run(scenario()) == 2
    assert backoff(1) < backoff(2) < backoff(10) == backoff(100)


def test_forget_drops_a_pending_timer() -> None:
    async def scenario() -> int:
        calls = 0

        async def work(key: str) -> float | None:
            nonlocal calls
            calls += 1
            return None

        q: KeyedQueue[str] = KeyedQueue(work, concurrency=1)
        q.request("k", delay=0.05)
        q.forget("k")
        await asyncio.sleep(0.1)
        await q.close()
        return calls

    assert asyncio.run(scenario()) == 0
