"""The FineTuneJob decisions: from what is observed (the object and its children) to the status it should
have and the actions that get there. Pure: no I/O, and `now` is passed in.

Level-based and idempotent: every decision is a function of the stored status and the current attempt's
children, and writes absolute values (attempt n, failures k), never increments of what was read. Running it
twice, or on a stale view, gives the same result; the status patch carries the resourceVersion it was
computed from, so a stale plan is refused by the apiserver rather than applied.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from tpuforge.api import (
    AttemptStatus,
    Cost,
    FineTuneJobSpec,
    FineTuneJobStatus,
    FineTunePhase,
    Outputs,
    Restarts,
    RunPolicy,
    SpecError,
    adapter_uri,
    display,
    evaluation_verdict,
    set_condition,
    tpu_slice,
    validate_finetune,
)
from tpuforge.api.conditions import ConditionStatus
from tpuforge.api.configs import output_subdir
from tpuforge.api.constants import EVALUATION_SUBDIR, JOBSET_API_VERSION, JOBSET_KIND
from tpuforge.api.evaluation import checks
from tpuforge.api.finetune import CONDITION_EVALUATED, CONDITION_EVALUATION_PASSED, REASON_EVALUATION_FAILED
from tpuforge.controllers import defaults
from tpuforge.controllers import finetune_events as ev
from tpuforge.controllers.finetune_children import (
    AttemptEnd,
    ConfigView,
    JobView,
    PodView,
    clip,
    eval_result,
    pod_ending,
)
from tpuforge.manifests import finetune as m

Obj = dict[str, Any]

TERMINAL = (FineTunePhase.SUCCEEDED, FineTunePhase.FAILED)
# Condition types.
TRAINING = "Training"
MERGED = "Merged"
EVALUATED = CONDITION_EVALUATED
EVALUATION_PASSED = CONDITION_EVALUATION_PASSED
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
SPEC_CHANGE_NOT_APPLIED = "SpecChangeNotApplied"

# Where a multi-host job waits for JobSet to be installed, it looks again this often.
JOBSET_RECHECK_SECONDS = 60.0
JOBSET_INSTALL_URL = "https://jobset.sigs.k8s.io/docs/installation/"

# Fields whose change after the start would change the training maths (or the pods' identity): later
# attempts keep the values the run started with. Wire names, as `kubectl edit` shows them.
FROZEN_FIELDS = ("model", "dataset", "lora", "training", "checkpoint", "serviceAccountName")
FROZEN_TPU_FIELDS = ("slice", "mesh")
# While a trainer runs, TPU time (and so cost) grows without any event: look again this often.
# A pod the scheduler cannot place yet is how a node pool is asked to scale up (TPU nodes take minutes); only
# after this long does the status say that the training pod cannot be scheduled, and why.
UNSCHEDULABLE_REPORT_SECONDS = 300.0
COST_REFRESH_SECONDS = 60.0
TPU_HOURS_DIGITS = 3


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
    deleting: bool = False
    jobset_served: bool = True  # the cluster serves JobSets (their CRD is installed)


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


def _leaves(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}"))
        return out
    return {path: value}


def frozen_changes(started: FineTuneJobSpec, current: FineTuneJobSpec) -> list[str]:
    """The frozen fields (leaf paths such as spec.training.learningRate) that differ from the start."""
    a, b = started.to_wire(), current.to_wire()
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key in FROZEN_FIELDS:
        old.update(_leaves(a.get(key), f"spec.{key}"))
        new.update(_leaves(b.get(key), f"spec.{key}"))
    for key in FROZEN_TPU_FIELDS:
        old.update(_leaves(a.get("tpu", {}).get(key), f"spec.tpu.{key}"))
        new.update(_leaves(b.get("tpu", {}).get(key), f"spec.tpu.{key}"))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def effective_spec(started: FineTuneJobSpec, current: FineTuneJobSpec) -> FineTuneJobSpec:
    """The current spec with the frozen fields taken from the spec the run started with."""
    wire = current.to_wire()
    first = started.to_wire()
    for key in FROZEN_FIELDS:
        if key in first:
            wire[key] = first[key]
        else:
            wire.pop(key, None)
    tpu = dict(wire.get("tpu", {}))
    for key in FROZEN_TPU_FIELDS:
        if key in first.get("tpu", {}):
            tpu[key] = first["tpu"][key]
        else:
            tpu.pop(key, None)
    wire["tpu"] = tpu
    return FineTuneJobSpec.model_validate(wire)


def started_spec(configs: tuple[ConfigView, ...]) -> FineTuneJobSpec | None:
    """The spec the run started with, from the newest training ConfigMap that holds one."""
    for cv in sorted(configs, key=lambda c: c.attempt if c.attempt is not None else -1, reverse=True):
        if cv.spec is None:
            continue
        try:
            return FineTuneJobSpec.model_validate(cv.spec)
        except ValidationError:
            continue
    return None


def tpu_hours(attempts: list[AttemptStatus], now: datetime) -> float:
    """Slice-hours held by the trainer pods: each attempt from its start to its end (or now, if running)."""
    seconds = 0.0
    for a in attempts:
        if a.start_time is None:
            continue
        end = parse_time(a.end_time) if a.end_time else now
        seconds += max((end - parse_time(a.start_time)).total_seconds(), 0.0)
    return seconds / 3600.0


def eta_seconds(status: FineTuneJobStatus) -> int | None:
    """Time left at the current attempt's rate: steps done since it resumed over the time it has run."""
    prog = status.progress
    if prog is None or prog.step is None or not prog.total_steps or prog.updated_at is None:
        return None
    current = _entry(status, status.attempt)
    if current is None or current.start_time is None:
        return None
    done = prog.step - (current.start_step or 0)
    elapsed = (parse_time(prog.updated_at) - parse_time(current.start_time)).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    return max(math.ceil((prog.total_steps - prog.step) * elapsed / done), 0)


def _entry(status: FineTuneJobStatus, attempt: int | None) -> AttemptStatus | None:
    if attempt is None:
        return None
    for a in status.attempts:
        if a.attempt == attempt:
            return a
    return None


class _Planner:
    def __init__(self, o: Observed, now: datetime):
        self.o = o
        self.now = now
        self.stamp = rfc3339(now)
        self.st = o.status.model_copy(deep=True)
        self.plan = Plan(status=self.st)
        self.owner = m.owner(o.namespace, o.name, o.uid)
        self.spec: FineTuneJobSpec | None = None

    # --- small helpers --------------------------------------------------------------------------------

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, clip(message)))

    def condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        self.st.conditions = set_condition(
            self.st.conditions, type_, status, reason, clip(message), self.o.generation, self.stamp
        )

    def has_condition(self, type_: str, status: str = "True") -> bool:
        return any(c.type == type_ and c.status == status for c in self.st.conditions)

    @property
    def hosts(self) -> int:
        """The slice's hosts: more than one means a JobSet per attempt."""
        return tpu_slice(self.spec.tpu.slice).hosts if self.spec is not None else 1

    def train_name(self, attempt: int) -> str:
        return m.train_job_name(self.o.name, attempt, self.hosts)

    def train_job(self, attempt: int) -> JobView | None:
        name = self.train_name(attempt)
        return next((j for j in self.o.jobs if j.name == name), None)

    def merge_job(self) -> JobView | None:
        name = m.merge_job_name(self.o.name)
        return next((j for j in self.o.jobs if j.name == name), None)

    def pods_of(self, job: JobView) -> list[PodView]:
        return [p for p in self.o.pods if p.job_name == job.name]

    def delete_job(self, job: JobView) -> None:
        if job.kind == JOBSET_KIND:
            ref = ChildRef(JOBSET_API_VERSION, JOBSET_KIND, job.name)
        else:
            ref = ChildRef("batch/v1", "Job", job.name)
        if not job.deleting and ref not in self.plan.delete:
            self.plan.delete.append(ref)

    def live(self, job: JobView) -> bool:
        """A Job that runs or may still start a pod. A Job whose pods have all ended is kept, so that its
        pods' logs stay readable (`kubectl logs`) until the FineTuneJob is deleted."""
        if job.finished or job.deleting:
            return False
        pods = self.pods_of(job)
        return not pods or any(not p.terminal for p in pods)

    def stop_children(self) -> None:
        """Remove every training, merge or evaluation Job still running (a finished job must not hold a slice)."""
        for job in self.o.jobs:
            if self.live(job):
                self.delete_job(job)

    def entry(self, attempt: int) -> AttemptStatus:
        found = _entry(self.st, attempt)
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

    # --- the phases -----------------------------------------------------------------------------------

    def run(self) -> None:
        if self.o.deleting:
            return
        if self.st.phase in TERMINAL:
            self.finished()
        else:
            spec = self.effective_spec()
            self.spec = defaults.current().apply(spec) if spec is not None else None
            if self.spec is not None and not self.deadline_passed():
                if self.st.phase == FineTunePhase.MERGING:
                    self.merging()
                elif self.st.phase == FineTunePhase.EVALUATING:
                    self.evaluating()
                elif self.st.phase == FineTunePhase.SUSPENDED:
                    self.suspended()
                else:
                    self.training()
                self.wake_at_deadline()
        self.derive()
        self.st.observed_generation = self.o.generation

    def effective_spec(self) -> FineTuneJobSpec | None:
        started = started_spec(self.o.configs)
        try:
            current: FineTuneJobSpec | None = validate_finetune(self.o.spec)
            error: SpecError | None = None
        except SpecError as exc:
            current, error = None, exc
        if started is None:
            if current is None:
                assert error is not None
                self.fail("InvalidSpec", f"invalid spec: {error}", ev.invalid_spec(error.fields))
            return current
        if current is None:
            assert error is not None
            self.spec_change(
                f"the edited spec is invalid ({error}); the job keeps the spec it started with",
                ev.invalid_edit(error.fields),
            )
            return started
        changed = frozen_changes(started, current)
        self.spec_change(
            f"{', '.join(changed)} changed after the job started; these fields change the training maths, so "
            "the run keeps the values it started with (create a new FineTuneJob to train with them)"
            if changed
            else None,
            ev.frozen(changed),
        )
        return effective_spec(started, current)

    def spec_change(self, message: str | None, short: str = "") -> None:
        if message is None:
            if self.has_condition(SPEC_CHANGE_NOT_APPLIED):
                self.condition(SPEC_CHANGE_NOT_APPLIED, "False", "SpecMatches", "the spec matches the running job")
            return
        before = next((c for c in self.st.conditions if c.type == SPEC_CHANGE_NOT_APPLIED), None)
        self.condition(SPEC_CHANGE_NOT_APPLIED, "True", "FrozenFieldsChanged", message)
        if before is None or before.status != "True" or before.message != clip(message):
            self.event("Warning", ev.SPEC_FROZEN, short)

    def deadline_passed(self) -> bool:
        assert self.spec is not None
        limit = self.spec.run_policy.active_deadline_seconds
        if limit is None or self.st.start_time is None or self.st.phase == FineTunePhase.SUSPENDED:
            return False
        ran = (self.now - parse_time(self.st.start_time)).total_seconds()
        if ran < limit:
            return False
        message = (
            f"the job ran for {int(ran)}s, past spec.runPolicy.activeDeadlineSeconds={limit}; "
            "its Jobs were stopped (checkpoints stay)"
        )
        self.close_attempt(self.st.attempt, "Failed", "DeadlineExceeded", message, None)
        self.fail("DeadlineExceeded", message, ev.deadline(display.duration(ran)))
        return True

    def wake_at_deadline(self) -> None:
        assert self.spec is not None
        limit = self.spec.run_policy.active_deadline_seconds
        if limit is None or self.st.start_time is None or self.st.phase in (*TERMINAL, FineTunePhase.SUSPENDED):
            return
        self.plan.requeue(limit - (self.now - parse_time(self.st.start_time)).total_seconds())

    def training(self) -> None:
        assert self.spec is not None
        st = self.st
        if self.spec.run_policy.suspend:
            self.suspend()
            return
        if st.attempt is None:
            if self.jobset_missing():
                return
            self.begin(0)
            st.start_time = self.stamp
            s = tpu_slice(self.spec.tpu.slice)
            self.event("Normal", ev.CREATED, ev.created(s.id, s.topology, self.spec.tpu.spot, s.hosts))
        n = st.attempt
        assert n is not None
        job = self.train_job(n)
        if job is None:
            self.create_attempt(n)
            return
        if job.deleting:
            return  # someone removed it: it is recreated once it is gone
        pods = self.pods_of(job)
        self.record_start(n, pods)
        end = self.attempt_end(n, job, pods)
        if end is None:
            running = [p for p in pods if p.phase == "Running" and not p.deleting]
            if running and len(running) >= self.hosts:
                self.running(n, running)
            elif self.hosts > 1 or not any(p.phase == "Running" for p in pods):
                self.pending(n, pods)
            return
        self.close_attempt(n, end.outcome, end.reason, end.message, end.at)
        if end.outcome == "Succeeded":
            self.trained()
        elif end.outcome == "Preempted":
            self.preempted(n, job, end)
        else:
            self.failed_attempt(n, job, end)

    def record_start(self, n: int, pods: list[PodView]) -> None:
        """The first pod of the attempt that reached a node: its name and when TPU time began. On several
        hosts, every host's pod as it reaches its node."""
        on_nodes = [p for p in pods if p.running_since or p.start_time]
        started = next(iter(on_nodes), None)
        e = self.entry(n)
        if started is not None and e.pod_name is None:
            e.pod_name = started.name
            e.start_time = e.start_time or started.running_since or started.start_time
        if started is not None and e.node_name is None and started.node_name:
            e.node_name = started.node_name
        if self.hosts > 1:
            known = list(e.pods or [])
            new = [p.name for p in on_nodes if p.name not in known]
            if new:  # in host order, whichever host reached its node first
                host = {p.name: p.host for p in pods}
                e.pods = sorted(known + new, key=lambda name: (_unknown_last(host.get(name)), name))

    def begin(self, attempt: int) -> None:
        """Make `attempt` the current one (its Job is created by create_attempt)."""
        st = self.st
        st.attempt = attempt
        self.entry(attempt)
        st.restarts = st.restarts or Restarts()
        st.phase = FineTunePhase.PENDING
        self.condition(TRAINING, "False", "Pending", f"attempt {attempt}: waiting for the training pod to start")

    def jobset_missing(self) -> bool:
        """A multi-host slice on a cluster without JobSet: say so, create nothing, and look again later."""
        if self.hosts == 1 or self.o.jobset_served:
            return False
        assert self.spec is not None
        message = (
            f"{self.spec.tpu.slice} spans {self.hosts} hosts, and multi-host training runs as a JobSet "
            f"({JOBSET_API_VERSION}), which this cluster does not serve: install JobSet ({JOBSET_INSTALL_URL}); "
            "the job starts once it is installed"
        )
        if not any(c.type == TRAINING and c.reason == "JobSetNotInstalled" for c in self.st.conditions):
            self.event("Warning", ev.NO_JOBSET, ev.no_jobset(self.spec.tpu.slice))
        self.st.phase = self.st.phase or FineTunePhase.PENDING
        self.condition(TRAINING, "False", "JobSetNotInstalled", message)
        self.plan.requeue(JOBSET_RECHECK_SECONDS)
        return True

    def create_attempt(self, n: int) -> None:
        assert self.spec is not None
        if self.jobset_missing():
            return
        job_name = self.train_name(n)
        busy = [p for p in self.o.pods if p.component == m.COMPONENT_TRAINER and not p.terminal]
        if busy:
            # Two trainers must never write the same checkpoint directory.
            self.condition(
                TRAINING,
                "False",
                "WaitingForPreviousAttempt",
                f"attempt {n} starts when pod {busy[0].name} has stopped (it checkpoints on SIGTERM)",
            )
            return
        self.plan.create.extend(m.attempt_objects(self.owner, self.spec, n))
        self.st.phase = self.st.phase or FineTunePhase.PENDING
        if not self.has_condition(TRAINING, "False") or any(
            c.type == TRAINING and c.reason == "JobSetNotInstalled" for c in self.st.conditions
        ):
            what = "JobSet" if self.hosts > 1 else "Job"
            self.condition(TRAINING, "False", "Pending", f"attempt {n}: created {what} {job_name}")

    def attempt_end(self, n: int, job: JobView, pods: list[PodView]) -> AttemptEnd | None:
        if self.hosts > 1:
            return self.hosts_end(n, job, pods)
        endings = [e for e in (pod_ending(p) for p in pods) if e is not None]
        done = next((e for e in endings if e.outcome == "Succeeded"), None)
        if done is not None:
            return done
        if endings:
            return endings[-1]
        if job.complete:
            return AttemptEnd("Succeeded", "Completed", f"Job {job.name} completed")
        if job.failed:
            return AttemptEnd("Failed", "JobFailed", f"Job {job.name} failed: {job.failure}")
        recorded = self.entry(n).pod_name
        if recorded and not any(p.name == recorded for p in pods):
            return AttemptEnd(
                "Preempted",
                "PodDeleted",
                f"pod {recorded} disappeared before it finished (node loss, eviction or deletion)",
            )
        return None

    def hosts_end(self, n: int, job: JobView, pods: list[PodView]) -> AttemptEnd | None:
        """A multi-host attempt ends with its first host: a preemption of any host is a preemption of the
        attempt (its peers' errors, or their checkpoint and exit 83, follow from losing it), any other failure
        of a host is a failure, and it succeeds when every host has."""
        pods = sorted(pods, key=_host_order)
        ended = [(p, e) for p in pods if (e := pod_ending(p)) is not None]
        failed = next(((p, e) for p, e in ended if e.outcome == "Failed"), None)
        # The evidence of a preemption, best first: the host that was taken away, not a peer that checkpointed.
        taken = [(p, e) for p, e in ended if e.outcome == "Preempted" and e.reason != "TrainerCheckpointed"]
        if ended:
            taken += [
                (p, AttemptEnd("Preempted", "DisruptionTarget", f"pod {p.name} is being disrupted: {p.disruption}"))
                for p in pods
                if p.disruption is not None and not p.terminal
            ]
        taken += [(p, e) for p, e in ended if e.reason == "TrainerCheckpointed"]
        if taken:
            pod, end = taken[0]
            return self.from_host(pod, end)
        gone = [name for name in self.entry(n).pods or [] if not any(p.name == name for p in pods)]
        if gone:
            return AttemptEnd(
                "Preempted",
                "PodDeleted",
                f"pod {gone[0]} disappeared before it finished (node loss, eviction or deletion)",
            )
        if failed is not None:
            pod, end = failed
            return self.from_host(pod, end)
        if len(ended) >= self.hosts or job.complete:
            at = ended[-1][1].at if ended else None
            return AttemptEnd("Succeeded", "Completed", f"all {self.hosts} hosts of JobSet {job.name} completed", at)
        if job.failed:
            return AttemptEnd("Failed", "JobSetFailed", f"JobSet {job.name} failed: {job.failure}")
        return None

    def from_host(self, pod: PodView, end: AttemptEnd) -> AttemptEnd:
        return dataclasses.replace(
            end, message=f"{self.host_of(pod)}: {end.message}", host=pod.host, node=pod.node_name
        )

    def host_of(self, pod: PodView) -> str:
        """Which host a pod is, for Events: its index in the slice and its node."""
        index = f"host {pod.host} of {self.hosts}" if pod.host is not None else f"a host of {self.hosts}"
        return f"{index} (pod {pod.name}" + (f" on node {pod.node_name})" if pod.node_name else ")")

    def running(self, n: int, pods: list[PodView]) -> None:
        pods = sorted(pods, key=_host_order)
        pod = pods[0]
        e = self.entry(n)
        e.pod_name = e.pod_name or pod.name
        e.node_name = e.node_name or pod.node_name
        e.start_time = e.start_time or pod.running_since or pod.start_time or self.stamp
        if self.st.phase != FineTunePhase.TRAINING:
            self.st.phase = FineTunePhase.TRAINING
            if len(pods) > 1:
                nodes = sorted({p.node_name for p in pods if p.node_name})
                who = f"{len(pods)} pods ({', '.join(p.name for p in pods)})"
                where = f" on nodes {', '.join(nodes)}" if nodes else ""
                self.condition(TRAINING, "True", "Running", f"attempt {n}: {who} are training{where}")
                self.event("Normal", ev.TRAINING, ev.started_on_hosts(n, len(pods)))
            else:
                where = f" on node {pod.node_name}" if pod.node_name else ""
                self.condition(TRAINING, "True", "Running", f"attempt {n}: pod {pod.name} is training{where}")
                self.event("Normal", ev.TRAINING, ev.started(n, pod.node_name))
        self.plan.requeue(COST_REFRESH_SECONDS)

    def pending(self, n: int, pods: list[PodView]) -> None:
        """Say why the pod does not start once it has waited longer than a TPU node pool takes to scale up
        (before that, an unschedulable pod is the normal way to ask for a node)."""
        stuck = next((p for p in pods if p.unschedulable), None)
        if stuck is not None:
            since = parse_time(stuck.unschedulable_since) if stuck.unschedulable_since else self.now
            wait = UNSCHEDULABLE_REPORT_SECONDS - (self.now - since).total_seconds()
            if wait > 0:
                self.plan.requeue(wait)
                return
            self.condition(
                TRAINING,
                "False",
                "Unschedulable",
                f"attempt {n}: pod {stuck.name} has waited for a node since {rfc3339(since)}: {stuck.unschedulable}",
            )
        elif any(c.type == TRAINING and c.reason == "Unschedulable" for c in self.st.conditions):
            self.condition(TRAINING, "False", "Pending", f"attempt {n}: waiting for the training pod to start")

    def trained(self) -> None:
        assert self.spec is not None
        st = self.st
        st.outputs = (st.outputs or Outputs()).model_copy(update={"checkpoint_uri": self.spec.checkpoint.uri})
        step = st.progress.step if st.progress and st.progress.step is not None else None
        self.condition(
            TRAINING, "False", "Completed", "training finished" + (f" at step {step}" if step is not None else "")
        )
        merge = self.spec.merge
        if not merge.enabled and not merge.write_adapter:
            self.succeed(
                f"training finished; the LoRA checkpoint is in {self.spec.checkpoint.uri} "
                "(spec.merge.enabled and spec.merge.writeAdapter are false, so nothing was exported)",
                ev.trained_only(),
            )
            return
        # One merge Job exports what the spec asks for: the merged model, the PEFT adapter, or both.
        st.phase = FineTunePhase.MERGING
        if merge.enabled:
            said = f"merging the LoRA weights into {self.spec.output.uri}"
            if merge.write_adapter:
                said += f"; exporting the adapter to {adapter_uri(self.spec)}"
            self.condition(MERGED, "False", "Merging", said)
            self.event("Normal", ev.MERGING, ev.merging(self.spec.output.uri))
        else:
            self.condition(
                MERGED,
                "False",
                "Exporting",
                f"exporting the LoRA adapter to {adapter_uri(self.spec)} "
                "(spec.merge.enabled is false: no merged model)",
            )
            self.event("Normal", ev.MERGING, ev.exporting(adapter_uri(self.spec)))
        self.plan.create.extend(m.merge_objects(self.owner, self.spec))

    def resuming(self, n: int) -> None:
        """Say where attempt `n` picks up: the last checkpoint, and the steps since it that are done again."""
        prog = self.st.progress
        if prog is None or prog.step is None:  # the trainer never reported: the operator cannot tell
            self.event("Normal", ev.RESUMING, ev.resuming(n, None, None))
            return
        ckpt = prog.last_checkpoint_step or 0  # the trainer reports one from its start; none means step 0
        # Progress older than the ended attempt's start is its predecessor's: that attempt did no step.
        ended = _entry(self.st, n - 1)
        stale = bool(
            prog.updated_at
            and ended is not None
            and ended.start_time
            and parse_time(prog.updated_at) < parse_time(ended.start_time)
        )
        self.event("Normal", ev.RESUMING, ev.resuming(n, ckpt, 0 if stale else max(prog.step - ckpt, 0)))

    def next_attempt(self, n: int, job: JobView) -> None:
        if self.live(job):
            self.delete_job(job)  # e.g. a replacement pod the Job controller started after a node loss
        self.begin(n + 1)
        self.create_attempt(n + 1)

    def preempted(self, n: int, job: JobView, end: AttemptEnd) -> None:
        st = self.st
        st.restarts = (st.restarts or Restarts()).model_copy(
            update={"preemptions": (st.restarts.preemptions if st.restarts else 0) + 1}
        )
        ckpt = st.progress.last_checkpoint_step if st.progress else None
        resume = f"from checkpoint step {ckpt}" if ckpt is not None else "from the latest checkpoint"
        if self.hosts > 1:
            self.event("Warning", ev.PREEMPTED, ev.host_preempted(n, end.host, self.hosts, end.node))
            why = f" ({end.message})"
        else:
            self.event("Warning", ev.PREEMPTED, ev.preempted(n, self.entry(n).node_name))
            why = ""
        self.resuming(n + 1)
        self.next_attempt(n, job)
        self.condition(
            TRAINING, "False", "Preempted", f"attempt {n} was preempted{why}; attempt {n + 1} resumes {resume}"
        )

    def failed_attempt(self, n: int, job: JobView, end: AttemptEnd) -> None:
        assert self.spec is not None
        st = self.st
        failures = (st.restarts.failures if st.restarts else 0) + 1
        st.restarts = (st.restarts or Restarts()).model_copy(update={"failures": failures})
        limit = self.spec.run_policy.max_restarts
        if end.permanent:
            self.fail(
                end.reason,
                f"attempt {n}: {end.message}; not retried: fix the spec and create the job again",
                ev.rejected_config(n),
            )
            return
        if failures > limit:
            self.fail(
                "TrainingFailed",
                f"attempt {n}: {end.message}; gave up after {failures} failures (spec.runPolicy.maxRestarts={limit})",
                ev.gave_up(n, end.reason, failures),
            )
            return
        self.event("Warning", ev.RETRYING, ev.retrying(n, end.reason, failures, limit))
        self.resuming(n + 1)
        self.next_attempt(n, job)
        self.condition(TRAINING, "False", "Retrying", f"attempt {n} failed; retrying as attempt {n + 1}")

    def suspend(self) -> None:
        st = self.st
        n = st.attempt
        job = self.train_job(n) if n is not None else None
        if job is not None:
            self.delete_job(job)
        self.close_attempt(n, "Suspended", "Suspended", "spec.runPolicy.suspend was set", None)
        if st.phase != FineTunePhase.SUSPENDED:
            st.phase = FineTunePhase.SUSPENDED
            self.condition(
                SUSPENDED,
                "True",
                "Suspended",
                "spec.runPolicy.suspend is true: the training Job was removed and the checkpoints stay; "
                "set it to false to resume",
            )
            if n is not None:
                self.condition(TRAINING, "False", "Suspended", f"attempt {n} was stopped")
            self.event("Normal", ev.SUSPENDED, ev.suspended())

    def suspended(self) -> None:
        assert self.spec is not None
        st = self.st
        if self.spec.run_policy.suspend:
            job = self.train_job(st.attempt) if st.attempt is not None else None
            if job is not None:
                self.delete_job(job)
            return
        n = 0 if st.attempt is None else st.attempt + 1
        st.start_time = self.stamp  # as for a Kubernetes Job, the deadline counts from the resume
        self.begin(n)
        self.condition(SUSPENDED, "False", "Resumed", f"resumed as attempt {n}")
        ckpt = st.progress.last_checkpoint_step if st.progress else None
        self.event("Normal", ev.RESUMED, ev.resumed(n, ckpt))
        self.create_attempt(n)

    def merging(self) -> None:
        assert self.spec is not None
        job = self.merge_job()
        if job is None:
            self.plan.create.extend(m.merge_objects(self.owner, self.spec))
            return
        if job.complete:
            self.merged()
        elif job.failed:
            ends = [e for e in (pod_ending(p) for p in self.pods_of(job)) if e is not None]
            detail = ends[-1].message if ends else job.failure
            self.condition(MERGED, "False", "MergeFailed", detail)
            self.fail(
                "MergeFailed",
                f"the merge Job {job.name} failed after {m.MERGE_BACKOFF_LIMIT + 1} tries; last: {detail}",
                ev.merge_failed(),
            )

    def merged(self) -> None:
        """The merge Job committed its outputs: the merged model, the adapter, or both."""
        assert self.spec is not None
        merge = self.spec.merge
        update: dict[str, str] = {}
        if merge.enabled:
            update["merged_model_uri"] = self.spec.output.uri
        if merge.write_adapter:
            update["adapter_uri"] = adapter_uri(self.spec)
        self.st.outputs = (self.st.outputs or Outputs()).model_copy(update=update)
        if merge.enabled:
            said = f"merged model in {self.spec.output.uri}"
            if merge.write_adapter:
                said += f"; adapter in {adapter_uri(self.spec)}"
            self.condition(MERGED, "True", "Merged", said)
        else:
            self.condition(MERGED, "True", "AdapterExported", f"adapter exported to {adapter_uri(self.spec)}")
        if self.spec.evaluation is not None:
            self.start_evaluation()
        else:
            self.succeed(self.outputs_said(), self.outputs_short())

    def outputs_said(self) -> str:
        assert self.spec is not None
        if self.spec.merge.enabled:
            said = f"merged model written to {self.spec.output.uri}"
            return said + (f"; adapter to {adapter_uri(self.spec)}" if self.spec.merge.write_adapter else "")
        return f"adapter exported to {adapter_uri(self.spec)} (spec.merge.enabled is false: no merged model)"

    def outputs_short(self) -> str:
        assert self.spec is not None
        if self.spec.merge.enabled:
            return ev.merged(self.spec.output.uri)
        return ev.adapter_exported(adapter_uri(self.spec))

    # --- evaluation -----------------------------------------------------------------------------------

    def eval_job(self) -> JobView | None:
        name = m.eval_job_name(self.o.name)
        return next((j for j in self.o.jobs if j.name == name), None)

    def start_evaluation(self) -> None:
        assert self.spec is not None and self.spec.evaluation is not None
        e = self.spec.evaluation
        dataset = e.dataset_uri or self.spec.dataset.eval_uri
        self.st.phase = FineTunePhase.EVALUATING
        self.condition(
            EVALUATED,
            "False",
            "Evaluating",
            f"scoring the adapter and the base model ({', '.join(e.metrics)}) on up to {e.max_examples} records "
            f"of {dataset} on {e.slice}",
        )
        self.event("Normal", ev.EVALUATING, ev.evaluating(e.slice))
        self.plan.create.extend(m.eval_objects(self.owner, self.spec))

    def evaluating(self) -> None:
        assert self.spec is not None
        job = self.eval_job()
        if self.spec.evaluation is None:
            # The evaluation was taken out of the spec while it ran: there is nothing left to wait for.
            if job is not None and self.live(job):
                self.delete_job(job)
            self.condition(EVALUATED, "False", "NotEvaluated", "spec.evaluation was removed before it finished")
            self.succeed(self.outputs_said() + "; not evaluated (spec.evaluation was removed)", self.outputs_short())
            return
        if job is None:
            self.plan.create.extend(m.eval_objects(self.owner, self.spec))
            return
        if job.deleting:
            return  # someone removed it: it is recreated once it is gone
        pods = self.pods_of(job)
        done = next((p for p in pods if p.phase == "Succeeded"), None)
        if done is not None:
            self.evaluated(job, done)
            return
        failures = [e for e in (pod_ending(p) for p in pods) if e is not None and e.outcome == "Failed"]
        rejected = next((e for e in failures if e.permanent), None)
        if rejected is not None:
            self.evaluation_failed(
                REASON_EVALUATION_FAILED,
                f"the evaluation Job {job.name} failed: {rejected.message}; not retried: fix the spec and create "
                "the job again",
                rejected.message,
            )
        elif job.failed:
            detail = failures[-1].message if failures else job.failure
            # The Job's pod failure policy ends it at the first rejected config (its reason says so), which
            # can be seen before the pod's own ending.
            tries = (
                "at once (a rejected config)"
                if job.failure.startswith("PodFailurePolicy")
                else (f"after {m.EVAL_BACKOFF_LIMIT + 1} tries")
            )
            self.evaluation_failed(
                REASON_EVALUATION_FAILED, f"the evaluation Job {job.name} failed {tries}; last: {detail}", detail
            )
        elif job.complete and not any(not p.terminal for p in pods):
            self.evaluation_failed(
                "EvaluationResultMissing",
                f"the evaluation Job {job.name} completed but its pod is gone, and with it the result (its "
                "termination message); delete the Job to run the evaluation again",
                "the evaluation pod is gone",
            )
        else:
            running = next((p for p in pods if p.phase == "Running" and not p.deleting), None)
            if running is not None:
                where = f" on node {running.node_name}" if running.node_name else ""
                self.condition(EVALUATED, "False", "Evaluating", f"pod {running.name} is evaluating{where}")

    def evaluated(self, job: JobView, pod: PodView) -> None:
        """The `score` container's result: record it, say the verdict, and end the job Succeeded either way
        (its outputs are fine; whether the adapter is promoted is the EvaluationPassed condition's business)."""
        assert self.spec is not None and self.spec.evaluation is not None
        try:
            result = eval_result(pod)
        except ValueError as exc:
            self.evaluation_failed(
                "EvaluationResultUnreadable",
                f"the evaluation Job {job.name} finished, but its result cannot be read: {exc}",
                str(exc),
                ev.eval_unreadable(),
            )
            return
        found = checks(self.spec.evaluation, result.metrics)
        passed, verdict = evaluation_verdict(self.spec.evaluation, result.metrics)
        report = result.report_uri or output_subdir(self.spec, EVALUATION_SUBDIR)
        self.st.evaluation = result.model_copy(
            update={
                "passed": passed,
                "result": "Passed" if passed else "Failed",
                "message": verdict,
                "report_uri": report,
            }
        )
        examples = f"{result.examples} records" if result.examples is not None else "the records"
        self.condition(EVALUATED, "True", "Evaluated", f"{examples} scored; report in {report}")
        if passed:
            self.condition(EVALUATION_PASSED, "True", "Passed", verdict)
            self.event("Normal", ev.EVALUATED, ev.eval_passed(result.metrics, result.base_metrics))
        else:
            self.condition(EVALUATION_PASSED, "False", "BelowThreshold", verdict)
            self.event("Warning", ev.EVALUATED, ev.eval_below(next((c for c in found if not c.passed), None)))
        outcome = "evaluation passed" if passed else "evaluation below threshold"
        self.succeed(f"{self.outputs_said()}; {outcome}: {verdict}", self.outputs_short())

    def evaluation_failed(self, reason: str, message: str, detail: str, short: str | None = None) -> None:
        self.condition(EVALUATED, "False", REASON_EVALUATION_FAILED, detail)
        self.fail(reason, message, short or ev.eval_failed())

    def succeed(self, message: str, short: str) -> None:
        """`message` for the condition; `short`, one describe line, for the Event."""
        st = self.st
        st.phase = FineTunePhase.SUCCEEDED
        st.completion_time = self.stamp
        self.condition(SUCCEEDED, "True", "Succeeded", message)
        self.event("Normal", ev.SUCCEEDED, short)
        self.expire()

    def fail(self, reason: str, message: str, short: str) -> None:
        """The condition carries `reason` and the whole `message`; the Event says `short` in one line."""
        st = self.st
        st.phase = FineTunePhase.FAILED
        st.completion_time = self.stamp
        self.condition(FAILED, "True", reason, message)
        self.event("Warning", ev.FAILED, short)
        self.stop_children()
        self.expire()

    def finished(self) -> None:
        self.stop_children()
        self.expire()

    def expire(self) -> None:
        """ttlSecondsAfterFinished: the operator deletes the finished object (children go with it)."""
        try:
            policy = RunPolicy.model_validate(self.o.spec.get("runPolicy") or {})
        except ValidationError:
            return
        ttl = policy.ttl_seconds_after_finished
        if ttl is None or self.st.completion_time is None:
            return
        left = ttl - (self.now - parse_time(self.st.completion_time)).total_seconds()
        if left <= 0:
            self.plan.delete_self = True
        else:
            self.plan.requeue(left)

    # --- derived status -------------------------------------------------------------------------------

    def derive(self) -> None:
        """percent, etaSeconds and cost, from the trainer's progress and the attempts' TPU time."""
        st = self.st
        if st.progress is not None and st.progress.step is not None and st.progress.total_steps:
            done = min(st.progress.step, st.progress.total_steps) / st.progress.total_steps
            # The trainer's ETA comes from its recent rate; the average since the attempt began (model
            # loading and compilation included) only stands in for a trainer that has not given one.
            eta = st.progress.eta_seconds
            if st.phase == FineTunePhase.TRAINING and eta is None:
                eta = eta_seconds(st)
            if st.phase in (FineTunePhase.MERGING, FineTunePhase.EVALUATING, FineTunePhase.SUCCEEDED):
                eta = 0
            st.progress = st.progress.model_copy(
                update={"percent": round(100 * done, 1), "eta_seconds": eta}
            ).displayed()
        slice_id = self.spec.tpu.slice if self.spec is not None else self.o.spec.get("tpu", {}).get("slice")
        if not st.attempts or slice_id is None:
            return
        try:
            price = tpu_slice(slice_id).usd_per_hour
        except KeyError:
            return
        hours = round(tpu_hours(st.attempts, self.now), TPU_HOURS_DIGITS)
        st.cost = Cost.estimate(hours, price)


def _unknown_last(host: int | None) -> int:
    return host if host is not None else 1 << 30


def _host_order(pod: PodView) -> tuple[int, str]:
    return (_unknown_last(pod.host), pod.name)


def plan(o: Observed, now: datetime) -> Plan:
    """The status `o` should have at `now`, and the creates, deletes and Events that get it there."""
    planner = _Planner(o, now)
    planner.run()
    return planner.plan


# Status fields the operator writes. `progress` belongs to the trainer except the derived keys.
OWNED_FIELDS = (
    "phase",
    "conditions",
    "observedGeneration",
    "restarts",
    "attempt",
    "attempts",
    "startTime",
    "completionTime",
    "outputs",
    "evaluation",
    "cost",
)
DERIVED_PROGRESS_FIELDS = ("percent", "percentDisplay", "etaSeconds", "etaDisplay")


def status_patch(current: FineTuneJobStatus, desired: FineTuneJobStatus) -> Obj:
    """The JSON merge patch from `current` to `desired` over the operator's fields only (empty: no change)."""
    cur = current.model_dump(mode="json", by_alias=True, exclude_none=True)
    new = desired.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch: Obj = {k: new.get(k) for k in OWNED_FIELDS if cur.get(k) != new.get(k)}
    cur_p, new_p = cur.get("progress") or {}, new.get("progress") or {}
    derived = {k: new_p.get(k) for k in DERIVED_PROGRESS_FIELDS if cur_p.get(k) != new_p.get(k)}
    if derived:
        patch["progress"] = derived
    return patch
