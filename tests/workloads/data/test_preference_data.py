"""Preference records (spec.method dpo/orpo): the formats users have (plain text, chat messages, JSONL,
Parquet), bad records named or skipped, pairs rendered in the chat format with loss on the answers alone,
kept together through the over-length policy, shuffling, batching and the held-out split. No JAX."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import BatchSpec, MicroBatches, eval_batches
from tpuforge_workloads.data.preference import PreferenceRecord, parse_preference, prepare_pairs
from tpuforge_workloads.data.records import DatasetError, Message, read_dataset
from tpuforge_workloads.data.split import split

PLAIN = {"prompt": "What is the capital of Peru?", "chosen": "Lima.", "rejected": "Quito."}
CHAT = {
    "prompt": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima."},
        {"role": "user", "content": "And of Chile?"},
    ],
    "chosen": {"role": "assistant", "content": "Santiago."},
    "rejected": [{"role": "assistant", "content": "Valparaiso."}],
}


@pytest.fixture(scope="module")
def encoder(tiny_model_dir: Path) -> ChatEncoder:
    return ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))


def _write(path: Path, rows: list[object]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_plain_text_and_chat_records_parse_into_prompt_and_answers() -> None:
    plain = parse_preference(PLAIN, "f:1", 1)
    assert plain.prompt == (Message("user", PLAIN["prompt"]),)
    assert plain.chosen == (Message("assistant", "Lima."),) and plain.rejected == (Message("assistant", "Quito."),)
    chat = parse_preference(CHAT, "f:2", 2)
    assert [m.role for m in chat.prompt] == ["system", "user", "assistant", "user"]
    assert chat.chosen[0].content == "Santiago." and chat.rejected[0].content == "Valparaiso."
    chosen_row, rejected_row = chat.rows()
    assert chosen_row.messages == (*chat.prompt, *chat.chosen) and rejected_row.messages[-1] == chat.rejected[0]


@pytest.mark.parametrize(
    ("record", "named"),
    [
        ({"prompt": "q", "chosen": "a"}, "f:3: rejected: missing"),
        ({"messages": [{"role": "user", "content": "q"}]}, "f:3: prompt: missing"),
        ({"prompt": 7, "chosen": "a", "rejected": "b"}, "f:3: prompt: must be a string or a list of messages"),
        ({"prompt": "q", "chosen": "a", "rejected": "a"}, "f:3: rejected: the same as chosen"),
        ({"prompt": "q", "chosen": {"role": "user", "content": "a"}, "rejected": "b"}, "f:3: chosen: holds assistant"),
        ({"prompt": [{"role": "assistant", "content": "x"}], "chosen": "a", "rejected": "b"}, "prompt[0].role"),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, "f:3: chosen: empty answer"),
    ],
)
def test_a_bad_record_is_named_with_its_field(record: dict[str, object], named: str) -> None:
    with pytest.raises(DatasetError) as info:
        parse_preference(record, "f:3", 3)
    assert named in str(info.value)


def test_a_file_s_bad_records_stop_the_run_or_are_skipped_and_counted(tmp_path: Path) -> None:
    uri = _write(tmp_path / "pairs.jsonl", [PLAIN, "{not json", {"prompt": "q", "chosen": "a"}, CHAT])
    with pytest.raises(DatasetError, match=r"pairs.jsonl:2: not valid JSON"):
        read_dataset(uri, parse=parse_preference)
    got = read_dataset(uri, parse=parse_preference, skip_invalid=True)
    assert [r.line for r in got.records] == [1, 4] and len(got.skipped) == 2
    assert "pairs.jsonl:3: rejected: missing" in got.skipped[1] and "preference records like" in got.skipped[1]


def test_an_sft_file_given_to_a_preference_job_says_what_records_it_needs(tmp_path: Path) -> None:
    uri = _write(tmp_path / "sft.jsonl", [{"prompt": "q", "completion": "a"}])
    with pytest.raises(DatasetError, match=r"sft.jsonl:1: chosen: missing .*\"chosen\": \"...\", \"rejected\""):
        read_dataset(uri, parse=parse_preference)


def test_parquet_preference_records(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([PLAIN, {**PLAIN, "prompt": "Capital of Chile?"}]), path)
    got = read_dataset(str(path), parse=parse_preference).records
    assert [r.prompt[0].content for r in got] == [PLAIN["prompt"], "Capital of Chile?"]


def test_rows_carry_loss_on_the_answer_alone_and_share_the_prompt(encoder: ChatEncoder) -> None:
    record = parse_preference(CHAT, "f:1", 1)
    examples, stats = prepare_pairs([record], encoder, 256, "drop", "f")
    assert stats.records == 1 and stats.examples == 2
    chosen, rejected = examples
    for example, answer in ((chosen, record.chosen), (rejected, record.rejected)):
        full, full_mask = encoder.encode((*record.prompt, *answer))
        np.testing.assert_array_equal(example["tokens"], full)
        start = int(np.flatnonzero(example["loss_mask"])[0])
        # The prompt's own assistant turn ("Lima.") carries no loss; the answer's tokens all do.
        assert full_mask[:start].any() and not example["loss_mask"][:start].any()
        assert example["loss_mask"][start:].sum() == full_mask[start:].sum()
        answer_ids = encoder.tokenizer.encode(answer[0].content, add_special_tokens=False).ids
        assert list(example["tokens"][start : start + len(answer_ids)]) == answer_ids
    first = int(np.flatnonzero(chosen["loss_mask"])[0])
    np.testing.assert_array_equal(chosen["tokens"][:first], rejected["tokens"][:first])


def test_a_pair_is_dropped_or_truncated_as_a_whole(encoder: ChatEncoder) -> None:
    short = parse_preference(PLAIN, "f:1", 1)
    long = parse_preference({**PLAIN, "rejected": "Quito " * 40, "prompt": "Capital?"}, "f:2", 2)
    limit = max(len(e["tokens"]) for e in prepare_pairs([short], encoder, 512, "drop", "f")[0])
    examples, stats = prepare_pairs([short, long], encoder, limit, "drop", "f")
    assert len(examples) == 2 and stats.dropped_over_length == 1
    examples, stats = prepare_pairs([short, long], encoder, limit, "truncate", "f")
    assert len(examples) == 4 and stats.truncated == 1 and all(len(e["tokens"]) <= limit for e in examples)
    with pytest.raises(DatasetError, match=r"f: no preference pair .* raise maxSeqLen"):
        prepare_pairs([long], encoder, limit, "drop", "f")


def test_batches_hold_whole_pairs_chosen_then_rejected_in_every_epoch(encoder: ChatEncoder) -> None:
    records = [
        parse_preference({"prompt": f"Question {i}?", "chosen": f"Right {i}.", "rejected": f"Wrong {i}."}, "f", i)
        for i in range(5)
    ]
    examples, _ = prepare_pairs(records, encoder, 64, "drop", "f")
    spec = BatchSpec(max_seq_len=64, rows=4, packing=False, seed=3, pad_id=0, epochs=2, group=2)
    source = MicroBatches(examples, spec)
    assert len(source) == 5  # 10 pairs over two epochs, 2 a batch
    seen = []
    for i in range(len(source)):
        batch = source[i]
        for row in range(0, 4, 2):
            chosen, rejected = (encoder.tokenizer.decode(batch["input_tokens"][row + k].tolist()) for k in (0, 1))
            n = chosen.split("Question ")[1][0]
            assert f"Right {n}." in chosen and f"Wrong {n}." in rejected and f"Question {n}?" in rejected
            seen.append(n)
    assert sorted(seen[:5]) == sorted(seen[5:]) == ["0", "1", "2", "3", "4"]
    assert seen[:5] != ["0", "1", "2", "3", "4"]  # shuffled by pair
    evals = eval_batches(examples[:6], 4, 64, 0)
    assert len(evals) == 2 and not evals[1]["input_mask"][2:].any()  # the last pair slot is empty


def test_the_held_out_split_keeps_pairs_whole_and_is_the_same_each_time() -> None:
    records = [
        PreferenceRecord(i, (Message("user", f"q{i}"),), (Message("assistant", "a"),), (Message("assistant", "b"),))
        for i in range(20)
    ]
    train, held = split(records, 0.2, 7, "f")
    assert len(held) == 4 and len(train) == 16 and split(records, 0.2, 7, "f") == (train, held)
    assert not {r.line for r in train} & {r.line for r in held}


def test_the_demo_preference_set_is_the_generator_s_and_reads_as_preference_pairs() -> None:
    from tpuforge_workloads.data import demo

    path = Path(__file__).resolve().parents[3] / "examples" / "data" / "demo-preferences.jsonl"
    assert path.read_text() == demo.jsonl(demo.preference_records())
    records = read_dataset(str(path), parse=parse_preference).records
    assert len(records) == 64 and {len(r.prompt) for r in records} == {1, 2}
    assert all(r.chosen != r.rejected for r in records)
