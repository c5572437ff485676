"""The evaluation set: the first `max_examples` chat records of a JSONL file, each split into the prompt
(every turn before the last assistant turn) and the reference answer (that turn's content)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuforge_workloads.data.records import DatasetError, Message, Record, read_records


@dataclass(frozen=True)
class EvalExample:
    index: int  # 0-based position in the evaluation set
    record: Record  # the whole record: the loss scores it as training would
    prompt: tuple[Message, ...]
    reference: str

    @property
    def test(self) -> Any:
        return self.record.test

    def prompt_json(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.prompt]


def split(record: Record, index: int, uri: str) -> EvalExample:
    last = max(i for i, m in enumerate(record.messages) if m.role == "assistant")
    prompt = record.messages[:last]
    if not any(m.role == "user" for m in prompt):
        raise DatasetError(f"{uri}:{record.line}: no user turn before the last assistant turn: nothing to ask")
    return EvalExample(index, record, prompt, record.messages[last].content)


def read_examples(uri: str, max_examples: int, field: str = "datasetUri") -> list[EvalExample]:
    """Raises DatasetError naming the file and line of a record that cannot be used."""
    return [split(r, i, uri) for i, r in enumerate(read_records(uri, field)[:max_examples])]
