"""The evaluation's loss program on the tiny Gemma 4: a trained adapter (the reference CLI run, exported by
the merge job) against its base, with the trainer's own code; and the inputs it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.models import RUNS_BUCKET, TrainingRun, eval_config
from tpuforge.api import MeshSpec
from tpuforge.api.configs import EvalConfig
from tpuforge.api.constants import COMPLETE_MARKER, EXIT_BAD_CONFIG
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate import loss

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
ROOT = Path(__file__).resolve().parents[3]


def run_cli(cfg: EvalConfig | str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    path = tmp / "eval.json"
    path.write_text(cfg if isinstance(cfg, str) else cfg.model_dump_json(by_alias=True))
    out, term = tmp / "loss.json", tmp / "termination-log"
    args = ["--config", str(path), "--out", str(out), "--termination-log", str(term)]
    proc = subprocess.run(
        [sys.executable, "-m", "tpuforge_workloads.evaluate.loss", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, out, term


def test_base_loss_is_the_trainers_own_and_the_adapter_lowers_it(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    """On the reference run's eval set, the base loss is what the trainer itself measured before its first
    step (Tunix evaluates the untrained LoRA model there); the trained adapter's loss is lower, and is what the
    trainer measured at its last step."""
    eval_uri = tiny_training_run.config.eval_uri
    assert eval_uri is not None
    proc, out, _ = run_cli(eval_config(tiny_training_run.config, exported_adapter, eval_uri, tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["step"] == tiny_training_run.config.training.max_steps
    per = result["perExample"]
    assert [p["index"] for p in per] == [0, 1, 2, 3] and result["examples"] == 4 and result["skipped"] == 0
    assert all(p["tokens"] > 0 for p in per)
    # Both are the mean over every loss token: the trainer's (padded batches of 2 rows) and this one's
    # (one record at a time).
    weighted = sum(p["baseLoss"] * p["tokens"] for p in per) / sum(p["tokens"] for p in per)
    assert result["baseLoss"] == pytest.approx(weighted, rel=1e-6)
    step0 = tiny_training_run.summary["attempts"][0]["eval_losses"]["0"]
    assert result["baseLoss"] == pytest.approx(step0, rel=1e-5)
    assert result["loss"] < result["baseLoss"]
    # The trained adapter too: the run (LoRA dropout 0.05) evaluates without dropout, as this does.
    last = tiny_training_run.summary["attempts"][0]["eval_losses"][str(result["step"])]
    assert result["loss"] == pytest.approx(last, rel=1e-5)


def test_trained_adapter_has_lower_loss_on_its_training_data(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    cfg = eval_config(tiny_training_run.config, exported_adapter, chat_dataset_gs, tmp_path, max_examples=24)
    result = loss.run_loss(cfg)
    assert result["examples"] == 24 and len(result["perExample"]) == 24
    assert result["loss"] < 0.8 * result["baseLoss"], result
    lower = sum(p["loss"] < p["baseLoss"] for p in result["perExample"])
    assert lower >= 20, result["perExample"]


def test_preference_accuracy_ranks_the_held_out_pairs_as_the_transformers_tool_does(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    """preferenceAccuracy: the demo's held-out pairs (evalFraction 0.25: 16) scored by the base (the untrained
    LoRA model) as evaluate/preference.py scores the base with transformers (9 of 16 per token, margin 0.046),
    and by the adapter (here the reference run's SFT adapter: the scoring does not care how it was trained)."""
    from tpuforge.api import DataOptions

    pairs = str(ROOT / "examples" / "data" / "demo-preferences.jsonl")
    training = tiny_training_run.config.training.model_copy(update={"max_seq_len": 128})
    cfg = eval_config(
        tiny_training_run.config,
        exported_adapter,
        chat_dataset_gs,
        tmp_path,
        max_examples=4,
        training=training,
        metrics=["preferenceAccuracy"],
        pairs_uri=pairs,
        pairs_held_out=True,
        data=DataOptions(eval_fraction=0.25),
    )
    p = loss.run_loss(cfg)["preference"]
    assert (p["pairs"], p["baseAccuracy"]) == (16, 0.5625)
    assert p["baseMargin"] == pytest.approx(0.046, abs=0.001)
    assert 0 <= p["accuracy"] <= 1 and p["margin"] != p["baseMargin"]


def test_too_long_records_are_skipped_as_training_would_drop_them(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    training = tiny_training_run.config.training.model_copy(update={"max_seq_len": 28, "over_length": "drop"})
    cfg = eval_config(
        tiny_training_run.config, exported_adapter, chat_dataset_gs, tmp_path, max_examples=8, training=training
    )
    step, prepared, _ = loss.check_inputs(cfg)
    assert step == tiny_training_run.config.training.max_steps
    skipped = [p for p in prepared if p.tokens is None]
    assert skipped and all("longer than training.maxSeqLen=28" in (p.skipped or "") for p in skipped)


def test_bad_inputs_are_named_before_any_model_loads(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    good = eval_config(tiny_training_run.config, exported_adapter, chat_dataset_gs, tmp_path)
    # An adapter directory without its marker: not ready, exit 1, the reason in the termination log.
    uncommitted = f"gs://{RUNS_BUCKET}/uncommitted/adapter"
    for name in storage.list_files(exported_adapter):
        if name != COMPLETE_MARKER:
            storage.write_bytes(
                storage.join(uncommitted, name), storage.read_bytes(storage.join(exported_adapter, name))
            )
    cases = [
        (good.model_copy(update={"adapter_uri": uncommitted}), 1, "has no _COMPLETE marker: the export has not"),
        (
            good.model_copy(update={"lora": good.lora.model_copy(update={"rank": 4})}),
            2,
            "lora.rank is 4 but the adapter",
        ),
        (good.model_copy(update={"base_model_uri": str(tmp_path)}), 2, "baseModelUri: cannot read its config.json"),
        (good.model_copy(update={"dataset_uri": str(tmp_path / "none.jsonl")}), 2, "datasetUri: cannot read"),
        (good.model_copy(update={"mesh": MeshSpec(fsdp=1, tp=3)}), 2, "tp=3"),
    ]
    for i, (cfg, code, message) in enumerate(cases):
        path = tmp_path / f"c{i}.json"
        path.write_text(cfg.model_dump_json(by_alias=True))
        out, term = tmp_path / f"out{i}.json", tmp_path / f"term{i}"
        got = loss.main(["--config", str(path), "--out", str(out), "--termination-log", str(term)])
        assert (got, message in term.read_text()) == (code, True), term.read_text()
        assert not out.exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.model_dump_json(by_alias=True)), "maxExamples": 0}))
    assert (
        loss.main(["--config", str(bad), "--out", str(tmp_path / "o.json"), "--termination-log", str(tmp_path / "t")])
        == EXIT_BAD_CONFIG
    )
    assert "maxExamples: Input should be greater than or equal to 1" in (tmp_path / "t").read_text()
