"""Orbax checkpoints of a training run, straight to checkpoint.uri (gs:// or local), every N steps, keeping K.

Each step directory holds these items:

    model_params     nnx.state(model, nnx.LoRAParam): the LoRA adapters only (Tunix PeftTrainer's layout)
    optimizer_state  nnx.state(optimizer, nnx.optimizer.OptState): AdamW moments, schedule and
                     gradient-accumulation counters
    rng_counts       nnx.state(model, nnx.RngCount): where the LoRA dropout stream is (when dropout > 0)
    data_iterator    the Grain iterator's state after the last batch of this step, one JSON file per
                     process (process_<i>-of-<n>.json): on a multi-host slice each process reads its own
                     rows of every batch, and each restores its own position
    rollout          GRPO with several steps per rollout, saved at a step inside a rollout's steps only: the
                     rollout the next steps train on (its rows, advantages and pi_old), as JSON (every process
                     holds the whole rollout; process 0 writes it)

plus Orbax's step metadata with `tokens` (real tokens trained on so far). Restoring them all puts a resumed
run exactly where the interrupted one was: same weights, same optimizer moments, same dropout masks, same
next batch. The class implements what Tunix's PeftTrainer calls on its `checkpoint_manager`.

On a multi-host slice every process runs the same calls at the same steps: Orbax writes each process's
shards of the arrays, process 0 writes the metadata and commits the step once all have written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from flax import nnx

from tpuforge_workloads import storage
from tpuforge_workloads.model.adapter_checkpoint import PARAMS_ITEM, pytree_restore

OPTIMIZER_ITEM = "optimizer_state"
RNG_ITEM = "rng_counts"
DATA_ITEM = "data_iterator"
ROLLOUT_ITEM = "rollout"

log = logging.getLogger(__name__)


def _pytree_save(tree: Any) -> Any:
    return ocp.args.PyTreeSave(item=tree, save_args=jax.tree.map(lambda _: ocp.SaveArgs(), tree))


def _mesh_of(state: Any) -> Any:
    return next(
        (x.sharding.mesh for x in jax.tree.leaves(state) if isinstance(x.sharding, jax.sharding.NamedSharding)),
        None,
    )


def _replicated_scalars(state: Any, mesh: Any) -> Any:
    """Target shardings for a restore: each array's own, except single-device ones (optimizer and dropout
    counters start uncommitted on one device), which become replicated on the model's mesh; restored onto
    one device they would no longer fit the jitted step."""
    shardings = jax.tree.map(lambda x: x.sharding, state)
    if mesh is None:
        return shardings
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())  # type: ignore[no-untyped-call]
    return jax.tree.map(lambda s: s if isinstance(s, jax.sharding.NamedSharding) else replicated, shardings)


@dataclass
class KeepSteps:
    """An Orbax preservation policy: keep the steps `steps()` names (read at each pruning, after each save)."""

    steps: Callable[[], Collection[int]]

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
        keep = set(self.steps())
        return [c.step in keep for c in checkpoints]


def preservation(keep: int, protect: Callable[[], Collection[int]] | None) -> Any:
    """The latest `keep` steps, and with `protect` also the steps it names (the best one, for select: best)."""
    latest = ocp.checkpoint_managers.LatestN(n=keep)
    if protect is None:
        return latest
    return ocp.checkpoint_managers.AnyPreservationPolicy([latest, KeepSteps(protect)])


class TrainCheckpoints:
    """The run's CheckpointManager. `data_iterator` (a Grain iterator, or None) is saved with each step
    and restored in place; Orbax deletes all but the latest `keep` steps and those `protect()` names;
    `on_saved(step, blocking_s)` and `on_committed(step, total_s, nbytes)` report durations and the step's
    size (the commit runs in a background thread after training continues). `rollout_state(step)` (GRPO's
    feed) gives what a resume from `step` must train on before it samples again, or None; `restore_rollout`
    takes it back."""

    def __init__(
        self,
        uri: str,
        every_steps: int,
        keep: int,
        data_iterator: Any | None,
        metadata: Callable[[], dict[str, Any]] = dict,
        on_saved: Callable[[int, float], None] | None = None,
        on_committed: Callable[[int, float, int], None] | None = None,
        protect: Callable[[], Collection[int]] | None = None,
        rollout_state: Callable[[int], dict[str, Any] | None] | None = None,
        restore_rollout: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.uri = uri
        self._rollout_state = rollout_state
        self._restore_rollout = restore_rollout
        self.every_steps = every_steps
        self._keep = keep
        self._protect = protect
        self._data_iterator = data_iterator
        self._metadata = metadata
        self._on_saved = on_saved
        self._on_committed = on_committed
        self._lock = threading.Lock()
        self._pending: tuple[int, float] | None = None
        self._last_saved: int | None = None
        self.committed_step: int | None = None
        self.restored_metadata: dict[str, Any] = {}
        self._manager = ocp.CheckpointManager(
            uri,
            item_handlers={
                PARAMS_ITEM: ocp.PyTreeCheckpointHandler(),
                OPTIMIZER_ITEM: ocp.PyTreeCheckpointHandler(),
                RNG_ITEM: ocp.PyTreeCheckpointHandler(),
                DATA_ITEM: grain.checkpoint.CheckpointHandler(),
                ROLLOUT_ITEM: ocp.JsonCheckpointHandler(),
            },
            options=ocp.CheckpointManagerOptions(
                preservation_policy=preservation(keep, protect),
                create=True,
                async_options=ocp.AsyncOptions(post_finalization_callback=self._committed),
            ),
        )
        self.committed_step = self._manager.latest_step()

    def _committed(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        step, started = pending
        self.committed_step = step
        if self._on_committed:
            seconds = time.monotonic() - started
            self._on_committed(step, seconds, storage.dir_bytes(storage.join(self.uri, str(step))))

    def latest_step(self) -> int | None:
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def save(
        self,
        step: int,
        model: nnx.Module,
        optimizer: nnx.Optimizer[Any] | None = None,
        save_only_lora_params: bool = True,
        force: bool = False,
        custom_metadata: dict[str, Any] | None = None,
    ) -> bool:
        """Save at `step` when the interval says so (or `force`); the write finishes in the background."""
        # Our own interval rule: Orbax's would also save the first step of every attempt.
        if step == self._last_saved or (not force and step % self.every_steps):
            return False
        params = nnx.state(model, nnx.LoRAParam if save_only_lora_params else nnx.Param)
        items: dict[str, Any] = {PARAMS_ITEM: _pytree_save(params)}
        if optimizer is not None:
            items[OPTIMIZER_ITEM] = _pytree_save(nnx.state(optimizer, nnx.optimizer.OptState))
        counts = nnx.state(model, nnx.RngCount)
        if jax.tree.leaves(counts):
            items[RNG_ITEM] = _pytree_save(counts)
        if self._data_iterator is not None:
            items[DATA_ITEM] = grain.checkpoint.CheckpointSave(self._data_iterator)
        rollout = self._rollout_state(step) if self._rollout_state is not None else None
        if rollout is not None:
            items[ROLLOUT_ITEM] = ocp.args.JsonSave(rollout)
        started = time.monotonic()
        # The previous save must be committed first: Orbax waits for it inside save().
        self._manager.wait_until_finished()
        with self._lock:
            self._pending = (step, started)
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(**items),
            custom_metadata={**(custom_metadata or {}), **self._metadata()},
            force=True,
        )
        if saved:
            self._last_saved = step
            if self._on_saved:
                self._on_saved(step, time.monotonic() - started)
        return bool(saved)

    def maybe_restore(
        self,
        model: nnx.Module,
        optimizer: nnx.Optimizer[Any] | None = None,
        step: int | None = None,
        restore_only_lora_params: bool = True,
    ) -> tuple[int, dict[str, Any]]:
        """Restore the latest (or given) step into `model` and `optimizer`; (0, {}) when there is none.
        The data iterator, when there is one, is set to the step's position."""
        step = self._manager.latest_step() if step is None else step
        if step is None:
            return 0, {}
        started = time.monotonic()
        meta = self._manager.metadata(step)
        present = set(meta.item_metadata.keys()) if meta.item_metadata else set()
        params = nnx.state(model, nnx.LoRAParam if restore_only_lora_params else nnx.Param)
        mesh = _mesh_of(params)
        items: dict[str, Any] = {PARAMS_ITEM: pytree_restore(params)}
        if optimizer is not None:
            opt_state = nnx.state(optimizer, nnx.optimizer.OptState)
            items[OPTIMIZER_ITEM] = pytree_restore(opt_state, _replicated_scalars(opt_state, mesh))
        counts = nnx.state(model, nnx.RngCount)
        if jax.tree.leaves(counts) and RNG_ITEM in present:
            items[RNG_ITEM] = pytree_restore(counts, _replicated_scalars(counts, mesh))
        if DATA_ITEM in present and self._data_iterator is not None:
            items[DATA_ITEM] = grain.checkpoint.CheckpointRestore(self._data_iterator)
        if ROLLOUT_ITEM in present and self._restore_rollout is not None:
            items[ROLLOUT_ITEM] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        nnx.update(model, restored[PARAMS_ITEM])
        if optimizer is not None:
            nnx.update(optimizer, restored[OPTIMIZER_ITEM])
        if RNG_ITEM in items:
            nnx.update(model, restored[RNG_ITEM])
        if ROLLOUT_ITEM in items and self._restore_rollout is not None:
            self._restore_rollout(restored[ROLLOUT_ITEM])
        self.restored_metadata = dict(meta.custom_metadata or {})
        self._last_saved = step
        log.info("restored step %d from %s in %.1fs", step, self.uri, time.monotonic() - started)
        return step, self.restored_metadata

    def close(self) -> None:
        """Wait for the last save to be committed, prune once more, then release the manager."""
        self._manager.wait_until_finished()
        if self._protect is not None:
            self._prune()
        self._manager.close()

    def _prune(self) -> None:
        """Delete what the preservation policy no longer keeps. Orbax prunes after each save, when the step
        just saved has not been evaluated yet (the trainer evaluates after saving), so the best step before it
        stays protected one save longer; after the last save, no later one would delete it."""
        steps = sorted(int(s) for s in self._manager.all_steps())
        keep = set(steps[-self._keep :]) | set(self._protect() if self._protect else ())
        for step in steps:
            if step not in keep:
                log.info("deleting checkpoint step %d: neither among the latest %d nor the best", step, self._keep)
                self._manager.delete(step)


def latest_step(uri: str) -> int | None:
    """The latest finished step under `uri`, or None. A read of this host alone: on a multi-host slice Orbax
    would otherwise wait for every host at a barrier, and this runs when a host has stopped before training."""
    me = jax.process_index()
    local = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    manager = ocp.CheckpointManager(
        uri, options=ocp.CheckpointManagerOptions(read_only=True, multiprocessing_options=local)
    )
    try:
        step = manager.latest_step()
        return None if step is None else int(step)
    finally:
        manager.close()
