"""The LoRA parameters of a Tunix PeftTrainer checkpoint, read with Orbax on the CPU, one layer at a time.

PeftTrainer saves `nnx.state(model, nnx.LoRAParam)` as the `model_params` item of each Orbax step
directory (with the optimizer state beside it, which the merge ignores). Leaves are named
layers/<i>/<attn|mlp>/<module>/<w|kernel>_lora_<a|b>/value. The tree metadata gives every shape without
reading data, so the whole merge is planned (and bad input rejected) before any tensor is read.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuforge_workloads import storage
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.model.adapter_checkpoint import PARAMS_ITEM
from tpuforge_workloads.runtime import eval_record

log = logging.getLogger(__name__)

_LEAF = re.compile(r"^(?P<param>\w+)_lora_(?P<factor>[ab])$")


@dataclass(frozen=True)
class LoraParam:
    """The two factors of one adapted weight, as tree paths in the checkpoint and their shapes."""

    layer: int
    module: str
    a_path: tuple[str, ...]
    b_path: tuple[str, ...]
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return self.a_shape[-1]


def _orbax() -> Any:
    import orbax.checkpoint as ocp  # imports JAX: only when a checkpoint is actually read

    return ocp


def _epath(uri: str) -> Any:
    from etils import epath

    return epath.Path(uri)


def checkpoint_steps(uri: str) -> list[int]:
    """Finalized steps under an Orbax CheckpointManager directory (in-progress saves are not listed)."""
    ocp = _orbax()
    manager = ocp.CheckpointManager(uri, options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        return sorted(int(s) for s in manager.all_steps())
    finally:
        manager.close()


def _parse_leaf(path: tuple[str, ...]) -> tuple[int, str, str] | None:
    """(layer, module, 'a'|'b') for layers/<i>/<block>/<module>/<param>_lora_<a|b>[/value]."""
    keys = path[:-1] if path and path[-1] == "value" else path
    if len(keys) < 3 or keys[0] != "layers" or not keys[1].isdigit():
        return None
    m = _LEAF.match(keys[-1])
    if not m:
        return None
    return int(keys[1]), keys[-2], m.group("factor")


@dataclass
class LoraCheckpoint:
    uri: str  # the CheckpointManager directory
    step: int
    params: dict[tuple[int, str], LoraParam]  # (layer, Tunix module) -> factors
    _cache: OrderedDict[int, dict[str, tuple[np.ndarray, np.ndarray]]]

    @property
    def step_uri(self) -> str:
        return storage.join(self.uri, str(self.step))

    @property
    def rank(self) -> int:
        return next(iter(self.params.values())).rank

    @classmethod
    def open(cls, uri: str, step: int | None = None, select: str = "last") -> LoraCheckpoint:
        """The given step, else per `select` the latest finalized one (last) or the finalized one with the
        lowest loss in the trainer's eval record (best); reads only metadata."""
        if not storage.exists(uri):
            raise MergeInputError(f"checkpointUri {uri}: nothing there; point it at the training checkpoint directory")
        steps = checkpoint_steps(uri)
        if not steps:
            raise MergeInputError(
                f"checkpointUri {uri}: no finished Orbax checkpoint step (a save that was cut short is not listed)"
            )
        if step is None and select == "best":
            best = eval_record.best_finished_step(uri, steps)
            if best is None:
                raise MergeInputError(
                    f"select best: no finished step under {uri} has an eval loss in {eval_record.EVAL_RECORD_FILE} "
                    f"(finished steps: {steps}); was the run trained with spec.dataset.evalUri?"
                )
            step = best[0]
            log.info("select best: step %d (eval loss %.4f) of finished steps %s", step, best[1], steps)
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise MergeInputError(f"step {step}: not a finished checkpoint under {uri}; finished steps: {steps}")
        item_uri = storage.join(uri, str(step), PARAMS_ITEM)
        try:
            tree = _orbax().PyTreeCheckpointHandler().metadata(_epath(item_uri)).tree
        except Exception as e:
            raise MergeInputError(
                f"{item_uri}: cannot read the LoRA parameters' metadata ({type(e).__name__}: {e}): the checkpoint "
                "is incomplete or not a Tunix PeftTrainer checkpoint"
            ) from e
        return cls(uri, step, _collect(tree, item_uri), OrderedDict())

    def layer(self, layer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{module: (A, B)} of one layer in float32; the last few layers read stay cached."""
        if layer in self._cache:
            self._cache.move_to_end(layer)
            return self._cache[layer]
        wanted = [p for (i, _), p in self.params.items() if i == layer]
        arrays = self._restore([p.a_path for p in wanted] + [p.b_path for p in wanted])
        out = {p.module: (arrays[p.a_path], arrays[p.b_path]) for p in wanted}
        self._cache[layer] = out
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return out

    def _restore(self, paths: list[tuple[str, ...]]) -> dict[tuple[str, ...], np.ndarray]:
        ocp = _orbax()
        item: dict[str, Any] = {}
        for path in paths:
            node = item
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = 0
        restore_args = _map_leaves(item, lambda _: ocp.RestoreArgs(restore_type=np.ndarray))
        item_uri = storage.join(self.step_uri, PARAMS_ITEM)
        try:
            restored = ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).restore(
                _epath(item_uri),
                args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
            )
        except Exception as e:
            raise RuntimeError(f"{item_uri}: cannot read LoRA parameters ({type(e).__name__}: {e})") from e
        out = {}
        for path in paths:
            node = restored
            for key in path:
                node = node[key]
            out[path] = np.asarray(node, dtype=np.float32)
        return out


def _map_leaves(tree: dict[str, Any], fn: Any) -> dict[str, Any]:
    return {k: _map_leaves(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def _collect(tree: Any, item_uri: str) -> dict[tuple[int, str], LoraParam]:
    import jax

    factors: dict[tuple[int, str], dict[str, tuple[tuple[str, ...], tuple[int, ...]]]] = {}
    for key_path, meta in jax.tree_util.tree_flatten_with_path(tree)[0]:
        path = tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)
        parsed = _parse_leaf(path)
        if parsed is None:
            raise MergeInputError(
                f"{item_uri}: parameter {'/'.join(path)} is not a LoRA factor of a decoder layer; the merge "
                "supports LoRA on Gemma 4 attention and MLP weights only"
            )
        layer, module, factor = parsed
        factors.setdefault((layer, module), {})[factor] = (path, tuple(meta.shape))
    params = {}
    for (layer, module), f in sorted(factors.items()):
        if set(f) != {"a", "b"}:
            raise MergeInputError(f"{item_uri}: layer {layer} {module} has LoRA factor {set(f)} only: truncated")
        params[(layer, module)] = LoraParam(layer, module, f["a"][0], f["b"][0], f["a"][1], f["b"][1])
    if not params:
        raise MergeInputError(f"{item_uri}: no LoRA parameters in the checkpoint")
    ranks = {p.rank for p in params.values()}
    if len(ranks) != 1:
        raise MergeInputError(f"{item_uri}: LoRA factors of different ranks {sorted(ranks)}")
    return params
