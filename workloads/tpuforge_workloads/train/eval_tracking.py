"""What the run does with each in-training evaluation: record its loss beside the checkpoints
(eval_record.py), name the best step for the checkpoint manager to keep (checkpoint.select: best), and decide
early stopping (training.earlyStopping).

Every host of a slice evaluates the same global batches and gets the same loss, so each decides the same
stop at the same step; process 0 alone writes the record.
"""

from __future__ import annotations

import logging

from tpuforge.api import EarlyStop, EarlyStoppingSpec, StepLoss
from tpuforge_workloads import storage
from tpuforge_workloads.runtime import eval_record

log = logging.getLogger(__name__)


class EvalTracking:
    def __init__(self, checkpoint_uri: str, early_stopping: EarlyStoppingSpec | None, write: bool):
        self.uri = checkpoint_uri
        self.early_stopping = early_stopping
        self.write = write
        self.record = eval_record.read(checkpoint_uri)
        self.last: StepLoss | None = None
        self.stopped_early: EarlyStop | None = None

    def resumed_at(self, step: int) -> None:
        """Training continues after `step`: evaluations recorded past it (by an attempt whose checkpoint
        there never committed) are redone."""
        self.record.drop_after(step)

    def best(self) -> StepLoss | None:
        found = self.record.best()
        return StepLoss(step=found[0], loss=found[1]) if found else None

    def protected_steps(self) -> list[int]:
        """The best step so far, which the checkpoint manager keeps besides the latest ones."""
        best = self.best()
        return [best.step] if best else []

    def evaluated(self, step: int, loss: float) -> None:
        """An evaluation of the model as of `step` ended. Step 0 (the base model, before training) has no
        checkpoint to select and is not recorded."""
        if step == 0:
            return
        self.last = StepLoss(step=step, loss=loss)
        self.record.add(step, loss)
        if self.write:
            try:
                eval_record.write(self.uri, self.record)
            except storage.StorageError as e:  # the record in memory still guards the best step
                log.warning("eval record not written: %s", e)
        es = self.early_stopping
        if es is None or self.stopped_early is not None:
            return
        without = self.record.evals_without_improvement(es.min_delta)
        if without >= es.patience:
            self.stopped_early = EarlyStop(step=step, evals=without, min_delta=es.min_delta)
            best = self.best()
            log.info(
                "stopping early at step %d: eval loss did not improve by more than %g for %d evals; best step %s",
                step,
                es.min_delta,
                without,
                f"{best.step} (loss {best.loss:.4f})" if best else "-",
            )

    def should_stop(self) -> bool:
        return self.stopped_early is not None
