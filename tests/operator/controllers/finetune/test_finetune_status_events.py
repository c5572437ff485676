"""Every Event the FineTuneJob controller posts fits one line of `kubectl describe` on an 80-column terminal.

The messages come from two places: every lifecycle in test_finetune_status_plan, _multihost, _evaluation,
_preflight and _queue (the planner's real Events),
and each message builder fed the longest inputs it can meet (GKE node names, gs:// URIs, many fields, large
step numbers). They are laid out as `kubectl describe` lays out its Events table, with every reason present
(so the Reason column is at its widest) and the widest age."""

from __future__ import annotations

import pytest

from tests.fixtures.finetune.events import NODE, flow_events, worst_cases
from tpuforge.api.constants import EVENT_COMPONENT
from tpuforge.api.evaluation import Check
from tpuforge.controllers.finetune import events as ev


def describe_events(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    """The Events table as `kubectl describe` prints it: a tab writer pads each column to its widest cell
    plus 2, and the first cell of every row carries a 2-space indent (the header's too)."""
    table = [("  Type", "Reason", "Age", "From", "Message"), ("  ----", "------", "----", "----", "-------")]
    table += [("  " + t, r, a, f, m) for t, r, a, f, m in rows]
    widths = [max(len(row[i]) for row in table) + 2 for i in range(4)]
    return ["".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + row[4] for row in table]


def test_the_room_is_what_describe_leaves() -> None:
    widest = max(ev.REASONS, key=len)
    line = describe_events([("Warning", widest, "9m59s", EVENT_COMPONENT, "x" * ev.MESSAGE_ROOM)])[-1]
    assert len(line) == 80
    assert ev.MESSAGE_ROOM >= 40  # short reasons and a short component leave room for a node name


def test_every_event_fits_one_line_of_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    events = flow_events(monkeypatch)
    assert {e.reason for e in events} == set(ev.REASONS), "a reason is never exercised, or is not in REASONS"
    messages = [(e.type, e.message) for e in events] + [("Warning", m) for m in worst_cases()]
    # Every reason in the table at once: the Reason column at its widest.
    rows = [("Normal", r, "9m59s", EVENT_COMPONENT, "") for r in ev.REASONS]
    rows += [(t, "Failed", "1s", EVENT_COMPONENT, m) for t, m in messages]
    too_long = [line for line in describe_events(rows) if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    assert all(m.strip() == m and m.split()[-1] not in ("of", "on", "in", "invalid") for _, m in messages)


def test_short_names_keep_their_end() -> None:
    message = ev.preempted(0, NODE)
    assert message.startswith("attempt 0 preempted on ...") and message.endswith("3f2a1b2c-k9xz")
    assert ev.preempted(0, "tpu-node") == "attempt 0 preempted on tpu-node"
    assert ev.resuming(2, 400, 23) == "attempt 2 from step 400, 23 steps lost"


def test_the_evaluation_headline_shows_the_gain_over_the_base() -> None:
    metrics, base = {"exactMatch": 1.0, "loss": 0.1234}, {"exactMatch": 0.0, "loss": 3.5}
    assert ev.eval_passed(metrics, base) == "eval passed: em 1.00 (base 0.00)"
    assert ev.eval_passed({"loss": 0.1234}, {"loss": 3.5}) == "eval passed: loss 0.1234 (base 3.5)"
    assert ev.eval_below(Check("loss", "maxLoss", 0.5, 0.75, False)) == "eval below threshold: loss 0.75 > 0.5"


def test_pass_at_k_leads_the_evaluation_headline() -> None:
    metrics, base = {"loss": 0.12, "pass@5": 1.0, "pass@1": 0.8}, {"loss": 3.5, "pass@5": 0.0, "pass@1": 0.0}
    assert ev.eval_passed(metrics, base).startswith("eval passed: pass@1 0.80 (base 0.00)")
    below = Check("pass@1", "minPassAt.1", 0.6, 0.2, False)
    assert ev.eval_below(below) == "eval below threshold: pass@1 0.20 < 0.60"
