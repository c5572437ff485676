"""The one-pod Jobs (preflight, merge, evaluation): one follower says where such a Job stands, and each phase
acts on that. The Job controller retries the pod (backoffLimit); the follower reads the pods' endings in one
order, so that every phase sees a rejected config, an eviction or a Job that gave up the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tpuforge.api import finetune_reasons as r
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune.children import JobView, PodView, pod_ending
from tpuforge.controllers.finetune.context import Ctx

State = Literal[
    "absent",  # no Job: the phase creates it
    "deleting",  # someone removed it: it is recreated once it is gone
    "done",  # the result is in (`pod` holds it, where the result is the pod's termination message)
    "rejected",  # a pod refused its config: retrying does the same
    "evicted",  # a pod was evicted for its own use of memory or disk: the same every time
    "disrupted",  # pods were taken away more often than `max_disruptions`
    "failed",  # the Job gave up (`ended_by`: the Job's Failed reason)
    "missing",  # the Job completed, but no pod holds the result
    "queued",  # Kueue holds it (the job is Queued)
    "running",  # its pod runs (`pod`)
    "starting",  # nothing to say yet
]


@dataclass(frozen=True)
class Standing:
    state: State
    job: JobView | None = None
    pod: PodView | None = None
    detail: str = ""  # the last pod's ending (or the Job's own reason) for the failing states
    count: int = 0  # for "disrupted": how many pods were taken away
    reason: str = ""  # for "rejected": the pod's ending's reason

    @property
    def at_once(self) -> bool:
        """The Job's pod failure policy ended it at the first rejected config (seen before the pod's ending)."""
        return self.job is not None and self.job.failure.startswith("PodFailurePolicy")

    @property
    def past_deadline(self) -> bool:
        return self.job is not None and self.job.failure.startswith("DeadlineExceeded")


def _succeeded(pods: list[PodView]) -> PodView | None:
    return next((p for p in pods if p.phase == "Succeeded"), None)


def follow(
    ctx: Ctx,
    name: str,
    *,
    result: Callable[[list[PodView]], PodView | None] | None = _succeeded,
    reject: bool = True,
    max_disruptions: int | None = None,
) -> Standing:
    """Where the one-pod Job `name` stands. `result` picks the pod whose termination message is the result
    (None: the result is the Job's completion, e.g. outputs committed to GCS); `reject`: a pod that refused its
    config ends the Job's phase at once; `max_disruptions`: pods taken away (which the pod failure policy does
    not count against backoffLimit) and self-evictions are counted here."""
    job = ctx.job(name)
    if job is None:
        return Standing("absent")
    if result is None and job.complete:
        return Standing("done", job)
    if job.deleting:
        return Standing("deleting", job)
    pods = ctx.pods_of(job)
    done = result(pods) if result is not None else None
    if done is not None:
        return Standing("done", job, done)
    endings = [e for e in (pod_ending(p) for p in pods) if e is not None]
    failures = [e for e in endings if e.outcome == "Failed"]
    rejected = next((e for e in failures if e.permanent), None) if reject else None
    if rejected is not None:
        return Standing("rejected", job, detail=rejected.message, reason=rejected.reason)
    if max_disruptions is not None:
        evicted = next((e for e in failures if e.reason == r.EVICTED), None)
        if evicted is not None:
            return Standing("evicted", job, detail=evicted.message)
        disrupted = [e for e in endings if e.outcome == "Preempted"]
        if len(disrupted) > max_disruptions:
            return Standing("disrupted", job, detail=disrupted[-1].message, count=len(disrupted))
    if job.failed:
        return Standing("failed", job, detail=failures[-1].message if failures else job.failure)
    if job.complete and not any(not p.terminal for p in pods):
        return Standing("missing", job)
    if queue.queue_or_admit(ctx, job):
        return Standing("queued", job)
    running = next((p for p in pods if p.phase == "Running" and not p.deleting), None)
    return Standing("running", job, running) if running is not None else Standing("starting", job)
