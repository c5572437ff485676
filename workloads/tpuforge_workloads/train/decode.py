"""Answers decoded from a training model as it is (its LoRA weights of the step just taken), on the training
mesh, in the training process: the evaluation samples' greedy answers (train/samples.py) and GRPO's rollouts
(train/grpo.py), one jitted program per shape; and the per-token log-probabilities of whole rows under the
model as it is (`RowLogps`: the policy that sampled a GRPO rollout, for the steps that train on it after the first).

`decode` keeps a KV cache (Tunix's own, the model's `init_cache`): the prompts, left-padded to a common
`room` so every row writes the cache at the same index, go through the model once (the prefill), then each
new token is one single-token step that attends to the cache. Without the cache (`kv_cache=False`, the way
this was done before, kept as the measured baseline of benchmarks/decode_speed.py and the reference of its
test) every new token is a forward pass over whole rows of `room + max_new` tokens: `max_new` times the
prefill's work, which took half of every GRPO step on the tiny model and would take most of the 31B's.

Both give the same tokens: a row's prompt sits at positions 0..n-1 either way (the left padding is masked
out and skipped by the positions), the i-th new token is drawn from the same logits with the same key
(`key` folded with i), greedy at temperature 0. Rows are split over the mesh's fsdp axis as a training
batch is; the tokens come back replicated.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOM_MULTIPLE = 64  # prompt rooms are rounded up to this, so a new longest prompt seldom means a new compile


def prompt_room(prompts: Sequence[np.ndarray], at_least: int = 0) -> int:
    """The left-padded width the prompts are decoded from: the longest, rounded up to ROOM_MULTIPLE."""
    longest = max([len(p) for p in prompts] + [at_least, 1])
    return -(-longest // ROOM_MULTIPLE) * ROOM_MULTIPLE


def left_padded(prompts: Sequence[np.ndarray], room: int, pad: int, rows: int | None = None) -> tuple[np.ndarray, ...]:
    """(tokens [rows, room] with each prompt at the right end, prompt lengths [rows]); spare rows (when
    `rows` exceeds the prompts, to fill the fsdp axis) repeat the first prompt."""
    rows = len(prompts) if rows is None else rows
    tokens = np.full((rows, room), pad, np.int32)
    lengths = np.zeros(rows, np.int32)
    for row in range(rows):
        p = np.asarray(prompts[row] if row < len(prompts) else prompts[0], np.int32)
        if len(p) > room:
            raise ValueError(f"a prompt of {len(p)} tokens does not fit the decode's room of {room}")
        tokens[row, room - len(p) :] = p
        lengths[row] = len(p)
    return tokens, lengths


class Decoder:
    """`max_new` tokens after each of a batch of prompts, from `model` as it is when called, at
    `temperature` (0: greedy); compiled once per (rows, room, temperature), on `mesh`."""

    def __init__(self, mesh: Any, max_new: int, kv_cache: bool = True):
        self.mesh = mesh
        self.max_new = max_new
        self.kv_cache = kv_cache
        self._compiled: dict[tuple[int, int, float], Any] = {}

    def __call__(
        self, model: Any, tokens: np.ndarray, lengths: np.ndarray, temperature: float = 0.0, key: Any = None
    ) -> np.ndarray:
        """New tokens [rows, max_new] after left-padded `tokens` [rows, room] (`left_padded`). Call under the
        run's mesh, on every process of the slice."""
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        split: tuple[Any, ...] = nnx.split(model, nnx.LoRAParam, ...)
        graphdef, adapters, rest = split
        shape = (tokens.shape[0], tokens.shape[1], float(temperature))
        if shape not in self._compiled:
            replicated = NamedSharding(self.mesh, PartitionSpec())  # type: ignore[no-untyped-call]
            run = decode if self.kv_cache else decode_whole_rows
            self._compiled[shape] = jax.jit(
                functools.partial(run, graphdef, model.config.dtype, self.max_new, float(temperature)),
                out_shardings=replicated,
            )
        rows = NamedSharding(self.mesh, PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        placed = [jax.make_array_from_callback(a.shape, rows, functools.partial(_index, a)) for a in (tokens, lengths)]
        if key is None:
            key = jax.random.key(0)
        return np.asarray(self._compiled[shape](adapters, rest, *placed, key).addressable_data(0))


class RowLogps:
    """Each token's log-probability under `model` as it is when called, [rows, length] as float32 (column t:
    of token t + 1 after tokens 0..t; the last column 0), with the adapters in the compute dtype and no dropout,
    as the rollout was sampled: GRPO's pi_old for the steps after the first that train on one rollout
    (spec.grpo.iterations). Compiled once per shape, on `mesh`; rows split over fsdp as the decode's."""

    def __init__(self, mesh: Any):
        self.mesh = mesh
        self._compiled: dict[tuple[int, ...], Any] = {}

    def __call__(self, model: Any, tokens: np.ndarray, segment_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Call under the run's mesh, on every process of the slice, with every row of the step."""
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        split: tuple[Any, ...] = nnx.split(model, nnx.LoRAParam, ...)
        graphdef, adapters, rest = split
        if tokens.shape not in self._compiled:
            replicated = NamedSharding(self.mesh, PartitionSpec())  # type: ignore[no-untyped-call]
            self._compiled[tokens.shape] = jax.jit(
                functools.partial(row_logps, graphdef, model.config.dtype), out_shardings=replicated
            )
        rows = NamedSharding(self.mesh, PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        arrays = (tokens, segment_ids, positions)
        placed = [jax.make_array_from_callback(a.shape, rows, functools.partial(_index, a)) for a in arrays]
        return np.asarray(self._compiled[tokens.shape](adapters, rest, *placed).addressable_data(0))


def row_logps(
    graphdef: Any, dtype: Any, adapters: Any, rest: Any, tokens: Any, segment_ids: Any, positions: Any
) -> Any:
    """RowLogps's program: the training forward pass over whole rows (its attention path and masks)."""
    import jax.numpy as jnp

    from tpuforge_workloads.families import attention
    from tpuforge_workloads.model.lora_provider import without_dropout
    from tpuforge_workloads.model.loss import token_logps

    model = _model(graphdef, dtype, adapters, rest)
    x = attention.model_inputs(
        {"input_tokens": tokens, "input_mask": segment_ids > 0, "segment_ids": segment_ids, "positions": positions}
    )
    with without_dropout():
        logits, _ = model(tokens, positions, None, attention.for_model(model, x["attention_mask"]))
    return jnp.pad(token_logps(logits[:, :-1], tokens[:, 1:]), ((0, 0), (0, 1)))


def _index(array: np.ndarray, index: Any) -> Any:
    return array[index]


def _pick(logits: Any, temperature: float, key: Any, i: Any) -> Any:
    """The i-th new token of each row from its logits [rows, vocab]."""
    import jax
    import jax.numpy as jnp

    scores = logits.astype(jnp.float32)
    if temperature > 0:
        return jax.random.categorical(jax.random.fold_in(key, i), scores / temperature, axis=-1).astype(jnp.int32)
    return jnp.argmax(scores, axis=-1).astype(jnp.int32)


def _model(graphdef: Any, dtype: Any, adapters: Any, rest: Any) -> Any:
    """The model rebuilt from its arrays inside the trace (so no variable is written across traces), its
    adapters cast to the compute dtype as training's forward pass casts them (lora.adapters_in_compute_dtype)."""
    import jax
    from flax import nnx

    adapters = jax.tree.map(lambda x: x.astype(dtype), adapters)
    return nnx.merge(graphdef, adapters, rest)


def decode(
    graphdef: Any,
    dtype: Any,
    max_new: int,
    temperature: float,
    adapters: Any,
    rest: Any,
    tokens: Any,
    lengths: Any,
    key: Any,
) -> Any:
    """New tokens [rows, max_new] after left-padded prompts `tokens` [rows, room] of `lengths`, with a KV cache
    of room + max_new slots: the prefill, then max_new - 1 single-token steps."""
    import jax
    import jax.numpy as jnp

    from tpuforge_workloads.model.lora_provider import without_dropout

    rows, room = tokens.shape
    size = room + max_new
    slot = jnp.arange(size)
    prompt_slot = (slot[None, :] >= room - lengths[:, None]) & (slot[None, :] < room)  # [rows, size]
    positions = jnp.clip(jnp.arange(room)[None, :] - (room - lengths[:, None]), 0, None).astype(jnp.int32)
    model = _model(graphdef, dtype, adapters, rest)
    cache = jax.tree.map(
        lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(lambda: model.init_cache(rows, size, dtype))
    )
    causal = slot[None, :] <= jnp.arange(room)[:, None]  # [room, size]
    last_only = {"decode_only_last_token": True} if _takes(model, "decode_only_last_token") else {}
    with without_dropout():
        logits, cache = model(tokens, positions, cache, prompt_slot[:, None, :] & causal[None], **last_only)
    first = _pick(logits[:, -1], temperature, key, 0)

    def step(i: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        out, cache, last = carry  # `last`: the token decoded at step i - 1, which goes in at slot room + i - 1
        seen = prompt_slot | ((slot[None, :] >= room) & (slot[None, :] < room + i))
        with without_dropout():
            logits, cache = _model(graphdef, dtype, adapters, rest)(
                last[:, None], (lengths + i - 1)[:, None], cache, seen[:, None, :]
            )
        nxt = _pick(logits[:, -1], temperature, key, i)
        return out.at[:, i].set(nxt), cache, nxt

    out = jnp.zeros((rows, max_new), jnp.int32).at[:, 0].set(first)
    out, _, _ = jax.lax.fori_loop(1, max_new, step, (out, cache, first))
    return out


def decode_whole_rows(
    graphdef: Any,
    dtype: Any,
    max_new: int,
    temperature: float,
    adapters: Any,
    rest: Any,
    tokens: Any,
    lengths: Any,
    key: Any,
) -> Any:
    """`decode` without a cache: each new token a forward pass over whole rows of room + max_new tokens (the
    prompt moved to the row's start), on the training path's attention (splash with segment ids on TPU)."""
    import jax
    import jax.numpy as jnp

    from tpuforge_workloads.families import attention
    from tpuforge_workloads.families.attention import model_inputs
    from tpuforge_workloads.model.lora_provider import without_dropout

    rows, room = tokens.shape
    length = room + max_new
    row_index = jnp.arange(rows)
    source = jnp.arange(length)[None, :] + (room - lengths[:, None])  # left-aligned: column c holds token c
    padded = jnp.pad(tokens, ((0, 0), (0, max_new)))
    toks = jnp.take_along_axis(padded, jnp.clip(source, 0, length - 1), axis=1)
    segment_ids = jnp.ones_like(toks)  # causal attention alone: nothing after a row's end is read
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), toks.shape)

    def step(i: Any, toks: Any) -> Any:
        model = _model(graphdef, dtype, adapters, rest)
        x = model_inputs({"input_tokens": toks, "input_mask": toks, "segment_ids": segment_ids, "positions": positions})
        with without_dropout():
            logits, _ = model(toks, x["positions"], None, attention.for_model(model, x["attention_mask"]))
        at = lengths + i  # where this step's token goes
        nxt = _pick(logits[row_index, at - 1], temperature, key, i).astype(toks.dtype)
        return toks.at[row_index, at].set(nxt)

    toks = jax.lax.fori_loop(0, max_new, step, toks)
    return jnp.take_along_axis(toks, lengths[:, None] + jnp.arange(max_new)[None, :], axis=1)


def _takes(model: Any, name: str) -> bool:
    return name in inspect.signature(type(model).__call__).parameters
