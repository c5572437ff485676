"""Event texts that fit one line of `kubectl describe` on an 80-column terminal, for both kinds.

`kubectl describe` prints Events as a table through a tab writer that pads each column to its widest cell plus
two spaces, after a two-space indent:

      Type     Reason      Age    From      Message
      ----     ------      ----   ----      -------
      Warning  Preempted   5m10s  tpuforge  attempt 0 preempted on ...pool-3f2a1b2c-k9xz

So the room left for the message is 80 less the indent, the widest Type ("Warning"), the widest Reason the
operator can post about the object (every Event on it shares the column), the widest Age (five characters cover
any age under two years: 9m59s, 7d23h, 729d; Events here are posted once, never counted up) and the From column
(the Event's source component). Messages are built to fit that room: a name that would overflow keeps its end,
which is the part that tells nodes and pods apart; the full names are in the object's status and conditions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tpuforge.api.constants import EVENT_COMPONENT

DESCRIBE_WIDTH = 80
INDENT = 2
PADDING = 2
AGE_WIDTH = 5
ELLIPSIS = "..."
MIN_NAME = 8  # shorter than this, a shortened name says nothing: leave it out instead


def room(reasons: Iterable[str], component: str = EVENT_COMPONENT) -> int:
    """Characters left for an Event message on one `kubectl describe` line, with `reasons` in the Reason column."""
    type_col = INDENT + len("Warning") + PADDING
    reason_col = max(len("Reason"), *map(len, reasons)) + PADDING
    age_col = max(len("Age"), AGE_WIDTH) + PADDING
    from_col = max(len("From"), len(component)) + PADDING
    return DESCRIBE_WIDTH - type_col - reason_col - age_col - from_col


@dataclass(frozen=True)
class DescribeLine:
    """The message room of one kind's Events (`reasons`: every reason it posts), and texts fitted to it."""

    room: int

    @classmethod
    def of(cls, reasons: Iterable[str]) -> DescribeLine:
        return cls(room(reasons))

    def fit(self, *candidates: str, name: str = "") -> str:
        """The first candidate that fits the room. In each, `{name}` stands for `name`, shortened from the left
        when that makes the candidate fit (and at least MIN_NAME characters of it remain). If none fits, the
        last one, clipped."""
        for text in candidates:
            full = text.replace("{name}", name)
            if len(full) <= self.room:
                return full
            if "{name}" in text:
                left = self.room - (len(text) - len("{name}")) - len(ELLIPSIS)
                if left >= MIN_NAME:
                    return text.replace("{name}", ELLIPSIS + name[-left:])
        last = candidates[-1].replace("{name}", name)
        return last[: self.room - len(ELLIPSIS)] + ELLIPSIS
