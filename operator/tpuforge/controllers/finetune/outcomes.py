"""What a phase's step can end in. A phase returns one of these (or None: it stays where it is); which phase
follows is the state machine's business (finetune/machine.py), never the phase's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpuforge.api import TrainResult

Name = Literal["fits", "resume", "resume-to-preflight", "trained", "nothing-to-export", "exported"]


@dataclass(frozen=True)
class Outcome:
    name: Name
    result: TrainResult | None = None  # with "trained": what the trainer reported (None when unread)


FITS = Outcome("fits")  # preflight: the train step fits the slice
RESUME = Outcome("resume")  # suspended: the flag is cleared, the attempt is counted (status.attempt)
RESUME_TO_PREFLIGHT = Outcome("resume-to-preflight")  # suspended before its preflight passed
NOTHING_TO_EXPORT = Outcome("nothing-to-export")  # merge: spec.merge exports nothing
EXPORTED = Outcome("exported")  # merge: the merge Job committed its outputs


def trained(result: TrainResult | None) -> Outcome:
    """Attempts: the training succeeded (to its last step, or stopped early)."""
    return Outcome("trained", result)
