"""Chat formatting, loss masks, over-length policy, shuffling, packing and the Grain iterator state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tpuforge_workloads.data import demo
from tpuforge_workloads.data.chat import ChatEncoder, ChatTokens, TokenizerError
from tpuforge_workloads.data.pipeline import (
    BATCH_ARRAYS,
    BatchSpec,
    batches,
    count_batches,
    eval_batches,
    prepare_examples,
    real_tokens,
)
from tpuforge_workloads.data.records import DatasetError, Message, Record, parse_line, read_records

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def _records(rows: list[dict[str, object]]) -> list[Record]:
    out = []
    for i, r in enumerate(rows):
        rec = parse_line(json.dumps(r), "mem", i + 1)
        assert rec is not None
        out.append(rec)
    return out


CONVERSATION = (
    Message("system", "You answer geography questions in one sentence."),
    Message("user", "What is the capital of Peru?"),
    Message("assistant", "The capital of Peru is Lima."),
    Message("user", "And of Chile?"),
    Message("assistant", "The capital of Chile is Santiago."),
)


def test_loss_mask_covers_exactly_the_assistant_tokens(tokenizer: Tokenizer) -> None:
    ids, mask = ChatEncoder(tokenizer).encode(CONVERSATION)
    t = ChatTokens.of(tokenizer)

    def text(s: str) -> list[int]:
        return list(tokenizer.encode(s, add_special_tokens=False).ids)

    # The expected sequence, built turn by turn, with the tokens that must carry loss marked.
    # The final answer follows the generation prompt, which closes an empty thought channel.
    assert t.channel is not None
    expected: list[tuple[int, bool]] = [(t.bos, False)]
    for n, m in enumerate(CONVERSATION):
        role = "model" if m.role == "assistant" else m.role
        learn = m.role == "assistant"
        expected += [(i, False) for i in [t.turn_start, *text(f"{role}\n")]]
        if n == len(CONVERSATION) - 1:
            expected += [(i, False) for i in [t.channel[0], *text("thought\n"), t.channel[1]]]
        expected += [(i, learn) for i in [*text(m.content), t.turn_end]]
        expected += [(i, False) for i in text("\n")]
    assert list(zip(ids.tolist(), mask.tolist(), strict=True)) == expected
    learned = tokenizer.decode([int(i) for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert learned == "The capital of Peru is Lima.<turn|>The capital of Chile is Santiago.<turn|>"


def test_loss_on_all_covers_every_token_but_bos(tokenizer: Tokenizer) -> None:
    ids, mask = ChatEncoder(tokenizer, loss_on="all").encode(CONVERSATION)
    assert not mask[0] and mask[1:].all() and ids[0] == ChatTokens.of(tokenizer).bos


def test_older_gemma_markers_fold_the_system_prompt_into_the_first_user_turn() -> None:
    from tokenizers import models

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(list(vocab))
    enc = ChatEncoder(tok)
    assert not enc.tokens.system_turn
    assert enc.turns(CONVERSATION[:3]) == [
        ("user", "You answer geography questions in one sentence.\n\nWhat is the capital of Peru?"),
        ("assistant", "The capital of Peru is Lima."),
    ]


def test_a_tokenizer_without_turn_markers_is_rejected() -> None:
    from tokenizers import models

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}, unk_token="<unk>"))
    with pytest.raises(TokenizerError, match="no turn markers"):
        ChatTokens.of(tok)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[1, 2]", 'expected an object with a "messages" list'),
        ('{"messages": [{"role": "user"}]}', "messages[0].content: must be a string (missing)"),
        ('{"messages": [{"role": "bot", "content": "a"}]}', "messages[0].role: 'bot' is not a role"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}',
            "may only be the first",
        ),
        ('{"prompt": "a"}', "completion: missing"),
        ('{"prompt": 3, "completion": "b"}', "prompt: must be a string or a list of messages (a int)"),
        ('{"prompt": "a", "completion": [{"role": "user", "content": "b"}]}', "completion[0].role: the completion"),
        ('{"messages": [], "prompt": "a"}', 'prompt: a record has "messages" or "prompt"'),
        ('{"messages": [{"role": "user", "content": "a", "thinking": "x"}]}', "messages[0].thinking: only assistant"),
        ('{"messages": [{"role": "user", "content": "a"}]}', "no assistant message"),
        ('{"messages": [{"role": "assistant", "content": "a"}]}', "no user message"),
        ('{"messages": "hi"', "not valid JSON"),
    ],
)
def test_malformed_records_name_the_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    good = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    path = tmp_path / "d.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    with pytest.raises(DatasetError) as e:
        read_records(str(path))
    assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value)


def test_over_length_records_are_dropped_or_truncated_and_counted(tokenizer: Tokenizer) -> None:
    enc = ChatEncoder(tokenizer)
    records = _records(demo.records()[:20])
    lengths = [len(enc.encode(r.messages)[0]) for r in records]
    limit = int(np.median(lengths))
    longer = sum(n > limit for n in lengths)
    kept, stats = prepare_examples(records, enc, limit, "drop", "d")
    assert (stats.dropped_over_length, stats.examples, len(kept)) == (longer, 20 - longer, 20 - longer)
    kept, stats = prepare_examples(records, enc, limit, "truncate", "d")
    assert stats.truncated == longer and stats.examples + stats.dropped_no_loss == 20
    assert max(len(e["tokens"]) for e in kept) == limit


def test_a_dataset_with_nothing_within_the_length_limit_is_rejected(tokenizer: Tokenizer) -> None:
    records = _records(demo.records()[:5])
    with pytest.raises(DatasetError, match=r"all 5 records are longer than training\.maxSeqLen=4 tokens"):
        prepare_examples(records, ChatEncoder(tokenizer), 4, "drop", "d")
    with pytest.raises(DatasetError, match="no record has an assistant token within the first 4 tokens"):
        prepare_examples(records, ChatEncoder(tokenizer), 4, "truncate", "d")


@pytest.fixture(scope="module")
def examples(tokenizer: Tokenizer) -> list[dict[str, np.ndarray]]:
    return prepare_examples(_records(demo.records()), ChatEncoder(tokenizer), 64, "drop", "demo")[0]


def _spec(**kw: object) -> BatchSpec:
    args: dict[str, object] = {"max_seq_len": 64, "rows": 4, "packing": False, "seed": 0, "pad_id": 0, "epochs": 2}
    args.update(kw)
    return BatchSpec(**args)  # type: ignore[arg-type]


def _firsts(spec: BatchSpec, examples: list[dict[str, np.ndarray]], n: int) -> list[bytes]:
    it = iter(batches(examples, spec))
    return [next(it)["input_tokens"].tobytes() for _ in range(n)]


def test_shuffling_is_deterministic_by_seed_and_differs_per_epoch(examples: list[dict[str, np.ndarray]]) -> None:
    assert _firsts(_spec(), examples, 5) == _firsts(_spec(), examples, 5)
    assert _firsts(_spec(), examples, 5) != _firsts(_spec(seed=1), examples, 5)
    per_epoch = len(examples) // 4
    all_batches = [b["input_tokens"] for b in batches(examples, _spec())]
    assert len(all_batches) == count_batches(examples, _spec()) == 2 * per_epoch
    first = np.concatenate(all_batches[:per_epoch])
    second = np.concatenate(all_batches[per_epoch:])
    assert sorted(map(bytes, first)) == sorted(map(bytes, second))  # each epoch has every example once
    assert not np.array_equal(first, second)  # in another order


@pytest.mark.parametrize("packing", [False, True])
def test_a_restored_iterator_continues_with_the_same_batches(
    examples: list[dict[str, np.ndarray]], packing: bool
) -> None:
    spec = _spec(packing=packing)
    it = iter(batches(examples, spec))
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint item
    expected = [next(it) for _ in range(4)]
    resumed = iter(batches(examples, spec))
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        assert all(np.array_equal(got[k], want[k]) for k in want)


def test_packed_rows_have_per_example_segments_positions_and_masks(examples: list[dict[str, np.ndarray]]) -> None:
    spec = _spec(packing=True, epochs=1)
    rows = [b for batch in batches(examples, spec) for b in zip(*(batch[k] for k in sorted(BATCH_ARRAYS)), strict=True)]
    by_tokens = {e["tokens"].tobytes(): e for e in examples}
    seen = 0
    for input_mask, input_tokens, positions, segment_ids in rows:
        for seg in range(1, segment_ids.max() + 1):
            where = np.flatnonzero(segment_ids == seg)
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1))  # contiguous
            assert np.array_equal(positions[where], np.arange(len(where)))
            original = by_tokens[input_tokens[where].tobytes()]  # an example, whole
            assert np.array_equal(input_mask[where], original["loss_mask"])
            seen += 1
        assert not input_mask[segment_ids == 0].any() and (input_tokens[segment_ids == 0] == 0).all()
    assert seen > len(rows)  # several examples per row
    assert seen >= len(examples) - 4 * spec.rows  # all but the last (dropped) partial batch


def test_eval_batches_fill_the_last_batch_with_empty_rows(examples: list[dict[str, np.ndarray]]) -> None:
    out = eval_batches(examples[:5], rows=4, max_seq_len=64, pad_id=0)
    assert len(out) == 2 and out[1]["input_tokens"].shape == (4, 64)
    assert sum(real_tokens(b) for b in out) == sum(len(e["tokens"]) for e in examples[:5])
    assert not out[1]["input_mask"][1:].any()


def test_the_demo_dataset_file_is_the_demo_task() -> None:
    path = ROOT / "examples" / "data" / "demo-chat.jsonl"
    assert path.read_text() == demo.jsonl(demo.records())
    assert len(read_records(str(path))) == len(demo.CAPITALS) * len(demo.QUESTIONS)


@pytest.mark.parametrize("task", sorted(demo.TASKS))
def test_the_demo_task_files_are_written_from_the_tasks(task: str) -> None:
    t = demo.TASKS[task]
    train = "demo-chat" if t is demo.CAPITALS_TASK else f"demo-{task}"
    data = ROOT / "examples" / "data"
    assert (data / f"{train}.jsonl").read_text() == demo.jsonl(demo.records(t))
    assert (data / f"{train}-eval.jsonl").read_text() == demo.jsonl(demo.eval_records(t))
    rows = read_records(str(data / f"{train}-eval.jsonl"))
    assert len(rows) == len(t.facts)
