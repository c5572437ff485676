"""Datasets as people have them: prompt/completion records, Parquet files, file:// paths, malformed records
skipped and counted, the held-out split, and thinking kept. No JAX: records, the chat format and the plan only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from tests.fixtures.models import tiny_train_config
from tpuforge.api import DataOptions
from tpuforge_workloads.data.chat import ChatEncoder, TokenizerError
from tpuforge_workloads.data.records import DatasetError, Message, read_dataset, read_records
from tpuforge_workloads.data.split import split
from tpuforge_workloads.evaluate.records import read_examples
from tpuforge_workloads.train.plan import make_plan

CHATS = [
    {
        "messages": [
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": f"{2 * i}.", "thinking": f"Double {i}."},
        ]
    }
    for i in range(20)
]
PAIRS = [{"prompt": f"What is {i} + {i}?", "completion": f"{2 * i}.", "thinking": f"Double {i}."} for i in range(20)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def _jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_a_prompt_completion_pair_is_a_user_turn_and_an_answer_with_loss_on_the_answer(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    pairs = read_records(_jsonl(tmp_path / "pairs.jsonl", PAIRS))
    chats = read_records(_jsonl(tmp_path / "chats.jsonl", CHATS))
    assert [r.messages for r in pairs] == [r.messages for r in chats]
    assert pairs[3].messages == (Message("user", "What is 3 + 3?"), Message("assistant", "6.", "Double 3."))
    encoder = ChatEncoder(tokenizer)
    ids, mask = encoder.encode(pairs[3].messages)
    assert tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False) == "6.<turn|>"
    # Lists of messages, as conversational prompt/completion datasets hold them.
    listed = {
        "prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1 + 1?"}],
        "completion": [{"role": "assistant", "content": "2."}],
    }
    (record,) = read_records(_jsonl(tmp_path / "listed.jsonl", [listed]))
    assert [m.role for m in record.messages] == ["system", "user", "assistant"]


def test_parquet_holds_the_same_records_as_jsonl_by_extension_or_by_format(tmp_path: Path) -> None:
    want = [r.messages for r in read_records(_jsonl(tmp_path / "chats.jsonl", CHATS))]
    assert [r.messages for r in read_records(_parquet(tmp_path / "chats.parquet", CHATS))] == want
    assert [r.messages for r in read_records(_parquet(tmp_path / "pairs.pq", PAIRS))] == want
    odd = _parquet(tmp_path / "pairs.bin", PAIRS)
    with pytest.raises(DatasetError, match=r"pairs.bin:1: not"):
        read_records(odd)  # by its extension, JSONL
    assert [r.messages for r in read_records(odd, fmt="parquet")] == want
    with pytest.raises(DatasetError, match=r"dataset.uri: .*chats.jsonl is not a Parquet file"):
        read_records(str(tmp_path / "chats.jsonl"), fmt="parquet")
    with pytest.raises(
        DatasetError, match=r"no messages column and no prompt/completion columns \(columns: \['text'\]\)"
    ):
        read_records(_parquet(tmp_path / "text.parquet", [{"text": "hi"}]))


def test_a_malformed_parquet_row_is_named_by_file_row_and_field(tmp_path: Path) -> None:
    rows = [*PAIRS[:3], {"prompt": "Hi", "completion": None, "thinking": None}, *PAIRS[3:]]
    path = _parquet(tmp_path / "pairs.parquet", rows)
    with pytest.raises(DatasetError) as e:
        read_records(path)
    assert str(e.value).startswith(f"{path} row 3: completion: missing")
    bad = [{"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]}]
    path = _parquet(tmp_path / "chats.parquet", [*CHATS[:2], *bad])
    with pytest.raises(DatasetError, match=r"chats.parquet row 2: messages\[1\].role: 'bot' is not a role"):
        read_records(path)


def test_a_file_uri_is_the_local_path(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chats.jsonl", CHATS)
    assert [r.messages for r in read_records(f"file://{path}")] == [r.messages for r in read_records(path)]
    with pytest.raises(DatasetError, match=r"dataset\.uri: cannot read file:///no/such\.jsonl"):
        read_records("file:///no/such.jsonl")


def test_malformed_records_are_skipped_and_counted_when_asked(tmp_path: Path) -> None:
    rows: list[Any] = [*CHATS[:3], '{"messages": [', {"prompt": "only"}, *CHATS[3:5]]
    path = _jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(DatasetError, match=r"mixed.jsonl:4: not valid JSON"):
        read_dataset(path)
    got = read_dataset(path, skip_invalid=True)
    assert len(got.records) == 5 and [r.line for r in got.records] == [1, 2, 3, 6, 7]
    assert len(got.skipped) == 2
    assert got.skipped[0].startswith(f"{path}:4: not valid JSON")
    assert got.skipped[1].startswith(f"{path}:5: completion: missing")
    (tmp_path / "binary.jsonl").write_bytes(json.dumps(CHATS[0]).encode() + b"\n\xff\xfe\n")
    assert read_dataset(str(tmp_path / "binary.jsonl"), skip_invalid=True).skipped == [
        f"{tmp_path / 'binary.jsonl'}:2: not UTF-8 text"
    ]
    with pytest.raises(DatasetError, match=r"has no records \(2 malformed, skipped; the first: .*:1: not valid JSON"):
        read_dataset(_jsonl(tmp_path / "bad.jsonl", ["{", "[]"]), skip_invalid=True)


def test_the_held_out_split_is_deterministic_and_independent_of_order_and_file_format(tmp_path: Path) -> None:
    records = read_records(_jsonl(tmp_path / "chats.jsonl", CHATS))
    train, held = split(records, 0.1, seed=7, where="d")
    assert len(held) == 2 and len(train) == 18
    assert {r.messages for r in train} | {r.messages for r in held} == {r.messages for r in records}
    assert [r.line for r in train] == sorted(r.line for r in train)  # file order kept
    again = split(read_records(_parquet(tmp_path / "pairs.parquet", PAIRS)), 0.1, seed=7, where="d")[1]
    assert [r.messages for r in again] == [r.messages for r in held]
    shuffled = split(list(reversed(records)), 0.1, seed=7, where="d")[1]
    assert {r.messages for r in shuffled} == {r.messages for r in held}
    other_seeds = {tuple(r.messages for r in split(records, 0.1, seed=s, where="d")[1]) for s in range(8)}
    assert len(other_seeds) > 1
    assert len(split(records, 0.01, seed=0, where="d")[1]) == 1  # at least one record
    assert split(records, 0.0, seed=0, where="d") == (records, [])
    with pytest.raises(DatasetError, match=r"d: dataset.evalFraction=0.5 of 1 records leaves none to train on"):
        split(records[:1], 0.5, seed=0, where="d")


def test_copies_of_a_record_are_held_out_together_or_trained_on_together(tmp_path: Path) -> None:
    records = read_records(_jsonl(tmp_path / "chats.jsonl", CHATS))
    (first_held,) = split(records, 0.05, seed=7, where="d")[1]
    copies = [r for r in records if r.messages != first_held.messages] + [first_held] * 3
    train, held = split(copies, 0.05, seed=7, where="d")  # round(0.05 x 22) = 1, but its copies go with it
    assert [r.messages for r in held] == [first_held.messages] * 3
    assert first_held.messages not in {r.messages for r in train}
    with pytest.raises(DatasetError, match=r"holds out every record: the 3 records are copies of a few"):
        split([first_held] * 3, 0.3, seed=7, where="d")


def test_the_trainer_and_the_evaluation_hold_out_the_same_records(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows: list[Any] = [*CHATS, "not json"]
    uri = _jsonl(tmp_path / "chats.jsonl", rows)
    config = tiny_train_config(str(tiny_model_dir), f"file://{uri}", str(tmp_path / "ck"), max_steps=4)
    config.data = DataOptions(eval_fraction=0.2, split_seed=3, skip_invalid=True)
    plan = make_plan(config)
    assert (plan.stats.records, plan.stats.held_out, plan.stats.skipped_invalid) == (16, 4, 1)
    assert plan.eval_stats is not None and plan.eval_stats.records == 4
    assert plan.skipped_records == 1 and plan.skipped[0].startswith(f"file://{uri}:21: not valid JSON")
    held = read_examples(f"file://{uri}", 100, data=config.data, held_out=True)
    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    assert [encoder.encode(ex.record.messages)[0].tolist() for ex in held] == [
        e["tokens"].tolist() for e in plan.eval_examples
    ]
    # Without skipInvalid the same file fails before training, naming the line; the count is not reported.
    config.data = DataOptions(eval_fraction=0.2, split_seed=3)
    with pytest.raises(ValueError, match=r"chats.jsonl:21: not valid JSON"):
        make_plan(config)
    config.dataset_uri = str(tmp_path / "clean.jsonl")
    _jsonl(tmp_path / "clean.jsonl", CHATS)
    assert make_plan(config).skipped_records is None


CONVERSATION = (
    Message("system", "Answer with a number."),
    Message("user", "What is 2 + 2?"),
    Message("assistant", "4.", "Two and two make four."),
)


def test_thinking_is_dropped_by_default_and_trained_when_kept(tokenizer: Tokenizer) -> None:
    off = ChatEncoder(tokenizer)
    ids, mask = off.encode(CONVERSATION)
    assert off.encode((*CONVERSATION[:2], Message("assistant", "4.")))[0].tolist() == ids.tolist()
    on = ChatEncoder(tokenizer, keep_thinking=True)
    ids, mask = on.encode(CONVERSATION)
    learned = tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False)
    assert learned == "<|channel>thought\nTwo and two make four.<channel|>4.<turn|>"
    text = tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
    assert text.startswith("<bos><|turn>system\n<|think|>Answer with a number.<turn|>\n")
    # Thinking written in the content's thought channel is the same thinking.
    marked = Message("assistant", "<|channel>thought\nTwo and two make four.<channel|>4.")
    assert on.encode((*CONVERSATION[:2], marked))[0].tolist() == ids.tolist()
    # A record without thinking is rendered with thinking off, keepThinking or not.
    plain = (*CONVERSATION[:2], Message("assistant", "4."))
    assert on.encode(plain)[0].tolist() == off.encode(plain)[0].tolist()


def test_keeping_thinking_needs_a_thought_channel() -> None:
    from tokenizers import models

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(list(vocab))
    ChatEncoder(tok)
    with pytest.raises(
        TokenizerError, match=r"dataset\.keepThinking: the tokenizer \(gemma format\) has no thought markers"
    ):
        ChatEncoder(tok, keep_thinking=True)


def test_thinking_fields_are_checked(tmp_path: Path) -> None:
    both = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "thinking": "x", "reasoning_content": "y"},
        ]
    }
    with pytest.raises(DatasetError, match=r":1: messages\[1\].thinking and messages\[1\].reasoning_content: give"):
        read_records(_jsonl(tmp_path / "d.jsonl", [both]))
    for key in ("reasoning_content", "reasoning"):
        row = {"prompt": "q", "completion": "a", key: " why "}
        (record,) = read_records(_jsonl(tmp_path / "d.jsonl", [row]))
        assert record.messages[-1].thinking == "why"
