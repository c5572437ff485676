"""What a FineTuneJob's children say, reduced to the few facts the decisions need, and how a finished
training pod's ending is read: success, preemption (resume from a checkpoint) or failure (retry or give up).

Pure: the views are built from raw API objects and compared by value, so the operator keeps them in its
watch indices and the decision logic is tested on plain values.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tpuforge.api import AttemptStatus
from tpuforge.api import finetune_reasons as r
from tpuforge.api.constants import (
    EXIT_BAD_CONFIG,
    EXIT_PREEMPTED,
    JOB_COMPLETION_INDEX,
    JOBSET_KIND,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_JOBSET_NAME,
    TERMINATION_PREEMPTED,
)
from tpuforge.manifests.finetune_training import SPEC_KEY

Raw = Mapping[str, Any]

# Pod-level reasons that mean the pod was taken away rather than the trainer failing: kubelet or API
# eviction, node loss, graceful node shutdown (a Spot VM being reclaimed), scheduler preemption.
PREEMPTION_POD_REASONS = frozenset(
    {"Evicted", "NodeLost", "Shutdown", "NodeShutdown", "Terminated", "Preempting", "TerminationByKubelet"}
)
MESSAGE_LIMIT = 1000  # status messages and Events stay readable in `kubectl describe`
# A kubelet eviction (status.reason Evicted) that the pod brought on itself, by the phrases of the kubelet's
# eviction message (pkg/kubelet/eviction/helpers.go): under node pressure, one of its containers (or the pod)
# using more than it requested ("The node was low on resource: memory. ... Container trainer was using 130Gi,
# request is 120Gi, has larger consumption of memory."), or a local-storage limit of its own exceeded (an
# emptyDir's sizeLimit, a container's or the pod's ephemeral-storage limit). Running the pod again does the
# same: a failure, not a preemption. An eviction under pressure that names none of these (the node ran short
# through other pods or the system) is the node's doing, like a drain.
SELF_EVICTION = re.compile(
    r"(Container|Pod) \S+ was using \S+, request is \S+"
    r"|Usage of EmptyDir volume \S+ exceeds the limit"
    r"|exceeded its local ephemeral storage limit"
    r"|Pod ephemeral local storage usage exceeds the total limit"
)


def _attempt(labels: Raw) -> int | None:
    try:
        return int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


def _condition(status: Raw, type_: str, value: str = "True") -> Raw | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == value:
            return dict(cond)
    return None


def _why(reason: str | None, message: str | None) -> str:
    return ": ".join(p for p in ((reason or "").strip(), (message or "").strip()) if p)


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """Keep the end of a long message: a termination log's last lines hold the error."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


@dataclass(frozen=True)
class JobView:
    """A Job, or a JobSet (a multi-host attempt), by what the decisions need of either."""

    name: str
    component: str
    attempt: int | None
    complete: bool
    failed: bool
    failure: str  # the Failed condition's reason and message
    deleting: bool
    kind: str = "Job"
    uid: str = ""  # what its Kueue Workload's owner reference names
    # spec.suspend or the Suspended condition: how Kueue holds a queued Job or JobSet until it admits it.
    suspended: bool = False

    @property
    def finished(self) -> bool:
        return self.complete or self.failed


def _suspended(raw: Raw) -> bool:
    """A Job's or JobSet's spec.suspend (Kueue's webhook sets it on a queued one), or its Suspended condition."""
    return bool((raw.get("spec") or {}).get("suspend")) or _condition(raw.get("status") or {}, "Suspended") is not None


def job_view(raw: Raw) -> JobView:
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    labels = meta.get("labels") or {}
    failed = _condition(status, "Failed")
    return JobView(
        name=meta.get("name", ""),
        component=labels.get(LABEL_COMPONENT, ""),
        attempt=_attempt(labels),
        complete=_condition(status, "Complete") is not None,
        failed=failed is not None,
        failure=_why(failed.get("reason"), failed.get("message")) if failed else "",
        deleting=bool(meta.get("deletionTimestamp")),
        uid=meta.get("uid", ""),
        suspended=_suspended(raw),
    )


def jobset_view(raw: Raw) -> JobView:
    """A JobSet's ending: its Completed or Failed condition (or terminalState, which newer releases set)."""
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    labels = meta.get("labels") or {}
    failed = _condition(status, "Failed")
    terminal = status.get("terminalState")
    return JobView(
        name=meta.get("name", ""),
        component=labels.get(LABEL_COMPONENT, ""),
        attempt=_attempt(labels),
        complete=_condition(status, "Completed") is not None or terminal == "Completed",
        failed=failed is not None or terminal == "Failed",
        failure=_why(failed.get("reason"), failed.get("message")) if failed else "",
        deleting=bool(meta.get("deletionTimestamp")),
        kind=JOBSET_KIND,
        uid=meta.get("uid", ""),
        suspended=_suspended(raw),
    )


@dataclass(frozen=True)
class WorkloadView:
    """A Kueue Workload: the Job or JobSet it queues (its owner's uid), its LocalQueue, and whether Kueue has
    admitted it; if not, why, in Kueue's words (its QuotaReserved condition, else its Admitted one)."""

    name: str
    owner_uid: str
    queue: str
    admitted: bool
    reason: str  # e.g. Pending, Inadmissible
    message: str  # e.g. couldn't assign flavors to pod set main: insufficient unused quota for google.com/tpu ...


def workload_owner_uid(raw: Raw) -> str | None:
    """The uid of the Job or JobSet a Workload stands for: its controller's, which Kueue sets."""
    refs = (raw.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller") and r.get("kind") in ("Job", JOBSET_KIND)), None)


def workload_view(raw: Raw) -> WorkloadView:
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    admitted = _condition(status, "Admitted") is not None
    # Why Kueue holds it: no quota reserved yet (or any more), else admission checks not passed yet.
    held = None if admitted else _condition(status, "QuotaReserved", "False") or _condition(status, "Admitted", "False")
    return WorkloadView(
        name=meta.get("name", ""),
        owner_uid=workload_owner_uid(raw) or "",
        queue=(raw.get("spec") or {}).get("queueName") or "",
        admitted=admitted,
        reason=(held or {}).get("reason") or "",
        message=((held or {}).get("message") or "").strip(),
    )


@dataclass(frozen=True)
class Terminated:
    """The main container's terminated state."""

    exit_code: int
    reason: str
    message: str
    finished_at: str | None


@dataclass(frozen=True)
class PodView:
    name: str
    job_name: str
    component: str
    attempt: int | None
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    node_name: str | None
    start_time: str | None
    running_since: str | None
    deleting: bool
    reason: str  # pod-level status.reason (Evicted, NodeLost, ...)
    message: str
    disruption: str | None  # the DisruptionTarget condition's reason and message
    unschedulable: str | None  # why the scheduler cannot place it
    unschedulable_since: str | None
    terminated: Terminated | None
    host: int | None = None  # a JobSet pod's completion index: which host of the slice it runs on

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def pod_view(raw: Raw) -> PodView:
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    labels = meta.get("labels") or {}
    containers = (raw.get("spec") or {}).get("containers") or [{}]
    main = containers[0].get("name")
    statuses = [c for c in status.get("containerStatuses") or [] if c.get("name") == main]
    state = (statuses[0].get("state") or {}) if statuses else {}
    term = state.get("terminated")
    if term is None:
        # An init container that failed (the evaluation's loss) ends the pod before the main one starts.
        failed_init = [
            t
            for c in status.get("initContainerStatuses") or []
            if (t := (c.get("state") or {}).get("terminated")) and int(t.get("exitCode") or 0) != 0
        ]
        term = failed_init[0] if failed_init else None
    disruption = _condition(status, "DisruptionTarget")
    unschedulable = since = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = _why(cond.get("reason"), cond.get("message")) or "not scheduled yet"
            since = cond.get("lastTransitionTime")
    try:
        host: int | None = int((meta.get("annotations") or {})[JOB_COMPLETION_INDEX])
    except (KeyError, ValueError):
        host = None
    return PodView(
        name=meta.get("name", ""),
        # A JobSet's pods belong to the attempt by the JobSet's name (their Job is the JobSet's child).
        job_name=labels.get(LABEL_JOBSET_NAME) or labels.get("job-name", ""),
        component=labels.get(LABEL_COMPONENT, ""),
        attempt=_attempt(labels),
        phase=status.get("phase") or "Pending",
        node_name=(raw.get("spec") or {}).get("nodeName"),
        start_time=status.get("startTime"),
        running_since=(state.get("running") or {}).get("startedAt"),
        deleting=bool(meta.get("deletionTimestamp")),
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        disruption=(_why(disruption.get("reason"), disruption.get("message")) or "DisruptionTarget")
        if disruption
        else None,
        unschedulable=unschedulable,
        unschedulable_since=since,
        terminated=Terminated(
            exit_code=int(term.get("exitCode") or 0),
            reason=term.get("reason") or "",
            message=term.get("message") or "",
            finished_at=term.get("finishedAt"),
        )
        if term
        else None,
        host=host,
    )


@dataclass(frozen=True)
class ConfigView:
    """A training ConfigMap: the attempt it belongs to and the spec the run started with."""

    name: str
    attempt: int | None
    spec: Mapping[str, Any] | None


def config_view(raw: Raw) -> ConfigView:
    meta = raw.get("metadata") or {}
    text = (raw.get("data") or {}).get(SPEC_KEY)
    try:
        spec = json.loads(text) if text else None
    except ValueError:
        spec = None
    return ConfigView(name=meta.get("name", ""), attempt=_attempt(meta.get("labels") or {}), spec=spec)


Outcome = Literal["Succeeded", "Preempted", "Failed"]


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended. `permanent` failures are not retried (the config itself is rejected)."""

    outcome: Outcome
    reason: str
    message: str
    at: str | None = None
    permanent: bool = False
    # On a multi-host slice: the host (completion index) and node the ending came from.
    host: int | None = None
    node: str | None = None


def self_evicted(pod: PodView) -> bool:
    """The kubelet evicted the pod for its own use (see SELF_EVICTION): its memory or disk beyond its requests or
    limits. The pod-pressure eviction also sets DisruptionTarget (TerminationByKubelet); this tells it apart from
    the node's shutdown, which sets that same reason."""
    return pod.reason == r.EVICTED and SELF_EVICTION.search(pod.message) is not None


def pod_ending(pod: PodView) -> AttemptEnd | None:
    """The ending a terminal pod reports; None while it has not ended."""
    term = pod.terminated
    at = term.finished_at if term else None
    if pod.phase == "Succeeded":
        return AttemptEnd("Succeeded", r.COMPLETED, r.pod_completed(pod.name), at)
    if pod.phase != "Failed":
        return None
    said = clip(term.message) if term else ""
    if self_evicted(pod):
        detail = "; ".join(p for p in (pod.message.strip(), said) if p)
        return AttemptEnd("Failed", r.EVICTED, r.evicted_over_requests(pod.name, clip(detail)), at)
    if pod.disruption is not None:
        detail = "; ".join(p for p in (pod.disruption, said) if p)
        return AttemptEnd("Preempted", r.DISRUPTION_TARGET, r.pod_disrupted(pod.name, clip(detail)), at)
    if pod.reason in PREEMPTION_POD_REASONS:
        detail = "; ".join(p for p in (_why(pod.reason, pod.message), said) if p)
        return AttemptEnd("Preempted", pod.reason, r.pod_stopped(pod.name, clip(detail)), at)
    if term is None:
        return AttemptEnd(
            "Failed", pod.reason or r.POD_FAILED, clip(r.pod_failed(pod.name, _why(pod.reason, pod.message)))
        )
    if term.exit_code == EXIT_PREEMPTED or said.startswith(TERMINATION_PREEMPTED):
        return AttemptEnd("Preempted", r.TRAINER_CHECKPOINTED, r.trainer_checkpointed(pod.name, said), at)
    detail = r.exit_detail(term.reason or r.CONTAINER_ERROR, term.exit_code, said)
    if term.exit_code == EXIT_BAD_CONFIG:
        return AttemptEnd("Failed", r.INVALID_CONFIG, r.config_rejected(pod.name, detail), at, True)
    return AttemptEnd("Failed", term.reason or r.CONTAINER_ERROR, r.pod_exited(pod.name, detail), at)


def host_order(pod: PodView) -> tuple[int, str]:
    """Pods by their host index (unknown last), then name."""
    return (pod.host if pod.host is not None else 1 << 30, pod.name)


def attempt_end(job: JobView, pods: list[PodView], hosts: int, entry: AttemptStatus) -> AttemptEnd | None:
    """How the current attempt (its Job or JobSet and pods) has ended; None while it runs. A pod its status
    `entry` recorded on a node, gone before it ended, was taken away."""
    if hosts > 1:
        return _hosts_end(job, pods, hosts, tuple(entry.pods or ()))
    endings = [e for e in (pod_ending(p) for p in pods) if e is not None]
    done = next((e for e in endings if e.outcome == "Succeeded"), None)
    if done is not None:
        return done
    if endings:
        return endings[-1]
    if job.complete:
        return AttemptEnd("Succeeded", r.COMPLETED, r.job_completed(job.name))
    if job.failed:
        return AttemptEnd("Failed", r.JOB_FAILED, r.job_failed(job.name, job.failure))
    return _gone(pods, (entry.pod_name,) if entry.pod_name else ())


def _gone(pods: list[PodView], recorded: tuple[str, ...]) -> AttemptEnd | None:
    gone = [name for name in recorded if not any(p.name == name for p in pods)]
    if not gone:
        return None
    return AttemptEnd("Preempted", r.POD_DELETED, r.pod_gone(gone[0]))


def _hosts_end(job: JobView, pods: list[PodView], hosts: int, recorded: tuple[str, ...]) -> AttemptEnd | None:
    """A multi-host attempt ends with its first host: a preemption of any host is a preemption of the attempt
    (its peers' errors, or their checkpoint and exit 83, follow from losing it), any other failure of a host is
    a failure, and it succeeds when every host has."""
    pods = sorted(pods, key=host_order)
    ended = [(p, e) for p in pods if (e := pod_ending(p)) is not None]
    failed = next(((p, e) for p, e in ended if e.outcome == "Failed"), None)
    # The evidence of a preemption, best first: the host that was taken away, not a peer that checkpointed.
    taken = [(p, e) for p, e in ended if e.outcome == "Preempted" and e.reason != r.TRAINER_CHECKPOINTED]
    if ended:
        taken += [
            (p, AttemptEnd("Preempted", r.DISRUPTION_TARGET, r.pod_being_disrupted(p.name, p.disruption)))
            for p in pods
            if p.disruption is not None and not p.terminal
        ]
    taken += [(p, e) for p, e in ended if e.reason == r.TRAINER_CHECKPOINTED]
    if taken:
        return _from_host(*taken[0], hosts)
    gone = _gone(pods, recorded)
    if gone is not None:
        return gone
    if failed is not None:
        return _from_host(*failed, hosts)
    if len(ended) >= hosts or job.complete:
        at = ended[-1][1].at if ended else None
        return AttemptEnd("Succeeded", r.COMPLETED, r.hosts_completed(hosts, job.name), at)
    if job.failed:
        return AttemptEnd("Failed", r.JOBSET_FAILED, r.jobset_failed(job.name, job.failure))
    return None


def _from_host(pod: PodView, end: AttemptEnd, hosts: int) -> AttemptEnd:
    """The ending, said as which host it came from: its index in the slice and its node."""
    message = r.from_host(pod.host, hosts, pod.name, pod.node_name, end.message)
    return dataclasses.replace(end, message=message, host=pod.host, node=pod.node_name)
