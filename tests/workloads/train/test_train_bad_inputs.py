"""Bad input fails fast: the trainer CLI exits with EXIT_BAD_CONFIG before training, and the termination
message names the file, line or field and what to change."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.models import TrainerProcess, tiny_train_config
from tpuforge.api import MeshSpec, TrainConfig
from tpuforge.api.constants import EXIT_BAD_CONFIG

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def _dataset(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def malformed_json(tmp: Path, cfg: TrainConfig) -> str:
    cfg.dataset_uri = _dataset(tmp, [json.dumps(GOOD), json.dumps(GOOD), '{"messages": [', json.dumps(GOOD)])
    return f"{cfg.dataset_uri}:3: not valid JSON"


def unknown_role(tmp: Path, cfg: TrainConfig) -> str:
    bad = {"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello."}]}
    cfg.dataset_uri = _dataset(tmp, [json.dumps(GOOD), json.dumps(bad)])
    return f"{cfg.dataset_uri}:2: messages[1].role: 'bot' is not a role; roles are system, user, assistant"


def empty_dataset(tmp: Path, cfg: TrainConfig) -> str:
    cfg.dataset_uri = _dataset(tmp, ["", "  "])
    return "has no records"


def all_over_length(tmp: Path, cfg: TrainConfig) -> str:
    cfg.training.max_seq_len = 8
    return "all 192 records are longer than training.maxSeqLen=8 tokens"


def heads_not_divisible(tmp: Path, cfg: TrainConfig) -> str:
    cfg.mesh = MeshSpec(fsdp=1, tp=3)
    return "mesh.tp=3 does not divide the model's 8 query heads, 4 kv heads, 4 global kv heads; use tp in [1, 2, 4]"


def unreachable_model(tmp: Path, cfg: TrainConfig) -> str:
    cfg.model_uri = "gs://no-such-bucket/gemma4-tiny"
    return "model.uri: cannot read gs://no-such-bucket/gemma4-tiny/config.json"


def unreachable_dataset(tmp: Path, cfg: TrainConfig) -> str:
    cfg.dataset_uri = "gs://no-such-bucket/data.jsonl"
    return "dataset.uri: cannot read gs://no-such-bucket/data.jsonl"


def mesh_larger_than_host(tmp: Path, cfg: TrainConfig) -> str:
    cfg.mesh = MeshSpec(fsdp=2, tp=4)
    return "mesh fsdp=2 x tp=4 needs 8 devices but this host has 4"


def resume_with_another_alpha(tmp: Path, cfg: TrainConfig) -> str:
    from tpuforge_workloads.model import lora

    earlier = cfg.lora.model_copy(update={"alpha": 2 * cfg.lora.alpha})
    lora.write_manifest(cfg.checkpoint.uri, lora.manifest(cfg.model_name, cfg.model_uri, earlier))
    return f"holds checkpoints of another adapter: lora.alpha {2 * cfg.lora.alpha} (checkpoints) vs {cfg.lora.alpha}"


def model_not_yet_trained(tmp: Path, cfg: TrainConfig) -> str:
    cfg.model_name = "gemma4-26b-a4b"  # in the catalog for sizing; the trainer refuses it before reading anything
    return "modelName gemma4-26b-a4b: the trainer does not support it yet"


CASES: list[Callable[[Path, TrainConfig], str]] = [
    model_not_yet_trained,
    resume_with_another_alpha,
    malformed_json,
    unknown_role,
    empty_dataset,
    all_over_length,
    heads_not_divisible,
    unreachable_model,
    unreachable_dataset,
    mesh_larger_than_host,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_exits_with_the_reason(
    case: Callable[[Path, TrainConfig], str], tmp_path: Path, tiny_model_dir: Path, chat_dataset: Path, gcs: Any
) -> None:
    config = tiny_train_config(str(tiny_model_dir), str(chat_dataset), str(tmp_path / "checkpoints"))
    expected = case(tmp_path, config)
    trainer = TrainerProcess(config, tmp_path)
    assert trainer.run(timeout=120) == EXIT_BAD_CONFIG, trainer.output()
    message = trainer.termination_message()
    assert message.startswith("Bad config: "), message
    assert expected in message, message
    assert not any((tmp_path / "checkpoints").glob("[0-9]*"))  # nothing trained, nothing saved


def test_a_config_with_unknown_or_missing_fields_names_them(tmp_path: Path) -> None:
    from tpuforge_workloads.train.__main__ import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"modelName": "gemma4-tiny", "trainingg": {}}))
    assert main(["--config", str(config), "--termination-log", str(tmp_path / "log")]) == EXIT_BAD_CONFIG
    message = (tmp_path / "log").read_text()
    assert "config.trainingg: is not a known field" in message
    assert "config.modelUri: is required" in message
