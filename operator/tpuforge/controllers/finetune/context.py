"""What every FineTuneJob decision reads and writes: the observed object, `now`, the status being built and the
plan. `Base` is all a decision needs before the spec is known (a finished job, an invalid spec); `Ctx` adds
the effective spec, never None, for the phases. Pure: building a Plan performs no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpuforge.api import AttemptStatus, FineTuneJobSpec, FineTuneJobStatus, set_condition, tpu_slice
from tpuforge.api.conditions import ConditionStatus
from tpuforge.api.constants import JOBSET_API_VERSION, JOBSET_KIND
from tpuforge.controllers.finetune.children import ConfigView, JobView, PodView, WorkloadView, clip
from tpuforge.manifests import finetune_common as m

Obj = dict[str, Any]


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Observed:
    namespace: str
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]  # as stored (wire names); validated here
    status: FineTuneJobStatus
    jobs: tuple[JobView, ...] = ()
    pods: tuple[PodView, ...] = ()
    configs: tuple[ConfigView, ...] = ()
    workloads: tuple[WorkloadView, ...] = ()  # Kueue's, of the jobs above (none where Kueue is not installed)
    deleting: bool = False
    jobset_served: bool = True  # the cluster serves JobSets (their CRD is installed)
    model_job: Obj | None = None  # the FineTuneJob spec.model.fineTuneJobRef names, when it exists


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class ChildRef:
    api_version: str
    kind: str
    name: str


@dataclass
class Plan:
    status: FineTuneJobStatus
    create: list[Obj] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_self: bool = False
    requeue_after: float | None = None

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def attempt_entry(status: FineTuneJobStatus, attempt: int | None) -> AttemptStatus | None:
    if attempt is None:
        return None
    return next((a for a in status.attempts if a.attempt == attempt), None)


class Base:
    """The observed object, `now`, and the status and plan being built (the status is the plan's)."""

    def __init__(self, o: Observed, now: datetime):
        self.o = o
        self.now = now
        self.stamp = rfc3339(now)
        self.st = o.status.model_copy(deep=True)
        self.plan = Plan(status=self.st)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, clip(message)))

    def condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        self.st.conditions = set_condition(
            self.st.conditions, type_, status, reason, clip(message), self.o.generation, self.stamp
        )

    def has_condition(self, type_: str, status: str = "True", reason: str | None = None) -> bool:
        return any(
            c.type == type_ and c.status == status and (reason is None or c.reason == reason)
            for c in self.st.conditions
        )

    def pods_of(self, job: JobView) -> list[PodView]:
        return [p for p in self.o.pods if p.job_name == job.name]

    def job(self, name: str) -> JobView | None:
        return next((j for j in self.o.jobs if j.name == name), None)

    def workload_of(self, job: JobView) -> WorkloadView | None:
        """The Kueue Workload that queues `job`, if Kueue manages it."""
        return next((w for w in self.o.workloads if job.uid and w.owner_uid == job.uid), None)

    def delete_job(self, job: JobView) -> None:
        if job.kind == JOBSET_KIND:
            ref = ChildRef(JOBSET_API_VERSION, JOBSET_KIND, job.name)
        else:
            ref = ChildRef("batch/v1", "Job", job.name)
        if not job.deleting and ref not in self.plan.delete:
            self.plan.delete.append(ref)

    def live(self, job: JobView) -> bool:
        """A Job that runs or may still start a pod: one Kueue holds suspended starts its pods once admitted
        (again, after an eviction). A Job whose pods have all ended is kept, so that its pods' logs stay
        readable (`kubectl logs`) until the FineTuneJob is deleted."""
        if job.finished or job.deleting:
            return False
        if job.suspended:
            return True
        pods = self.pods_of(job)
        return not pods or any(not p.terminal for p in pods)

    def stop_children(self) -> None:
        """Remove every training, merge or evaluation Job still running (a finished job must not hold a slice)."""
        for job in self.o.jobs:
            if self.live(job):
                self.delete_job(job)


class Ctx(Base):
    """A Base with the effective spec: what the phases run with."""

    def __init__(self, base: Base, spec: FineTuneJobSpec):
        # The same status and plan as `base`: what either writes, both see.
        self.o, self.now, self.stamp, self.st, self.plan = base.o, base.now, base.stamp, base.st, base.plan
        self.spec = spec
        self.owner = m.owner(self.o.namespace, self.o.name, self.o.uid)
        self.slice = tpu_slice(spec.tpu.slice)  # resolved once: the phases read it from here
        self.hosts = self.slice.hosts  # more than one means a JobSet per attempt

    def train_name(self, attempt: int) -> str:
        return m.train_job_name(self.o.name, attempt, self.hosts)

    def train_job(self, attempt: int | None) -> JobView | None:
        return self.job(self.train_name(attempt)) if attempt is not None else None

    def entry(self, attempt: int) -> AttemptStatus:
        """Attempt `attempt`'s status entry, added (resuming at the last checkpoint) when it has none yet."""
        found = attempt_entry(self.st, attempt)
        if found is None:
            last = self.st.progress.last_checkpoint_step if self.st.progress else None
            found = AttemptStatus(attempt=attempt, job_name=self.train_name(attempt), start_step=last)
            self.st.attempts = [*self.st.attempts, found]
        return found

    def close_attempt(self, attempt: int | None, outcome: str, reason: str, message: str, at: str | None) -> None:
        if attempt is None:
            return
        e = self.entry(attempt)
        if e.outcome is None:
            e.outcome, e.reason, e.message = outcome, reason, clip(message)
            e.end_time = (at or self.stamp) if e.start_time else None
