"""Preference records (spec.method dpo and orpo) -> pairs of token rows: the prompt with its chosen answer,
then the prompt with its rejected one.

A record is {"prompt": ..., "chosen": ..., "rejected": ...} in JSONL or Parquet (read by data/records.py, so
files, lines, rows, skipInvalid and the held-out split work as for SFT records). The prompt is a string (one
user turn) or a list of messages ending with a user turn; each answer is a string, an assistant message
({"role": "assistant", "content": ...}) or a list of assistant messages. Both rows are rendered in the
model's chat format as SFT rows are (data/chat.py), and the loss mask is set on the answer alone: an
assistant turn inside the prompt carries none, so each row's masked log-probability is that of its answer.

Pairs stay together from here on: the examples list holds each pair's chosen row then its rejected row, and
batches are made of whole pairs (BatchSpec.group), so row 2i of a batch is a chosen answer and row 2i+1 the
rejected answer to the same prompt. A pair is dropped, or truncated, as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tpuforge.api.finetune import PREFERENCE_METHODS, GrpoSpec
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import DataStats, Example, fit_length
from tpuforge_workloads.data.records import (
    DatasetError,
    Message,
    Record,
    parse_message,
    parse_messages,
    parse_thinking,
)

ANSWERS = ("chosen", "rejected")
EXAMPLE = '{"prompt": "...", "chosen": "...", "rejected": "..."}'


@dataclass(frozen=True)
class PreferenceRecord:
    line: int  # JSONL: 1-based line number; Parquet: 0-based row
    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]
    where: str = field(default="", compare=False, hash=False)

    @property
    def messages(self) -> tuple[Message, ...]:
        """Every message of the pair: what the held-out split keys it by (data/split.py)."""
        return (*self.prompt, *self.chosen, *self.rejected)

    def rows(self) -> tuple[Record, Record]:
        """The pair as two conversations: the prompt and its chosen answer, the prompt and its rejected one."""
        return (
            Record(self.line, (*self.prompt, *self.chosen), where=self.where),
            Record(self.line, (*self.prompt, *self.rejected), where=self.where),
        )


def _answer(obj: dict[str, Any], key: str, where: str) -> tuple[Message, ...]:
    value = obj[key]
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: {key}: empty answer")
        return (Message("assistant", value, parse_thinking({}, where, key, "assistant", value)),)
    if isinstance(value, dict):
        messages = [parse_message(value, where, key)]
    elif isinstance(value, list) and value:
        messages = parse_messages(value, where, key)
    else:
        raise DatasetError(
            f"{where}: {key}: must be a string, an assistant message or a list of them (a {type(value).__name__})"
        )
    bad = next((m for m in messages if m.role != "assistant"), None)
    if bad is not None:
        raise DatasetError(f"{where}: {key}: holds assistant messages only (one is {bad.role}'s)")
    return tuple(messages)


def parse_preference(obj: Any, where: str, position: int) -> PreferenceRecord:
    """One record (a JSON object or a Parquet row) -> a PreferenceRecord; raises DatasetError naming `where`,
    the field and what a preference record looks like."""
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if v is not None}  # a Parquet row has every column, some null
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a preference record, an object like {EXAMPLE}")
    missing = [k for k in ("prompt", *ANSWERS) if k not in obj]
    if missing:
        got = f"it has {sorted(obj)}" if obj else "it is empty"
        raise DatasetError(
            f"{where}: {missing[0]}: missing ({got}); spec.method dpo and orpo train on preference records like "
            f"{EXAMPLE}"
        )
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DatasetError(f"{where}: prompt: empty")
        asked: tuple[Message, ...] = (Message("user", prompt),)
    elif isinstance(prompt, list) and prompt:
        asked = tuple(parse_messages(prompt, where, "prompt"))
    else:
        raise DatasetError(f"{where}: prompt: must be a string or a list of messages (a {type(prompt).__name__})")
    for i, m in enumerate(asked):
        if m.role == "system" and i != 0:
            raise DatasetError(f"{where}: prompt[{i}].role: a system message may only be the first")
    if asked[-1].role != "user":
        raise DatasetError(f"{where}: prompt[{len(asked) - 1}].role: the prompt ends with the user's turn")
    chosen, rejected = _answer(obj, "chosen", where), _answer(obj, "rejected", where)
    if chosen == rejected:
        raise DatasetError(f"{where}: rejected: the same as chosen, so there is nothing to prefer")
    return PreferenceRecord(position, asked, chosen, rejected, where)


def rows_per_example(method: str, grpo: GrpoSpec | None = None) -> int:
    """Rows of a batch per example: a preference pair (dpo, orpo) takes two, a GRPO prompt groupSize (its
    sampled answers), an SFT record one."""
    if method == "grpo":
        return (grpo or GrpoSpec()).group_size
    return 2 if method in PREFERENCE_METHODS else 1


def answer_only(mask: np.ndarray, prompt_answers: int) -> np.ndarray:
    """`mask` (True on every assistant turn, each a run of True) without its first `prompt_answers` runs: the
    assistant turns inside the prompt."""
    out = mask.copy()
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]])) + 1
    for start, end in list(zip(starts, ends, strict=True))[:prompt_answers]:
        out[start:end] = False
    return out


def prepare_pairs(
    records: Sequence[PreferenceRecord],
    encoder: ChatEncoder,
    max_seq_len: int,
    over_length: Literal["drop", "truncate"],
    where: str,
) -> tuple[list[Example], DataStats]:
    """Each pair's chosen row then its rejected row, loss on the answers only, the over-length policy applied
    to the pair as a whole. `stats` counts pairs as records and rows as examples. Raises DatasetError, naming
    `where` and the fix, when no pair is left."""
    stats = DataStats(records=len(records))
    rows = encoder.encode_many([r.messages for record in records for r in record.rows()])
    examples: list[Example] = []
    lengths = []
    for i, record in enumerate(records):
        in_prompt = sum(m.role == "assistant" for m in record.prompt)
        pair = [(tokens, answer_only(mask, in_prompt)) for tokens, mask in rows[2 * i : 2 * i + 2]]
        lengths += [len(tokens) for tokens, _ in pair]
        fitted = [f for f in (fit_length(tokens, mask, max_seq_len, over_length) for tokens, mask in pair) if f]
        if len(fitted) < 2:
            stats.dropped_over_length += 1
            continue
        if any(not mask[1:].any() for _, mask, _ in fitted):
            stats.dropped_no_loss += 1
            continue
        stats.truncated += int(any(cut for _, _, cut in fitted))
        for tokens, mask, _ in fitted:
            examples.append({"tokens": tokens, "loss_mask": mask})
            stats.tokens += len(tokens)
            stats.loss_tokens += int(mask[1:].sum())
    stats.examples = len(examples)
    stats.longest, stats.shortest = max(lengths), min(lengths)
    if not examples:
        raise DatasetError(
            f"{where}: no preference pair has both answers within training.maxSeqLen={max_seq_len} tokens "
            f"({stats.dropped_over_length} too long, {stats.dropped_no_loss} truncated to nothing; the longest row "
            f"{stats.longest} tokens); raise maxSeqLen or set training.overLength: truncate"
        )
    return examples, stats
