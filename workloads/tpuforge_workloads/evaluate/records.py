"""The evaluation set: the first `max_examples` records of a file (or of the records spec.dataset.evalFraction
holds out of the training file, as the trainer holds them out), each split into the prompt (every turn before
the last assistant turn) and the reference answer (that turn's content)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuforge.api import DataOptions
from tpuforge.api.configs import EvalConfig
from tpuforge_workloads.data import split as held_out_split
from tpuforge_workloads.data.records import DatasetError, Message, Record, read_dataset


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
        raise DatasetError(f"{record.where or uri}: no user turn before the last assistant turn: nothing to ask")
    return EvalExample(index, record, prompt, record.messages[last].content)


def read_examples(
    uri: str, max_examples: int, field: str = "datasetUri", data: DataOptions | None = None, held_out: bool = False
) -> list[EvalExample]:
    """Raises DatasetError naming the file and line of a record that cannot be used. `held_out`: the records
    `data` holds out of the file, not all of them."""
    d = data or DataOptions()
    records = read_dataset(uri, field, d.format, d.skip_invalid).records
    if held_out:
        records = held_out_split.split(records, d.eval_fraction, d.split_seed, uri)[1]
    return [split(r, i, uri) for i, r in enumerate(records[:max_examples])]


def config_examples(cfg: EvalConfig) -> list[EvalExample]:
    """The evaluation set of an evaluation config."""
    return read_examples(cfg.dataset_uri, cfg.max_examples, data=cfg.data, held_out=cfg.held_out)
