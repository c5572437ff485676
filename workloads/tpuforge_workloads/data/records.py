"""Chat records from a JSONL file: one `{"messages": [{"role": ..., "content": ...}, ...]}` per line.

Every line is checked before training starts; the first malformed one stops the run with the file, the
line number and what is wrong with it. Blank lines are allowed and skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tpuforge_workloads import storage

ROLES = ("system", "user", "assistant")


class DatasetError(ValueError):
    """A dataset the trainer cannot use; the message names the file (and line) and the fix."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line number in the file, for error messages
    messages: tuple[Message, ...]
    # The record's "test" object, for functional evaluation: opaque here, handed to the checker as it is.
    test: Any = field(default=None, compare=False, hash=False)


def parse_line(text: str, uri: str, line: int) -> Record | None:
    """One JSONL line -> a Record (None for a blank line)."""
    if not text.strip():
        return None
    where = f"{uri}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise DatasetError(f'{where}: expected an object with a "messages" list, like {{"messages": [...]}}')
    messages = []
    for i, m in enumerate(obj["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetError(f'{where}: message {i} must be an object with string "role" and "content"')
        if m["role"] not in ROLES:
            raise DatasetError(f"{where}: message {i} has role {m['role']!r}; roles are {', '.join(ROLES)}")
        if m["role"] == "system" and i != 0:
            raise DatasetError(f"{where}: message {i} is a system message; only the first message may be one")
        messages.append(Message(m["role"], m["content"]))
    if not any(m.role == "assistant" for m in messages):
        raise DatasetError(f"{where}: no assistant message: nothing to learn from this record")
    if not any(m.role == "user" for m in messages):
        raise DatasetError(f"{where}: no user message")
    return Record(line, tuple(messages), obj.get("test"))


def read_records(uri: str, field: str = "dataset.uri") -> list[Record]:
    """Every record of the JSONL file at `uri`; raises DatasetError naming `field` when it cannot be read."""
    try:
        data = storage.read_bytes(uri)
    except storage.StorageError as e:
        raise DatasetError(f"{field}: cannot read {uri} ({e})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DatasetError(f"{uri}:{line}: not UTF-8 text") from None
    records = []
    for n, line_text in enumerate(text.splitlines(), start=1):
        record = parse_line(line_text, uri, n)
        if record is not None:
            records.append(record)
    if not records:
        raise DatasetError(f"{field}: {uri} has no records; it needs one JSON chat record per line")
    return records
