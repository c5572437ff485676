"""Kubernetes-style status conditions, shared by both kinds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from tpuforge.api.base import StatusModel

ConditionStatus = Literal["True", "False", "Unknown"]


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class Condition(StatusModel):
    type: str = Field(description="Condition type, e.g. Ready, Training, Merged, Failed.")
    status: ConditionStatus
    reason: str = Field(default="", description="One CamelCase word a machine can match on.")
    message: str = Field(default="", description="What happened and what to do, for a person.")
    last_transition_time: str | None = None
    observed_generation: int | None = None


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: str | None = None,
) -> list[Condition]:
    """Return conditions with `type_` set; the transition time moves only when the status changes."""
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type != type_:
            out.append(c)
            continue
        found = True
        changed = c.status != status
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=(now or now_rfc3339()) if changed else c.last_transition_time,
                observed_generation=generation,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now or now_rfc3339(),
                observed_generation=generation,
            )
        )
    return out
