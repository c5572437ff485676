"""Records from a JSONL file (one JSON object per line) or a Parquet file (one row each, the same shapes as
columns). A record is either

    {"messages": [{"role": ..., "content": ...}, ...]}             a chat, or
    {"prompt": ..., "completion": ...}                              a user turn and the assistant's answer

where a prompt/completion pair may also hold lists of messages (the prompt's turns, then the answer's). An
assistant message may carry its thinking in a `thinking`, `reasoning_content` or `reasoning` field, or as
Gemma 4's thought channel inside the content (`<|channel>thought\\n...<channel|>answer`); a pair's thinking
goes beside the completion. Whether the thinking is trained is the chat format's choice (data/chat.py).

Every record is checked before training starts. The first malformed one stops the run with the file, the
line (JSONL) or row (Parquet, counted from 0 as pyarrow and pandas count) and the field; with `skip_invalid`
malformed records are left out and counted instead. Blank JSONL lines are allowed and skipped.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tpuforge_workloads import storage

ROLES = ("system", "user", "assistant")
THINKING_FIELDS = ("thinking", "reasoning_content", "reasoning")
CHANNEL_START, CHANNEL_END = "<|channel>", "<channel|>"
THOUGHT_CHANNEL = "thought"
FORMATS = ("jsonl", "parquet")
PARQUET_SUFFIXES = (".parquet", ".pq")
LOCAL_PREFIX = "file://"


class DatasetError(ValueError):
    """A dataset the trainer cannot use; the message names the file (and line) and the fix."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    thinking: str = ""  # an assistant's reasoning before its answer ("" when it has none)


@dataclass(frozen=True)
class Record:
    line: int  # JSONL: 1-based line number; Parquet: 0-based row
    messages: tuple[Message, ...]
    # The record's "test" object, for functional evaluation: opaque here, handed to the checker as it is.
    test: Any = field(default=None, compare=False, hash=False)
    where: str = field(default="", compare=False, hash=False)  # file:line or file row N, for messages


# One record (a JSON object or a Parquet row, the place it is named by, its line or row) -> a parsed record.
Parser = Callable[[Any, str, int], Any]


@dataclass
class Records:
    """A file's usable records and the malformed ones left out (with skip_invalid)."""

    records: list[Any]  # Record, or what the parser given to read_dataset makes
    skipped: list[str] = field(default_factory=list)  # one error message per record left out


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, the rest) of a model turn that holds thought channels: each channel's text without its
    channel name, joined by blank lines; the rest is the text outside the channels."""
    if CHANNEL_START not in text:
        return "", text
    thoughts, rest = [], []
    for part in text.split(CHANNEL_END):
        before, found, inside = part.partition(CHANNEL_START)
        rest.append(before)
        if found:
            name, newline, body = inside.partition("\n")
            thoughts.append((body if newline and name.strip() == THOUGHT_CHANNEL else inside).strip())
    return "\n\n".join(t for t in thoughts if t), "".join(rest)


def parse_message(m: Any, where: str, name: str) -> Message:
    if not isinstance(m, dict):
        raise DatasetError(f'{where}: {name}: must be an object with string "role" and "content"')
    for key in ("role", "content"):
        if not isinstance(m.get(key), str):
            got = "missing" if m.get(key) is None else f"a {type(m[key]).__name__}"
            raise DatasetError(f"{where}: {name}.{key}: must be a string ({got})")
    role, content = m["role"], m["content"]
    if role not in ROLES:
        raise DatasetError(f"{where}: {name}.role: {role!r} is not a role; roles are {', '.join(ROLES)}")
    return Message(role, content, parse_thinking(m, where, name, role, content))


def parse_thinking(m: dict[str, Any], where: str, name: str, role: str, content: str) -> str:
    given = [(key, m[key]) for key in THINKING_FIELDS if m.get(key) is not None]
    for key, value in given:
        if not isinstance(value, str):
            raise DatasetError(f"{where}: {name}.{key}: must be a string (a {type(value).__name__})")
        if role != "assistant":
            raise DatasetError(f"{where}: {name}.{key}: only assistant messages think; this one is {role}'s")
    if len(given) > 1:
        keys = " and ".join(f"{name}.{k}" for k, _ in given)
        raise DatasetError(f"{where}: {keys}: give the thinking once")
    marked = split_thinking(content)[0] if role == "assistant" else ""
    if given and marked:
        raise DatasetError(f"{where}: {name}.{given[0][0]}: the content has a thought channel too; keep one")
    return given[0][1].strip() if given else marked


def parse_messages(value: Any, where: str, name: str) -> list[Message]:
    if not isinstance(value, list):
        raise DatasetError(f"{where}: {name}: must be a list of messages (a {type(value).__name__})")
    return [parse_message(m, where, f"{name}[{i}]") for i, m in enumerate(value)]


def _pair(obj: dict[str, Any], where: str) -> list[Message]:
    """A prompt/completion record as messages: strings become a user turn and an assistant turn."""
    for key in ("prompt", "completion"):
        if obj.get(key) is None:
            raise DatasetError(
                f"{where}: {key}: missing; a prompt/completion record has both, like "
                '{"prompt": "...", "completion": "..."}'
            )
    prompt, completion = obj["prompt"], obj["completion"]
    if isinstance(prompt, str):
        asked = [Message("user", prompt)]
    elif isinstance(prompt, list):
        asked = parse_messages(prompt, where, "prompt")
    else:
        raise DatasetError(f"{where}: prompt: must be a string or a list of messages (a {type(prompt).__name__})")
    if not isinstance(completion, str | list):
        raise DatasetError(
            f"{where}: completion: must be a string or a list of messages (a {type(completion).__name__})"
        )
    if isinstance(completion, str):
        thinking = parse_thinking(obj, where, "completion", "assistant", completion)
        answer = [Message("assistant", completion, thinking)]
    else:
        answer = parse_messages(completion, where, "completion")
        bad = next((i for i, m in enumerate(answer) if m.role != "assistant"), None)
        if bad is not None:
            raise DatasetError(f"{where}: completion[{bad}].role: the completion holds assistant messages only")
    return asked + answer


def parse_object(obj: Any, where: str, position: int) -> Record:
    """One record (a JSON object or a Parquet row) -> a Record; raises DatasetError naming `where` and the
    field."""
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if v is not None}  # a Parquet row has every column, some null
    if not isinstance(obj, dict) or not ("messages" in obj or "prompt" in obj or "completion" in obj):
        raise DatasetError(
            f'{where}: expected an object with a "messages" list, like {{"messages": [...]}}, or a '
            '"prompt" and a "completion", like {"prompt": "...", "completion": "..."}'
        )
    if "messages" in obj:
        extra = [k for k in ("prompt", "completion") if k in obj]
        if extra:
            raise DatasetError(f'{where}: {extra[0]}: a record has "messages" or "prompt" and "completion", not both')
        messages = parse_messages(obj["messages"], where, "messages")
        name = "messages"
    else:
        messages = _pair(obj, where)
        name = "prompt"
    for i, m in enumerate(messages):
        if m.role == "system" and i != 0:
            raise DatasetError(f"{where}: {name}[{i}].role: a system message may only be the first")
    if not any(m.role == "assistant" for m in messages):
        raise DatasetError(f"{where}: {name}: no assistant message: nothing to learn from this record")
    if not any(m.role == "user" for m in messages):
        raise DatasetError(f"{where}: {name}: no user message")
    return Record(position, tuple(messages), obj.get("test"), where)


def parse_line(text: str, uri: str, line: int, parse: Parser = parse_object) -> Any:
    """One JSONL line -> a Record (or what `parse` makes of it; None for a blank line)."""
    if not text.strip():
        return None
    where = f"{uri}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    return parse(obj, where, line)


def file_format(uri: str, given: str | None = None) -> str:
    """jsonl or parquet: `given` (spec.dataset.format), else by the file's extension."""
    if given is not None:
        return given
    return "parquet" if uri.lower().endswith(PARQUET_SUFFIXES) else "jsonl"


def local_or_gcs(uri: str) -> str:
    """The storage module's form of a dataset URI: file:///a/b is the local path /a/b."""
    return uri[len(LOCAL_PREFIX) :] if uri.startswith(LOCAL_PREFIX) else uri


def _jsonl(data: bytes, uri: str, parse: Parser) -> Iterator[tuple[str, Any]]:
    """(where, a Record or the DatasetError of its line) per non-blank line."""
    for n, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{uri}:{n}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield where, DatasetError(f"{where}: not UTF-8 text")
            continue
        try:
            record = parse_line(text.rstrip("\r"), uri, n, parse)
        except DatasetError as e:
            yield where, e
            continue
        if record is not None:
            yield where, record


def _parquet(data: bytes, uri: str, field_name: str, parse: Parser) -> Iterator[tuple[str, Any]]:
    """(where, a Record or the DatasetError of its row) per row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{field_name}: {uri} is not a Parquet file ({e}); set spec.dataset.format") from None
    columns = set(table.column_names)
    if not columns & {"messages", "prompt", "completion"}:
        raise DatasetError(
            f"{uri}: no messages column and no prompt/completion columns (columns: {sorted(columns)}); a Parquet "
            "dataset has the JSONL record's keys as columns"
        )
    n = 0
    for batch in table.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            where = f"{uri} row {n}"
            try:
                yield where, parse(row, where, n)
            except DatasetError as e:
                yield where, e
            n += 1


def read_dataset(
    uri: str,
    field: str = "dataset.uri",
    fmt: str | None = None,
    skip_invalid: bool = False,
    parse: Parser = parse_object,
) -> Records:
    """Every record of the file at `uri` (JSONL or Parquet, by `fmt` or the extension), each made by `parse`
    (default: a chat or prompt/completion Record; data/preference.py's for preference pairs). Raises DatasetError
    naming `field` when the file cannot be read or has no usable record, and naming the file, line or row and
    the record's field for a malformed record unless `skip_invalid` (then it is counted in `skipped`)."""
    path = local_or_gcs(uri)
    try:
        data = storage.read_bytes(path)
    except storage.StorageError as e:
        raise DatasetError(f"{field}: cannot read {uri} ({e})") from e
    kind = file_format(uri, fmt)
    if kind not in FORMATS:
        raise DatasetError(f"{field}: unknown format {kind!r}; use one of {', '.join(FORMATS)}")
    items = _jsonl(data, uri, parse) if kind == "jsonl" else _parquet(data, uri, field, parse)
    out = Records([])
    for _, item in items:
        if isinstance(item, DatasetError):
            if not skip_invalid:
                raise item
            out.skipped.append(str(item))
        else:
            out.records.append(item)
    if not out.records:
        what = "one JSON record per line" if kind == "jsonl" else "one record per row"
        why = f" ({len(out.skipped)} malformed, skipped; the first: {out.skipped[0]})" if out.skipped else ""
        raise DatasetError(f"{field}: {uri} has no records{why}; it needs {what}")
    return out


def read_records(uri: str, field: str = "dataset.uri", fmt: str | None = None) -> list[Record]:
    """Every record of the file at `uri`; the first malformed one raises DatasetError."""
    return read_dataset(uri, field, fmt).records
