"""The in-training eval losses of a run, by step, in a small JSON file beside its checkpoints.

The trainer evaluates after saving a step (Tunix's order), so a loss is known only once its checkpoint is on
its way, too late for Orbax's own metrics (passed to save()). The losses go here instead, rewritten whole
after each evaluation (one object: a reader sees the old file or the new one). From them the trainer keeps
the best step from deletion (train/checkpoints.py) and decides early stopping, and the merge finds the best
step of a finished run (`best_finished_step`).

    {"losses": {"100": 1.234, "200": 1.198, ...}}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from tpuforge_workloads import storage

EVAL_RECORD_FILE = "eval_losses.json"

log = logging.getLogger(__name__)


@dataclass
class EvalRecord:
    losses: dict[int, float] = field(default_factory=dict)

    def add(self, step: int, loss: float) -> None:
        self.losses[step] = loss

    def drop_after(self, step: int) -> None:
        """Forget evaluations past `step`: a resumed run trains (and evaluates) them again."""
        self.losses = {s: v for s, v in self.losses.items() if s <= step}

    def best(self, among: Iterable[int] | None = None) -> tuple[int, float] | None:
        """(step, loss) of the lowest loss, the earlier step on a tie; only `among` steps when given."""
        steps = sorted(self.losses if among is None else set(among) & set(self.losses))
        if not steps:
            return None
        step = min(steps, key=lambda s: (self.losses[s], s))
        return step, self.losses[step]

    def evals_without_improvement(self, min_delta: float) -> int:
        """Evaluations in a row, up to the last, none of which beat the best loss before it by more than
        `min_delta`."""
        reference: float | None = None
        since = 0
        for step in sorted(self.losses):
            loss = self.losses[step]
            if reference is None or loss < reference - min_delta:
                reference, since = loss, 0
            else:
                since += 1
        return since

    def to_json(self) -> str:
        return json.dumps({"losses": {str(s): v for s, v in sorted(self.losses.items())}})

    @classmethod
    def from_json(cls, text: str) -> EvalRecord:
        raw = json.loads(text)
        return cls({int(s): float(v) for s, v in (raw.get("losses") or {}).items()})


def record_uri(checkpoint_uri: str) -> str:
    return storage.join(checkpoint_uri, EVAL_RECORD_FILE)


def read(checkpoint_uri: str) -> EvalRecord:
    """The run's record; empty when there is none (no eval set, or no evaluation yet) or it is unreadable."""
    uri = record_uri(checkpoint_uri)
    try:
        if not storage.is_file(uri):
            return EvalRecord()
        return EvalRecord.from_json(storage.read_text(uri))
    except (storage.StorageError, ValueError, AttributeError) as e:
        log.warning("eval record %s unreadable (%s); treating it as empty", uri, e)
        return EvalRecord()


def write(checkpoint_uri: str, record: EvalRecord) -> None:
    storage.write_text(record_uri(checkpoint_uri), record.to_json())


def best_finished_step(checkpoint_uri: str, finished: Iterable[int]) -> tuple[int, float] | None:
    """The finished step with the lowest recorded eval loss, or None when none of them was evaluated."""
    return read(checkpoint_uri).best(finished)
