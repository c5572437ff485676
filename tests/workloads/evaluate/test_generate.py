"""Greedy generation with transformers from a model directory, as the demo compares base and fine-tuned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuforge_workloads.evaluate import compare as generate

pytestmark = pytest.mark.slow


def test_answers_are_greedy_and_formatted_as_the_trainer_formats_a_user_turn(tiny_model_dir: Path) -> None:
    prompts = ["What is the capital of Peru?", "Capital of Japan?"]
    first = generate.answers([("base", str(tiny_model_dir))], prompts, max_new_tokens=6)
    again = generate.answers([("base", str(tiny_model_dir))], prompts, max_new_tokens=6)
    assert [(r["model"], r["prompt"]) for r in first] == [("base", p) for p in prompts]
    assert first == again  # greedy: the same answer every time
    # The prompt is the trainer's encoding of a user turn plus the opening of the model's turn, and that is
    # exactly what the model's chat template renders (the template vLLM applies to chat requests).
    from transformers import AutoTokenizer

    from tpuforge_workloads.data.records import Message

    ids = generate.Generator(tiny_model_dir).encoder.prompt([Message("user", prompts[0])]).tolist()
    rendered = AutoTokenizer.from_pretrained(str(tiny_model_dir)).apply_chat_template(
        [{"role": "user", "content": prompts[0]}], add_generation_prompt=True, tokenize=True
    )
    assert ids == list(getattr(rendered, "input_ids", rendered))


def test_the_cli_prints_one_json_line_per_answer_and_names_a_bad_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tpuforge_workloads.evaluate.compare", "--max-new-tokens", "4"]
    out = subprocess.run(
        [*cmd, "--model", f"tiny={tiny_model_dir}", "Capital of Peru?"], capture_output=True, text=True, check=True
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["model"], r["prompt"]) for r in rows] == [("tiny", "Capital of Peru?")]
    bad = subprocess.run([*cmd, "--model", "no-equals-sign", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected NAME=URI" in bad.stderr
    empty = subprocess.run([*cmd, "--model", f"x={tmp_path}", "x"], capture_output=True, text=True)
    assert empty.returncode == 1 and f"{tmp_path}: no tokenizer.json" in empty.stderr
