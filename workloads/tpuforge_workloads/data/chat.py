"""Chat records -> tokens in the Gemma turn format, with the loss mask.

A conversation becomes what Gemma 4's published chat template renders (thinking off):

    <bos><turn>system\\n{system}<end>\\n<turn>user\\n{content}<end>\\n<turn>model\\n{content}<end>\\n ...

where <turn>/<end> are the tokenizer's turn markers: `<|turn>`/`<turn|>` (Gemma 4, which also has a system
turn) or `<start_of_turn>`/`<end_of_turn>` (earlier Gemma, where a system prompt is folded into the first
user turn). Contents are trimmed, and thinking sections are dropped from model turns, as the template does.
A final assistant turn follows the template's generation prompt, which with thinking off closes an empty
thought channel: `<turn>model\\n<|channel>thought\\n<channel|>{content}<end>\\n`. So a training row is,
token for token, the prompt vLLM's /v1/chat/completions renders for the conversation so far, followed by
the answer; earlier assistant turns are as the template renders history (tests/workloads/data/test_chat_template.py
checks this against the template file). Control tokens are inserted by id, never parsed out of text, so a
record cannot forge them. Each piece of text is encoded on its own (role line, content), which is how the
chat template's output tokenizes too: the pieces meet at control tokens and newlines.

With `keep_thinking` (spec.dataset.keepThinking), a record whose final answer has thinking is rendered as the
template renders it with thinking on: `<|think|>` opens the system turn (the template's stock system prompt
when the record has none), the generation prompt is `<turn>model\n` alone, and the answer is what the model
produces then: `<|channel>thought\n{thinking}<channel|>{content}<end>`, every token of it carrying loss. Earlier
model turns drop their thinking either way, as the template renders history, and a record without thinking
is rendered with thinking off.

The loss mask is True on the tokens the model must learn to produce: each assistant turn's content and
its end-of-turn marker (with `loss_on="all"`, every token except <bos>). <bos> never carries loss, so that
a packed row, where a <bos> follows the previous record, gives the same loss as the records alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from tpuforge_workloads import storage
from tpuforge_workloads.data.records import Message, split_thinking

# (start, end, whether the format has a system turn), preferred first.
TURN_MARKERS = (("<|turn>", "<turn|>", True), ("<start_of_turn>", "<end_of_turn>", False))
ROLE_NAMES = {"user": "user", "assistant": "model", "system": "system"}
# Gemma 4's thinking channel; with thinking off the generation prompt opens and closes it empty.
CHANNEL_MARKERS = ("<|channel>", "<channel|>")
EMPTY_THOUGHT = "thought\n"
# With thinking on, the template opens the first system turn with this, and gives a record without a system
# message this system prompt.
THINK = "<|think|>"
THINKING_SYSTEM_PROMPT = "You are a helpful assistant."


class TokenizerError(ValueError):
    """A tokenizer that cannot be read, or without the tokens the Gemma chat format needs."""


def read_tokenizer(model_uri: str, field: str = "model.uri") -> Tokenizer:
    """The tokenizer.json of a model directory; `field` names the spec field that points there."""
    uri = storage.join(model_uri, "tokenizer.json")
    try:
        return Tokenizer.from_str(storage.read_text(uri))
    except storage.StorageError as e:
        raise TokenizerError(f"{field}: cannot read {uri} ({e}); the model directory needs its tokenizer.json") from e
    except Exception as e:
        raise TokenizerError(f"{uri}: not a tokenizers JSON file ({e})") from e


@dataclass(frozen=True)
class ChatTokens:
    bos: int
    eos: int
    pad: int
    turn_start: int
    turn_end: int
    system_turn: bool
    channel: tuple[int, int] | None  # <|channel>, <channel|> (Gemma 4)

    @classmethod
    def of(cls, tokenizer: Tokenizer, where: str = "tokenizer.json") -> ChatTokens:
        def tid(token: str) -> int | None:
            found = tokenizer.token_to_id(token)
            return None if found is None else int(found)

        missing = [t for t in ("<bos>", "<eos>", "<pad>") if tid(t) is None]
        if missing:
            raise TokenizerError(f"{where}: no {', '.join(missing)} token; a Gemma tokenizer has all three")
        c_start, c_end = (tid(t) for t in CHANNEL_MARKERS)
        channel = (c_start, c_end) if c_start is not None and c_end is not None else None
        for start, end, system in TURN_MARKERS:
            s, e = tid(start), tid(end)
            if s is not None and e is not None:
                return cls(tid("<bos>"), tid("<eos>"), tid("<pad>"), s, e, system, channel)  # type: ignore[arg-type]
        pairs = " or ".join(f"{s}/{e}" for s, e, _ in TURN_MARKERS)
        raise TokenizerError(f"{where}: no turn markers ({pairs}); is this a Gemma chat tokenizer?")


class ChatEncoder:
    """Encodes conversations; `loss_on` is TrainingSpec.loss_on."""

    def __init__(
        self, tokenizer: Tokenizer, loss_on: Literal["assistant", "all"] = "assistant", keep_thinking: bool = False
    ):
        self.tokenizer = tokenizer
        self.tokens = ChatTokens.of(tokenizer)
        self.loss_on = loss_on
        self.keep_thinking = keep_thinking
        if keep_thinking and (self.tokens.channel is None or not self.tokens.system_turn):
            raise TokenizerError(
                "dataset.keepThinking: the tokenizer has no Gemma 4 thought channel (<|channel>, <channel|>) and "
                "system turn to render thinking in; set keepThinking: false for this model"
            )
        think = tokenizer.token_to_id(THINK)
        # A tokenizer without the <|think|> token reads the template's text as text: so does this encoder.
        self._think_id = None if think is None else int(think)
        self._role_ids = {role: self._text(f"{name}\n") for role, name in ROLE_NAMES.items()}
        self._newline = self._text("\n")
        c = self.tokens.channel
        # What the generation prompt puts after the model's role line (nothing without a thinking channel).
        self._answer_prefix = [c[0], *self._text(EMPTY_THOUGHT), c[1]] if c else []

    def _text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else []

    def turns(self, messages: Sequence[Message]) -> list[tuple[str, str]]:
        """(role, content) per turn as the chat template renders them: trimmed, thinking dropped from model
        turns, and a system message folded into the first user turn when the format has no system turn."""
        out = [(m.role, strip_thinking(m.content) if m.role == "assistant" else m.content.strip()) for m in messages]
        if out and out[0][0] == "system" and not self.tokens.system_turn:
            system = out.pop(0)[1]
            for i, (role, content) in enumerate(out):
                if role == "user":
                    out[i] = (role, f"{system}\n\n{content}")
                    break
        return out

    def encode(self, messages: Sequence[Message]) -> tuple[np.ndarray, np.ndarray]:
        """(token ids int32, loss mask bool), same length."""
        return self.encode_many([messages])[0]

    def thought(self, messages: Sequence[Message]) -> str:
        """The thinking rendered before the final answer: its own, with keep_thinking ("" for none)."""
        if not self.keep_thinking or not messages or messages[-1].role != "assistant":
            return ""
        return messages[-1].thinking or split_thinking(messages[-1].content)[0]

    def _thinking_turns(self, turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """`turns` with the system turn thinking on opens: <|think|> first (as text where the tokenizer
        lacks the token, else prepended by id in _assemble)."""
        think = "" if self._think_id is not None else THINK
        if turns and turns[0][0] == "system":
            return [("system", think + turns[0][1]), *turns[1:]]
        return [("system", think + THINKING_SYSTEM_PROMPT), *turns]

    def encode_many(self, conversations: Sequence[Sequence[Message]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`encode` for many conversations; the texts are tokenised in one parallel batch."""
        thoughts = [self.thought(messages) for messages in conversations]
        turns = [
            self._thinking_turns(self.turns(messages)) if thought else self.turns(messages)
            for messages, thought in zip(conversations, thoughts, strict=True)
        ]
        texts = [content for conversation in turns for _, content in conversation]
        texts += [f"{EMPTY_THOUGHT}{thought}" for thought in thoughts if thought]
        pieces = iter(self.tokenizer.encode_batch(texts, add_special_tokens=False) if texts else [])
        parts = [[(role, list(next(pieces).ids)) for role, _ in conversation] for conversation in turns]
        return [
            self._assemble(conversation, list(next(pieces).ids) if thought else None)
            for conversation, thought in zip(parts, thoughts, strict=True)
        ]

    def _assemble(
        self, turns: list[tuple[str, list[int]]], thought: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`thought`: the final answer's thinking (the channel's name and text), rendered thinking on."""
        t = self.tokens
        ids: list[int] = [t.bos]
        mask: list[bool] = [False]
        every = self.loss_on == "all"
        # A final assistant turn is the answer to the conversation so far: it follows the generation prompt.
        last_answer = len(turns) - 1 if turns and turns[-1][0] == "assistant" else -1
        for i, (role, content) in enumerate(turns):
            learn = role == "assistant"
            if thought is not None and i == 0 and self._think_id is not None:
                content = [self._think_id, *content]
            channel: list[int] = []
            prefix = self._answer_prefix if i == last_answer else []
            if thought is not None and i == last_answer and t.channel is not None:
                channel, prefix = [t.channel[0], *thought, t.channel[1]], []
            head = [t.turn_start, *self._role_ids[role], *prefix]
            body = [*channel, *content, t.turn_end]
            ids += head + body + self._newline
            mask += [every] * len(head) + [learn or every] * len(body) + [every] * len(self._newline)
        return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)

    def prompt(self, messages: Sequence[Message]) -> np.ndarray:
        """Tokens that ask the model for the next assistant turn: the template's generation prompt (for
        generation checks). `messages` must not end with an assistant turn."""
        if messages and messages[-1].role == "assistant":
            raise ValueError("prompt(): the conversation already ends with an assistant turn")
        ids, _ = self.encode(messages)
        ask = [self.tokens.turn_start, *self._role_ids["assistant"], *self._answer_prefix]
        return np.concatenate([ids, ask]).astype(np.int32)


def strip_thinking(text: str) -> str:
    """A model turn's text without its thinking sections (`<|channel>...<channel|>`), trimmed, as the chat
    template renders earlier model turns."""
    start, end = CHANNEL_MARKERS
    return "".join(part.split(start)[0] if start in part else part for part in text.split(end)).strip()
