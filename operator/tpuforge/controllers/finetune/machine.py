"""The FineTuneJob's state machine: which step follows which. Each phase's step returns an outcome (or None:
it stays); this table alone says what begins next, in the same reconcile. No phase module starts another. The
phase changes themselves are edges of the one table in finetune/edges.py.

    phase       outcome               next (what begins)
    Preflight   fits                  Pending: the first attempt (attempts.step)
    Suspended   resume-to-preflight   Preflight (preflight.step)
    Suspended   resume                Pending: the next attempt, from the last checkpoint (attempts.create)
    Training    trained               Merging (merge.begin)
    Merging     nothing-to-export     Succeeded: spec.merge exports nothing (the checkpoint is the output)
    Merging     exported              Evaluating (evaluation.begin) with spec.evaluation, else Succeeded

Within a phase: Pending <-> Training and a new attempt after a preemption or a retried failure (attempts);
any phase -> Failed (transitions.to_failed, where the phase finds it); Preflight, Pending, Merging and
Evaluating <-> Queued (queue); Pending or Training -> Suspended (suspend.stop) when spec.runPolicy.suspend. Each
of these is an edge of finetune/edges.py, taken through edges.move.
"""

from __future__ import annotations

from collections.abc import Callable

from tpuforge.api import FineTunePhase
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import attempts as attempts
from tpuforge.controllers.finetune import evaluation as evaluation
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune import merge as merge
from tpuforge.controllers.finetune import preflight as preflight
from tpuforge.controllers.finetune import queue as queue
from tpuforge.controllers.finetune import suspend as suspend
from tpuforge.controllers.finetune.context import Ctx
from tpuforge.controllers.finetune.outcomes import Name, Outcome
from tpuforge.controllers.finetune.transitions import to_exported, to_succeeded


def step(ctx: Ctx) -> None:
    """The current phase's step (while Queued, that of the stage its Job waits in), then whatever its outcome
    begins, until a phase stays."""
    outcome = current(ctx)
    while outcome is not None:
        outcome = NEXT[outcome.name](ctx, outcome)


def current(ctx: Ctx) -> Outcome | None:
    phase = queue.stage(ctx)
    if phase == FineTunePhase.MERGING:
        return merge.step(ctx)
    if phase == FineTunePhase.EVALUATING:
        evaluation.step(ctx)
        return None
    if phase == FineTunePhase.SUSPENDED:
        return suspend.step(ctx, preflight.needed(ctx))
    if ctx.spec.run_policy.suspend:
        preflight.stop(ctx, c.SUSPENDED_REASON, c.SUSPEND_SET)
        suspend.stop(ctx)
        return None
    if preflight.needed(ctx):
        return preflight.step(ctx)
    preflight.stop(ctx)  # one switched off while it ran
    return attempts.step(ctx)


def _first_attempt(ctx: Ctx, _: Outcome) -> Outcome | None:
    return attempts.step(ctx)


def _preflight(ctx: Ctx, _: Outcome) -> Outcome | None:
    return preflight.step(ctx)


def _next_attempt(ctx: Ctx, _: Outcome) -> Outcome | None:
    assert ctx.st.attempt is not None  # suspend counted it
    attempts.create(ctx, ctx.st.attempt)
    return None


def _merge(ctx: Ctx, outcome: Outcome) -> Outcome | None:
    return merge.begin(ctx, outcome.result)


def _trained_only(ctx: Ctx, _: Outcome) -> Outcome | None:
    to_succeeded(ctx, "trained-only", c.trained_only(ctx.spec.checkpoint.uri), ev.trained_only())
    return None


def _after_export(ctx: Ctx, _: Outcome) -> Outcome | None:
    if ctx.spec.evaluation is not None:
        evaluation.begin(ctx)
    else:
        to_exported(ctx, "exported")
    return None


NEXT: dict[Name, Callable[[Ctx, Outcome], Outcome | None]] = {
    "fits": _first_attempt,
    "resume-to-preflight": _preflight,
    "resume": _next_attempt,
    "trained": _merge,
    "nothing-to-export": _trained_only,
    "exported": _after_export,
}
