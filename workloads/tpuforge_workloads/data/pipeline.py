"""Tokenised examples -> fixed-shape micro-batches with Grain.

Every record is tokenised once, before training, which is also when over-length records are dropped or
truncated (and counted) and when a dataset with nothing trainable is rejected. Each epoch then takes the
examples in its own order, drawn from the seed, and either pads each to `max_seq_len` or packs several into
a row first-fit (planned from the lengths). Grain serves whole micro-batches from a random-access source, so
the iterator's state is a batch position: checkpointed with the model, it makes a resumed run see exactly
the batches the interrupted one would have.

A batch is a dict of numpy arrays [rows, max_seq_len]:
    input_tokens  int32   token ids, <pad> after the last example of a row
    input_mask    bool    loss mask (which targets count)
    segment_ids   int32   1, 2, ... per example in the row; 0 on padding
    positions     int32   position within its own example
plus `global_tokens` and `global_loss_tokens`, int64 scalars: the real tokens and the loss targets of the
whole global batch. The trainer adds `loss_denominator` (float32 [rows], see model/loss.py) before a batch
goes to the device.
The model's attention mask is made from the segment ids when the step is traced (`model_inputs`,
families/attention.py: the block-diagonal causal mask, or on TPU the segment ids themselves).

On a multi-host slice every process builds only its own rows of each global batch (the rows its devices
hold on the batch axis, `process_rows`), from the same random-access source, so the global batch is the
one a single process would build; `to_global` assembles the processes' rows into global arrays.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.records import DatasetError, Record

if TYPE_CHECKING:
    import grain

Example = dict[str, np.ndarray]  # {"tokens": int32[n], "loss_mask": bool[n]}


@dataclass
class DataStats:
    records: int = 0
    examples: int = 0  # kept for training
    dropped_over_length: int = 0
    truncated: int = 0
    dropped_no_loss: int = 0  # truncation left no token to learn from
    tokens: int = 0  # real tokens in the kept examples (one epoch)
    loss_tokens: int = 0
    longest: int = 0  # before any truncation
    shortest: int = 0
    skipped_invalid: int = 0  # malformed records left out of the file (dataset.skipInvalid)
    held_out: int = 0  # records held out of the file for evaluation (dataset.evalFraction)

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


def prepare_examples(
    records: Sequence[Record],
    encoder: ChatEncoder,
    max_seq_len: int,
    over_length: Literal["drop", "truncate"],
    where: str,
) -> tuple[list[Example], DataStats]:
    """Tokenise every record and apply the over-length policy. Raises DatasetError, naming `where` and
    the fix, when no example is left to train on."""
    stats = DataStats(records=len(records))
    examples: list[Example] = []
    lengths = []
    for encoded in encoder.encode_many([r.messages for r in records]):
        lengths.append(len(encoded[0]))
        fitted = fit_length(*encoded, max_seq_len, over_length)
        if fitted is None:
            stats.dropped_over_length += 1
            continue
        tokens, mask, cut = fitted
        stats.truncated += int(cut)
        # The first token is never a target: a mask that is True only there teaches nothing.
        if not mask[1:].any():
            stats.dropped_no_loss += 1
            continue
        examples.append({"tokens": tokens, "loss_mask": mask})
        stats.tokens += len(tokens)
        stats.loss_tokens += int(mask[1:].sum())
    stats.examples = len(examples)
    stats.longest, stats.shortest = max(lengths), min(lengths)
    if not examples:
        if stats.dropped_over_length == stats.records:
            raise DatasetError(
                f"{where}: all {stats.records} records are longer than training.maxSeqLen={max_seq_len} tokens "
                f"(shortest: {stats.shortest}); raise maxSeqLen or set training.overLength: truncate"
            )
        raise DatasetError(
            f"{where}: no record has an assistant token within the first {max_seq_len} tokens "
            f"({stats.dropped_over_length} too long, {stats.dropped_no_loss} truncated to nothing); "
            "raise training.maxSeqLen"
        )
    return examples, stats


def fit_length(
    tokens: np.ndarray, mask: np.ndarray, max_seq_len: int, over_length: Literal["drop", "truncate"]
) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(tokens, mask, whether they were cut) within `max_seq_len` per the over-length policy; None: dropped."""
    if len(tokens) <= max_seq_len:
        return tokens, mask, False
    if over_length == "drop":
        return None
    return tokens[:max_seq_len], mask[:max_seq_len], True


def empty_batch(rows: int, length: int, pad_id: int) -> dict[str, np.ndarray]:
    return {
        "input_tokens": np.full((rows, length), pad_id, np.int32),
        "input_mask": np.zeros((rows, length), bool),
        "segment_ids": np.zeros((rows, length), np.int32),
        "positions": np.zeros((rows, length), np.int32),
    }


def fill_row(batch: dict[str, np.ndarray], row: int, members: Sequence[Example]) -> None:
    """Put `members` one after the other in row `row`: each with its own segment id (1, 2, ...) and
    positions from 0; padding stays after the last."""
    lengths = np.array([len(e["tokens"]) for e in members])
    total = int(lengths.sum())
    batch["input_tokens"][row, :total] = np.concatenate([e["tokens"] for e in members])
    batch["input_mask"][row, :total] = np.concatenate([e["loss_mask"] for e in members])
    batch["segment_ids"][row, :total] = np.repeat(np.arange(1, len(members) + 1, dtype=np.int32), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    batch["positions"][row, :total] = np.arange(total, dtype=np.int32) - starts


def pack_examples(members: Sequence[Example], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """One row holding `members` (one example: a padded row)."""
    batch = empty_batch(1, length, pad_id)
    fill_row(batch, 0, members)
    return {k: v[0] for k, v in batch.items()}


def pad_example(example: Example, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """One example in a row of its own, padded to `length`."""
    return pack_examples([example], length, pad_id)


def first_fit(lengths: Sequence[int], capacity: int, bins: int) -> list[list[int]]:
    """Rows of example indices, in the given order: each example goes to the first open row with room; when
    none has room and `bins` rows are open, they are all emitted and a new set starts (Grain's first-fit
    rule). Every example fits a row on its own (over-length ones were dropped or cut before)."""
    rows: list[list[int]] = []
    open_rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        for b, left in enumerate(room):
            if n <= left:
                open_rows[b].append(i)
                room[b] -= n
                break
        else:
            if len(open_rows) == bins:
                rows += open_rows
                open_rows, room = [], []
            open_rows.append([i])
            room.append(capacity - n)
    return rows + open_rows


class EpochOrder:
    """Each epoch's order of the examples, drawn from (seed, epoch); the same in every run. With `group` > 1
    the examples come in groups of that many consecutive ones (a preference pair's two rows), shuffled as
    groups and kept in their order within each."""

    def __init__(self, count: int, seed: int, group: int = 1):
        self.count = count
        self.seed = seed
        self.group = group
        self._cached: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:  # iteration moves forward: keep one epoch
            groups = np.random.default_rng([self.seed, epoch]).permutation(self.count // self.group)
            order = (groups[:, None] * self.group + np.arange(self.group)).reshape(-1) if self.group > 1 else groups
            self._cached = (epoch, order)
        return self._cached[1]


class PaddedRows:
    """Rows of one example each, epoch after epoch, shuffled per epoch."""

    def __init__(self, examples: Sequence[Example], spec: BatchSpec):
        self._examples = list(examples)
        self._spec = spec
        self._order = EpochOrder(len(self._examples), spec.seed, spec.group)

    def __len__(self) -> int:
        n = len(self._examples)
        return n * self._spec.epochs if self._spec.epochs is not None else sys.maxsize

    def members(self, index: int) -> list[Example]:
        epoch, i = divmod(index, len(self._examples))
        return [self._examples[int(self._order(epoch)[i])]]


class PackedRows:
    """Rows of several examples: each epoch's shuffled examples packed first-fit, planned from the lengths
    alone (cheap, per epoch, on demand)."""

    def __init__(self, examples: Sequence[Example], spec: BatchSpec):
        self._examples = list(examples)
        self._lengths = np.array([len(e["tokens"]) for e in self._examples])
        self._spec = spec
        self._order = EpochOrder(len(self._examples), spec.seed)
        self._starts = [0]  # first row of each planned epoch, and the end of the last one
        self._plan: tuple[int, list[list[int]]] | None = None

    def _epoch_plan(self, epoch: int) -> list[list[int]]:
        if self._plan is None or self._plan[0] != epoch:
            order = self._order(epoch)
            rows = first_fit(self._lengths[order].tolist(), self._spec.max_seq_len, self._spec.bins())
            self._plan = (epoch, [[int(order[i]) for i in row] for row in rows])
        return self._plan[1]

    def _epoch_of(self, index: int) -> int:
        while index >= self._starts[-1]:
            epoch = len(self._starts) - 1
            self._starts.append(self._starts[-1] + len(self._epoch_plan(epoch)))
        return int(np.searchsorted(self._starts, index, side="right")) - 1

    def __len__(self) -> int:
        if self._spec.epochs is None:
            return sys.maxsize
        self._epoch_of(0)
        while len(self._starts) <= self._spec.epochs:
            self._epoch_of(self._starts[-1])
        return self._starts[self._spec.epochs]

    def members(self, index: int) -> list[Example]:
        epoch = self._epoch_of(index)
        return [self._examples[i] for i in self._epoch_plan(epoch)[index - self._starts[epoch]]]


@dataclass
class BatchSpec:
    max_seq_len: int
    rows: int  # rows per micro-batch
    packing: bool
    seed: int
    pad_id: int
    epochs: int | None  # None repeats forever (a step budget ends the run)
    packing_bins: int = field(default=0)  # first-fit rows open at once; 0 picks 4 x rows (at least 16)
    # Batches made ahead by a background thread (the state still counts only batches handed out). Off by
    # default: JAX dispatches each step asynchronously, so the next batch is already made while the device
    # computes, and a thread would only contend for the GIL with the loop.
    prefetch: int = 0
    # Consecutive examples that stay together and in order, in rows of their own (2: a preference pair's
    # chosen and rejected rows; `rows` is then a multiple of it). Unpacked rows only.
    group: int = 1

    def bins(self) -> int:
        return self.packing_bins or max(16, 4 * self.rows)


class MicroBatches:
    """Grain random-access source of micro-batches: batch i stacks rows [i * rows, (i + 1) * rows) of the
    row source (of those, `local_rows` only: this process's share); a last partial batch is dropped. One
    Grain element per batch keeps Grain's per-element bookkeeping off the per-row path."""

    def __init__(self, examples: Sequence[Example], spec: BatchSpec, local_rows: Sequence[int] | None = None):
        self._rows: PaddedRows | PackedRows = PackedRows(examples, spec) if spec.packing else PaddedRows(examples, spec)
        self._spec = spec
        self._local = list(range(spec.rows)) if local_rows is None else list(local_rows)

    def __len__(self) -> int:
        return len(self._rows) // self._spec.rows

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        n = self._spec.rows
        batch = empty_batch(len(self._local), self._spec.max_seq_len, self._spec.pad_id)
        for i, r in enumerate(self._local):
            fill_row(batch, i, self._rows.members(index * n + r))
        # Counted from every row, so each process knows the global batch's tokens.
        rows = [self._rows.members(index * n + r) for r in range(n)]
        batch["global_tokens"] = np.asarray(sum(len(e["tokens"]) for row in rows for e in row), np.int64)
        batch["global_loss_tokens"] = np.asarray(sum(loss_targets(row) for row in rows), np.int64)
        return batch


def loss_targets(members: Sequence[Example]) -> int:
    """The loss targets of a row holding `members`: the row's first token is never a target."""
    return sum(int(e["loss_mask"][1:].sum()) if i == 0 else int(e["loss_mask"].sum()) for i, e in enumerate(members))


def batches(examples: Sequence[Example], spec: BatchSpec, local_rows: Sequence[int] | None = None) -> grain.IterDataset:
    """The training batches, in order (each holding `local_rows` of the global batch; default all). Iterate
    with `iter(...)`; the iterator has get_state/set_state, and the state is a batch position."""
    import grain  # imports JAX: not needed by the checks that run before training

    source = MicroBatches(examples, spec, local_rows)
    ds = grain.MapDataset.source(source).to_iter_dataset(grain.ReadOptions(num_threads=0))
    if spec.prefetch:
        ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=spec.prefetch)
    return ds


def count_batches(examples: Sequence[Example], spec: BatchSpec) -> int:
    """How many micro-batches `batches` yields (finite epochs only)."""
    if spec.epochs is None:
        raise ValueError("an endless dataset has no batch count")
    return len(MicroBatches(examples, spec))


def eval_batches(examples: Sequence[Example], rows: int, max_seq_len: int, pad_id: int) -> list[dict[str, np.ndarray]]:
    """Every eval example once, in file order, padded; the last batch is filled with empty rows (no loss)
    so that every batch has the training shape."""
    padded = [pad_example(e, max_seq_len, pad_id) for e in examples]
    empty = pad_example({"tokens": np.zeros(0, np.int32), "loss_mask": np.zeros(0, bool)}, max_seq_len, pad_id)
    while len(padded) % rows:
        padded.append(empty)
    return [{k: np.stack([p[k] for p in padded[i : i + rows]]) for k in padded[0]} for i in range(0, len(padded), rows)]


def real_tokens(batch: dict[str, np.ndarray]) -> int:
    """Real tokens of the global batch (an eval batch: of the rows at hand)."""
    if "global_tokens" in batch:
        return int(batch["global_tokens"])
    return int(np.count_nonzero(batch["segment_ids"]))


BATCH_ARRAYS = ("input_tokens", "input_mask", "segment_ids", "positions")
# GRPO's rows (train/grpo.py): each answer's advantage, and with several steps per rollout the sampling
# policy's per-token log-probabilities.
RL_ARRAYS = ("advantages", "old_logps")


def process_rows(sharding: Any, rows: int, length: int) -> list[int]:
    """The rows of each global [rows, length] batch that this process's devices hold under `sharding`
    (all of them on one host), in the order `to_global` expects them."""
    spans = {
        (s[0].start or 0, rows if s[0].stop is None else s[0].stop)
        for s in sharding.addressable_devices_indices_map((rows, length)).values()
    }
    return [r for start, stop in sorted(spans) for r in range(start, stop)]


def to_global(batch: dict[str, np.ndarray], sharding: Any, rows: int) -> dict[str, Any]:
    """This process's rows of a batch -> global arrays of `rows` rows, sharded by `sharding` (every
    process calls it with its own rows)."""
    import jax

    make = jax.make_array_from_process_local_data
    keys = [k for k in (*BATCH_ARRAYS, "loss_denominator", *RL_ARRAYS) if k in batch]
    return {k: make(sharding, batch[k], (rows, *batch[k].shape[1:])) for k in keys}  # type: ignore[no-untyped-call]
