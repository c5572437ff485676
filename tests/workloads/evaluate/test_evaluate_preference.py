"""evaluate/preference.py's ranking: preference accuracy and mean margin of pairs, per token and summed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuforge_workloads.evaluate.preference import ranking


def test_per_token_and_summed_rankings_differ_when_answers_differ_in_length() -> None:
    # Pair 1: chosen 2 tokens at -1 each (-2), rejected 8 tokens at -0.5 each (-4): summed prefers chosen,
    # per token prefers rejected (-1 < -0.5). Pair 2: chosen -0.2/token over 2, rejected -1/token over 2.
    got = ranking([-2.0, -0.4], [2, 2], [-4.0, -2.0], [8, 2])
    assert got == {
        "pairs": 2,
        "accuracy": 0.5,
        "margin": round(((-1.0 + 0.5) + (-0.2 + 1.0)) / 2, 4),
        "summedAccuracy": 1.0,
        "summedMargin": round((2.0 + 1.6) / 2, 4),
    }


def test_a_tie_is_not_a_preference() -> None:
    assert ranking([-1.0], [1], [-1.0], [1])["accuracy"] == 0.0


def test_mismatched_or_empty_answers_are_refused() -> None:
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        ranking([-1.0, -2.0], [1, 1], [-1.0], [1])
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        ranking([], [], [], [])
    with pytest.raises(ValueError, match="at least one token"):
        ranking([-1.0], [0], [-1.0], [1])


PAIRS = Path(__file__).resolve().parents[3] / "examples" / "data" / "demo-preferences.jsonl"


@pytest.mark.slow
def test_the_tool_scores_the_pairs_the_trainer_holds_out_as_the_benchmark_scores_the_start(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np
    from tokenizers import Tokenizer

    from tests.fixtures.models import tiny_train_config
    from tpuforge.api import DataOptions, TrainConfig
    from tpuforge_workloads.data.chat import ChatEncoder
    from tpuforge_workloads.evaluate.preference import held_out_pairs, main
    from tpuforge_workloads.train.plan import make_plan

    base = tiny_train_config(str(tiny_model_dir), str(PAIRS), str(tmp_path / "ckpt"), packing=False, max_seq_len=128)
    config = TrainConfig.model_validate(
        base.model_dump() | {"method": "dpo", "data": DataOptions(eval_fraction=0.25).model_dump()}
    )
    trainer = make_plan(config, write_manifest=False).eval_examples
    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    mine = held_out_pairs(str(PAIRS), encoder, 0.25, 0, 128)
    assert len(mine) == len(trainer) == 32  # 16 pairs, chosen then rejected
    for a, b in zip(mine, trainer, strict=True):
        assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["loss_mask"], b["loss_mask"])

    # The base (where DPO and ORPO start) as benchmarks/preference.py scores it (docs/performance.md): 9 of 16
    # pairs by per-token log-probability, every pair by the summed one.
    assert main(["--pairs", str(PAIRS), "--eval-fraction", "0.25", "--model", f"start={tiny_model_dir}"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (row["model"], row["pairs"], row["accuracy"], row["summedAccuracy"]) == ("start", 16, 0.5625, 1.0)
    assert row["margin"] == pytest.approx(0.046, abs=0.001)
