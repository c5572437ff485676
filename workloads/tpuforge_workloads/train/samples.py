"""Sample answers at each in-training evaluation: a few held-out prompts answered greedily by the model as it
is, LoRA weights of the step just taken, so a run shows what it has learnt as well as its loss.

The prompts are the first records of the eval set (training.evalSamples of them), laid out as
tpuforge_workloads.evaluate.compare lays out a prompt: one conversation up to its last assistant turn, through the
trainer's chat encoder and its generation prompt, the answer stopping at the end of the model's turn. The
decoding runs on the training mesh, in the training process, with a KV cache (train/decode.py): the prompts
once, then one single-token step per new token; an answer ends where its row would pass maxSeqLen. It costs
one more compile at the first evaluation; EVAL_SAMPLE_MAX_NEW_TOKENS and evalSamples bound its time.

Every process of a multi-host slice runs the decode (the model is sharded over all of them) on the same
prompts; process 0 reports the answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuforge.api.constants import EVAL_SAMPLE_MAX_NEW_TOKENS
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.records import Record
from tpuforge_workloads.train.decode import Decoder, left_padded, prompt_room


@dataclass(frozen=True)
class SamplePrompt:
    prompt: str  # the last user turn, as shown beside the answer
    reference: str  # the record's own last assistant turn
    tokens: np.ndarray  # the generation prompt, int32


def pick_prompts(records: Sequence[Record], encoder: ChatEncoder, count: int, max_seq_len: int) -> list[SamplePrompt]:
    """The first `count` records that end with an assistant turn and whose prompt leaves room for an answer
    within `max_seq_len` tokens."""
    out: list[SamplePrompt] = []
    for record in records:
        if len(out) >= count:
            break
        messages = list(record.messages)
        if len(messages) < 2 or messages[-1].role != "assistant":
            continue
        tokens = encoder.prompt(messages[:-1])
        if len(tokens) >= max_seq_len:
            continue
        user = next((m.content for m in reversed(messages[:-1]) if m.role == "user"), messages[-2].content)
        out.append(SamplePrompt(prompt=user.strip(), reference=messages[-1].content.strip(), tokens=tokens))
    return out


class Sampler:
    """Greedy answers to `prompts` from a training model, on `mesh` (rows split over fsdp as a training
    batch is): train/decode.py's decode with its KV cache, compiled once, at the first call, and reused at
    every evaluation."""

    def __init__(
        self,
        prompts: Sequence[SamplePrompt],
        encoder: ChatEncoder,
        mesh: Any,
        max_seq_len: int,
        max_new: int = EVAL_SAMPLE_MAX_NEW_TOKENS,
    ):
        self.prompts = list(prompts)
        self.encoder = encoder
        self.length = max_seq_len  # an answer ends where its row would pass maxSeqLen
        self.max_new = max_new
        fsdp = int(mesh.shape.get("fsdp", 1))
        self.rows = -(-len(self.prompts) // fsdp) * fsdp
        self.decoder = Decoder(mesh, max_new)

    def answers(self, model: Any) -> list[dict[str, str]]:
        """{"prompt", "answer", "reference"} per prompt. Call under the run's mesh, on every process."""
        if not self.prompts:
            return []
        prompts = [p.tokens for p in self.prompts]
        tokens, lengths = left_padded(prompts, prompt_room(prompts), self.encoder.tokens.pad, self.rows)
        new = self.decoder(model, tokens, lengths)
        answers = [self._text(new[row, : self.length - len(p.tokens)]) for row, p in enumerate(self.prompts)]
        return [
            {"prompt": p.prompt, "answer": a, "reference": p.reference}
            for p, a in zip(self.prompts, answers, strict=True)
        ]

    def _text(self, new: np.ndarray) -> str:
        t = self.encoder.tokens
        ids: list[int] = []
        for token in new[: self.max_new].tolist():
            if token in (t.turn_end, t.eos):
                break
            ids.append(int(token))
        return str(self.encoder.tokenizer.decode(ids, skip_special_tokens=True)).strip()
