"""Sample answers at each in-training evaluation: a few held-out prompts answered greedily by the model as it
is, LoRA weights of the step just taken, so a run shows what it has learnt as well as its loss.

The prompts are the first records of the eval set (training.evalSamples of them), laid out as
tpuforge_workloads.evaluate.compare lays out a prompt: one conversation up to its last assistant turn, through the
trainer's chat encoder and its generation prompt, the answer stopping at the end of the model's turn. The
decoding runs on the training mesh, in the training process, without a KV cache: one jitted loop of
`max_new` full forward passes over a fixed-size row (the prompt and room for the answer, rounded up to 128
tokens and no longer than maxSeqLen, which training already fits in memory). It costs one more compile at
the first evaluation and, for the 31B on a v5p-8 with prompts of a few hundred tokens, seconds per
evaluation after that; EVAL_SAMPLE_MAX_NEW_TOKENS and evalSamples bound it.

Every process of a multi-host slice runs the decode (the model is sharded over all of them) on the same
prompts; process 0 reports the answers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuforge.api.constants import EVAL_SAMPLE_MAX_NEW_TOKENS
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.records import Record

ROW_MULTIPLE = 128  # row lengths on the splash-attention path are multiples of this (attention.py)


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


def row_length(prompts: Sequence[SamplePrompt], max_seq_len: int, max_new: int = EVAL_SAMPLE_MAX_NEW_TOKENS) -> int:
    longest = max(len(p.tokens) for p in prompts)
    rounded = -(-(longest + max_new) // ROW_MULTIPLE) * ROW_MULTIPLE
    return min(rounded, max_seq_len)


class Sampler:
    """Greedy answers to `prompts` from a training model, on `mesh` (rows split over fsdp as a training
    batch is). The decode is compiled once, at the first call, and reused at every evaluation."""

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
        self.mesh = mesh
        self.length = row_length(self.prompts, max_seq_len, max_new) if self.prompts else 0
        self.max_new = max_new
        fsdp = int(mesh.shape.get("fsdp", 1))
        self.rows = -(-len(self.prompts) // fsdp) * fsdp
        self._decode: Any = None

    def _inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """Token rows (prompts left-aligned, padded; spare rows repeat the first prompt) and prompt lengths."""
        pad = self.encoder.tokens.pad
        tokens = np.full((self.rows, self.length), pad, np.int32)
        lengths = np.zeros(self.rows, np.int32)
        for row in range(self.rows):
            p = self.prompts[row] if row < len(self.prompts) else self.prompts[0]
            tokens[row, : len(p.tokens)] = p.tokens
            lengths[row] = len(p.tokens)
        return tokens, lengths

    def answers(self, model: Any) -> list[dict[str, str]]:
        """{"prompt", "answer", "reference"} per prompt. Call under the run's mesh, on every process."""
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        if not self.prompts:
            return []
        split: tuple[Any, ...] = nnx.split(model, nnx.LoRAParam, ...)
        graphdef, adapters, rest = split
        if self._decode is None:
            replicated = NamedSharding(self.mesh, PartitionSpec())  # type: ignore[no-untyped-call]
            self._decode = jax.jit(
                functools.partial(_decode, graphdef, model.config.dtype, self.max_new, self.length, 0.0),
                out_shardings=replicated,
            )
        rows = NamedSharding(self.mesh, PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        tokens, lengths = self._inputs()
        placed = [jax.make_array_from_callback(a.shape, rows, functools.partial(_index, a)) for a in (tokens, lengths)]
        out = np.asarray(self._decode(adapters, rest, *placed).addressable_data(0))
        return [
            {"prompt": p.prompt, "answer": self._text(out[row, len(p.tokens) :]), "reference": p.reference}
            for row, p in enumerate(self.prompts)
        ]

    def _text(self, new: np.ndarray) -> str:
        t = self.encoder.tokens
        ids: list[int] = []
        for token in new[: self.max_new].tolist():
            if token in (t.turn_end, t.eos):
                break
            ids.append(int(token))
        return str(self.encoder.tokenizer.decode(ids, skip_special_tokens=True)).strip()


def _index(array: np.ndarray, index: Any) -> Any:
    return array[index]


def _decode(
    graphdef: Any,
    dtype: Any,
    max_new: int,
    length: int,
    temperature: float,
    adapters: Any,
    rest: Any,
    tokens: Any,
    lengths: Any,
    key: Any = None,
) -> Any:
    """`max_new` tokens after each row's prompt (a row that reaches `length` stops growing): greedy at
    temperature 0, else drawn from softmax(logits / temperature) with `key` folded with the position. The
    adapters are cast to the model's compute dtype up front, as training's forward pass casts them
    (lora.adapters_in_compute_dtype), and the model is rebuilt inside the loop body from the arrays, so no
    variable is written across traces."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tpuforge_workloads.families import attention
    from tpuforge_workloads.families.attention import model_inputs
    from tpuforge_workloads.model.lora_provider import without_dropout

    adapters = jax.tree.map(lambda x: x.astype(dtype), adapters)
    rows = tokens.shape[0]
    row_index = jnp.arange(rows)
    segment_ids = jnp.ones_like(tokens)  # causal attention alone: nothing after a row's end is read
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)

    def step(i: Any, toks: Any) -> Any:
        model = nnx.merge(graphdef, adapters, rest)
        x = model_inputs({"input_tokens": toks, "input_mask": toks, "segment_ids": segment_ids, "positions": positions})
        with without_dropout():
            logits, _ = model(toks, x["positions"], None, attention.for_model(model, x["attention_mask"]))
        at = lengths + i  # where this iteration's token goes
        last = jnp.clip(at - 1, 0, length - 1)
        scores = logits[row_index, last].astype(jnp.float32)
        if temperature > 0:
            nxt = jax.random.categorical(jax.random.fold_in(key, i), scores / temperature, axis=-1).astype(toks.dtype)
        else:
            nxt = jnp.argmax(scores, axis=-1).astype(toks.dtype)
        keep = at < length
        return toks.at[row_index, jnp.clip(at, 0, length - 1)].set(jnp.where(keep, nxt, toks[row_index, last]))

    return jax.lax.fori_loop(0, max_new, step, tokens)
