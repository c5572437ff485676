"""The FineTuneJob's phase edges: one table (phase, edge) -> Transition, and `move`, the one function that
changes `status.phase`. A Transition is one value: the phase it leads to, the condition that explains it (type,
status, reason) and the Event that reports it. The texts (the condition's message, the Event's line) live in
tpuforge.api.finetune_reasons and finetune/events; the named steps in finetune/transitions compute them and add
what else a change records (the attempt, the times, the Jobs stopped).

    from                                   edge                    to
    (new)                                  taken-up                Pending
    (new), Suspended, Preflight, ...       preflight               Preflight
    (new), Preflight, Pending, Training    attempt                 Pending (attempt n: the first, or the next)
    Pending                                training                Training
    Pending, Training                      merging | exporting     Merging
    Merging; Succeeded, Failed (rerun)     evaluating              Evaluating
    Preflight, Pending, Training, ...      queued                  Queued (its Job waits for Kueue)
    Queued                                 admitted-to-<stage>     the stage its Job waited in
    (new), Preflight, Pending, Training    suspended               Suspended
    Suspended                              resumed                 Pending
    Pending, Training                      trained-only            Succeeded (spec.merge exports nothing)
    Merging                                exported                Succeeded
    Evaluating                             evaluated               Succeeded (a verdict, or none: outputs kept)
    any phase not ended                    invalid-spec, deadline-exceeded, does-not-fit, preflight-failed,
                                           attempt-rejected, too-many-preemptions, training-failed,
                                           merge-failed            Failed
    (new), Pending, Preflight, Queued      no-model                Failed (spec.model.fineTuneJobRef gives none)

Where a stage's step runs while its Job waits in Kueue (Queued), that stage's edges leave Queued too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tpuforge.api import FineTunePhase
from tpuforge.api import finetune_reasons as c
from tpuforge.api.conditions import ConditionStatus
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.context import Base

log = logging.getLogger(__name__)

P = FineTunePhase

Edge = Literal[
    "taken-up",
    "preflight",
    "attempt",
    "training",
    "merging",
    "exporting",
    "evaluating",
    "queued",
    "admitted-to-preflight",
    "admitted-to-pending",
    "admitted-to-merging",
    "admitted-to-evaluating",
    "suspended",
    "resumed",
    "trained-only",
    "exported",
    "evaluated",
    "invalid-spec",
    "deadline-exceeded",
    "does-not-fit",
    "preflight-failed",
    "attempt-rejected",
    "too-many-preemptions",
    "training-failed",
    "merge-failed",
    "no-model",
]


@dataclass(frozen=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str | None  # None: the cause's own (Kueue's reason for holding a Job; why a preflight or attempt ended)


@dataclass(frozen=True)
class Notice:
    """The Event a transition posts (its line is the caller's, from finetune/events)."""

    type: str  # Normal or Warning
    reason: str


@dataclass(frozen=True)
class Transition:
    phase: FineTunePhase
    condition: Condition | None = None
    event: Notice | None = None


# A phase is None until the controller has taken the job up.
Phase = FineTunePhase | None
NOT_ENDED: tuple[Phase, ...] = (
    None,
    P.PREFLIGHT,
    P.PENDING,
    P.TRAINING,
    P.QUEUED,
    P.MERGING,
    P.EVALUATING,
    P.SUSPENDED,
)
# Where a training attempt is under way (or its Job waits in Kueue).
ATTEMPT: tuple[Phase, ...] = (P.PENDING, P.TRAINING, P.QUEUED)

_PENDING = Transition(P.PENDING, Condition(c.TRAINING, "False", c.PENDING))
_ADMITTED = Condition(c.QUEUED, "False", c.ADMITTED)
_ADMITTED_EVENT = Notice("Normal", ev.ADMITTED)
_MERGING_EVENT = Notice("Normal", ev.MERGING)
_SUCCEEDED = Transition(P.SUCCEEDED, Condition(c.SUCCEEDED, "True", c.SUCCEEDED_REASON), Notice("Normal", ev.SUCCEEDED))
_FAILED_EVENT = Notice("Warning", ev.FAILED)


def _failed(reason: str | None) -> Transition:
    return Transition(P.FAILED, Condition(c.FAILED, "True", reason), _FAILED_EVENT)


# (from phases, edge, transition): each edge written once.
_EDGES: tuple[tuple[tuple[Phase, ...], Edge, Transition], ...] = (
    ((None,), "taken-up", Transition(P.PENDING)),
    (
        (None, P.PREFLIGHT, P.PENDING, P.QUEUED, P.SUSPENDED),
        "preflight",
        Transition(P.PREFLIGHT, Condition(c.PREFLIGHT, "False", c.COMPILING), Notice("Normal", ev.PREFLIGHT)),
    ),
    ((None, P.PREFLIGHT, *ATTEMPT), "attempt", _PENDING),
    (
        (P.PENDING, P.QUEUED),
        "training",
        Transition(P.TRAINING, Condition(c.TRAINING, "True", c.RUNNING), Notice("Normal", ev.TRAINING)),
    ),
    (ATTEMPT, "merging", Transition(P.MERGING, Condition(c.MERGED, "False", c.MERGING), _MERGING_EVENT)),
    (ATTEMPT, "exporting", Transition(P.MERGING, Condition(c.MERGED, "False", c.EXPORTING), _MERGING_EVENT)),
    (
        (P.MERGING, P.QUEUED, P.SUCCEEDED, P.FAILED),
        "evaluating",
        Transition(P.EVALUATING, Condition(c.EVALUATED, "False", c.EVALUATING), Notice("Normal", ev.EVALUATING)),
    ),
    (
        (None, P.PREFLIGHT, P.PENDING, P.TRAINING, P.MERGING, P.EVALUATING),
        "queued",
        Transition(P.QUEUED, Condition(c.QUEUED, "True", None), Notice("Normal", ev.QUEUED)),
    ),
    ((P.QUEUED,), "admitted-to-preflight", Transition(P.PREFLIGHT, _ADMITTED, _ADMITTED_EVENT)),
    ((P.QUEUED,), "admitted-to-pending", Transition(P.PENDING, _ADMITTED, _ADMITTED_EVENT)),
    ((P.QUEUED,), "admitted-to-merging", Transition(P.MERGING, _ADMITTED, _ADMITTED_EVENT)),
    ((P.QUEUED,), "admitted-to-evaluating", Transition(P.EVALUATING, _ADMITTED, _ADMITTED_EVENT)),
    (
        (None, P.PREFLIGHT, *ATTEMPT),
        "suspended",
        Transition(P.SUSPENDED, Condition(c.SUSPENDED, "True", c.SUSPENDED_REASON), Notice("Normal", ev.SUSPENDED)),
    ),
    (
        (P.SUSPENDED,),
        "resumed",
        Transition(P.PENDING, Condition(c.SUSPENDED, "False", c.RESUMED), Notice("Normal", ev.RESUMED)),
    ),
    (ATTEMPT, "trained-only", _SUCCEEDED),
    ((P.MERGING, P.QUEUED), "exported", _SUCCEEDED),
    ((P.EVALUATING, P.QUEUED), "evaluated", _SUCCEEDED),
    (NOT_ENDED, "invalid-spec", _failed(c.INVALID_SPEC)),
    (NOT_ENDED, "deadline-exceeded", _failed(c.DEADLINE_EXCEEDED)),
    ((None, P.PREFLIGHT, P.QUEUED), "does-not-fit", _failed(c.DOES_NOT_FIT)),
    ((None, P.PREFLIGHT, P.QUEUED), "preflight-failed", _failed(None)),
    (ATTEMPT, "attempt-rejected", _failed(None)),
    (ATTEMPT, "too-many-preemptions", _failed(c.TOO_MANY_PREEMPTIONS)),
    (ATTEMPT, "training-failed", _failed(c.TRAINING_FAILED)),
    ((P.MERGING, P.QUEUED), "merge-failed", _failed(c.MERGE_FAILED)),
    ((None, P.PENDING, P.PREFLIGHT, P.QUEUED), "no-model", _failed(None)),
)


def _table(edges: Iterable[tuple[tuple[Phase, ...], Edge, Transition]]) -> dict[tuple[Phase, Edge], Transition]:
    table: dict[tuple[Phase, Edge], Transition] = {}
    for sources, edge, transition in edges:
        for phase in sources:
            if (phase, edge) in table:
                raise ValueError(f"edge {edge!r} from {phase} written twice")
            table[phase, edge] = transition
    return table


TABLE: dict[tuple[Phase, Edge], Transition] = _table(_EDGES)
# Each edge leads to one transition, whatever phase it leaves.
BY_EDGE: dict[Edge, Transition] = {edge: transition for _, edge, transition in _EDGES}
ADMITTED_TO: dict[FineTunePhase, Edge] = {
    P.PREFLIGHT: "admitted-to-preflight",
    P.PENDING: "admitted-to-pending",
    P.MERGING: "admitted-to-merging",
    P.EVALUATING: "admitted-to-evaluating",
}


def lookup(phase: Phase, edge: Edge) -> Transition:
    """The transition `edge` makes from `phase`. An edge the table does not list from that phase is logged and
    taken as the edge says (each edge has one transition), so that a path the table missed never wedges a
    job."""
    found = TABLE.get((phase or None, edge))
    if found is None:
        unlisted(phase, edge)
        return BY_EDGE[edge]
    return found


def unlisted(phase: Phase, edge: Edge) -> None:
    """An edge taken from a phase the table does not list it from (the unit tests make this an error)."""
    log.warning("phase edge %r from %s is not in the table", edge, phase)


def move(b: Base, edge: Edge, message: str = "", short: str = "", reason: str | None = None) -> None:
    """The one phase change: set the phase `edge` leads to, its condition (`message`; `reason` where the table
    leaves it to the cause) and its Event (`short`, one describe line)."""
    t = lookup(b.st.phase, edge)
    b.st.phase = t.phase
    if t.phase != P.QUEUED:
        b.st.queued_stage = None  # kept only while Queued (transitions.to_queued stores it)
    if t.condition is not None:
        said = t.condition.reason or reason
        assert said is not None, f"edge {edge!r} needs the cause's reason"
        b.condition(t.condition.type, t.condition.status, said, message)
    if t.event is not None:
        b.event(t.event.type, t.event.reason, short)


def restate(b: Base, edge: Edge, message: str, reason: str | None = None) -> None:
    """The condition of `edge`, already taken, said again with what is current (e.g. Kueue's latest reason
    while the job stays Queued); the phase and the Event stay."""
    t = BY_EDGE[edge]
    assert t.condition is not None
    said = t.condition.reason or reason
    assert said is not None
    b.condition(t.condition.type, t.condition.status, said, message)
