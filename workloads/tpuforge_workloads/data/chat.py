"""Chat records -> tokens in the model's chat format, with the loss mask.

Two formats, picked by the tokenizer's turn markers (FORMATS), each rendered as its published chat template
renders it:

- Gemma (thinking off): `<bos><turn>system\\n{system}<end>\\n<turn>user\\n{content}<end>\\n<turn>model\\n...`
  where <turn>/<end> are `<|turn>`/`<turn|>` (Gemma 4, which also has a system turn) or
  `<start_of_turn>`/`<end_of_turn>` (earlier Gemma, where a system prompt is folded into the first user
  turn). Contents are trimmed. The generation prompt closes an empty thought channel:
  `<turn>model\\n<|channel>thought\\n<channel|>`.
- ChatML (Qwen3): `<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{content}<|im_end|>\\n...`,
  no <bos>, contents as written. The generation prompt with thinking off closes an empty think block:
  `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`.

Thinking sections are dropped from model turns, as the templates render history. A final assistant turn
follows the generation prompt, so a training row is, token for token, the prompt vLLM's /v1/chat/completions
renders for the conversation so far (thinking off), followed by the answer; earlier assistant turns are as the
template renders history (tests/workloads/data/test_chat_template.py checks both formats against their
templates). Control tokens are inserted by id, never parsed out of text, so a record cannot forge them. Each
piece of text is encoded on its own (role line, content), which is how the template's output tokenizes too:
the pieces meet at control tokens and newlines.

With `keep_thinking` (spec.dataset.keepThinking), a record whose final answer has thinking is rendered as the
template renders it with thinking on: the generation prompt is the role line alone, and the answer is what the
model produces then, every token of it carrying loss: `<|channel>thought\\n{thinking}<channel|>{content}<end>`
(Gemma 4, whose template also opens the system turn with `<|think|>`, and gives a record without a system
message its stock system prompt) or `<think>\\n{thinking}\\n</think>\\n\\n{content}<|im_end|>` (ChatML). Earlier
model turns drop their thinking either way, and a record without thinking is rendered with thinking off.

The loss mask is True on the tokens the model must learn to produce: each assistant turn's content and
its end-of-turn marker (with `loss_on="all"`, every token except <bos>). <bos> never carries loss, so that
a packed row, where a <bos> follows the previous record, gives the same loss as the records alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from tpuforge_workloads import storage
from tpuforge_workloads.data.records import CHANNEL_END, CHANNEL_START, Message, split_thinking

GEMMA4_THOUGHT = (CHANNEL_START, CHANNEL_END)
CHATML_THOUGHT = ("<think>", "</think>")


def strip_thinking(text: str) -> str:
    """A Gemma model turn's text without its thinking sections (`<|channel>...<channel|>`), trimmed, as the
    chat template renders earlier model turns."""
    start, end = GEMMA4_THOUGHT
    return "".join(part.split(start)[0] if start in part else part for part in text.split(end)).strip()


def split_think_block(text: str) -> tuple[str, str]:
    """(thinking, answer) of a ChatML model turn, by Qwen3's template's rule: what precedes `</think>` (after
    any `<think>`) is the thinking, what follows it, without leading newlines, is the answer."""
    if CHATML_THOUGHT[1] not in text:
        return "", text
    before, _, after = text.rpartition(CHATML_THOUGHT[1])
    return before.rstrip("\n").split(CHATML_THOUGHT[0])[-1].lstrip("\n"), after.lstrip("\n")


@dataclass(frozen=True)
class ChatFormat:
    """One chat template's rendering: its control tokens, role names and how it writes a thought."""

    name: str
    turn: tuple[str, str]  # the tokens that open and close a turn
    roles: dict[str, str]  # record role -> the role line's name
    system_turn: bool  # else a system prompt is folded into the first user turn
    bos: str | None  # the token a sequence starts with (None: none)
    eos: str  # the end of a document (a stop token besides the turn's end)
    pad: str
    trim: bool  # contents are trimmed (Gemma) or rendered as written (ChatML)
    # A thought between (open, close) tokens: open, head + thinking + tail, close, then `after` and the answer.
    thought: tuple[str, str] | None
    thought_text: tuple[str, str, str] = ("", "", "")  # head, tail, after
    # (thinking, answer) of an assistant message's content, as the template splits it.
    split: Callable[[str], tuple[str, str]] = lambda text: ("", text)
    # Thinking on, Gemma 4 opens the system turn with this token, and gives a record without a system message
    # its stock system prompt.
    think_token: str | None = None
    thinking_system_prompt: str = ""
    answer_lstrip: str = ""  # characters the template strips from the start of the final answer


def _gemma_split(text: str) -> tuple[str, str]:
    return split_thinking(text)[0], strip_thinking(text)


GEMMA = {"user": "user", "assistant": "model", "system": "system"}
# Preferred first: a tokenizer is read as the first format whose turn tokens (and bos, eos, pad) it has.
FORMATS = (
    ChatFormat(
        "gemma4", ("<|turn>", "<turn|>"), GEMMA, True, "<bos>", "<eos>", "<pad>", True, GEMMA4_THOUGHT,
        ("thought\n", "", ""), _gemma_split, "<|think|>", "You are a helpful assistant.",
    ),
    ChatFormat(
        "gemma", ("<start_of_turn>", "<end_of_turn>"), GEMMA, False, "<bos>", "<eos>", "<pad>", True, None,
        split=_gemma_split,
    ),
    ChatFormat(
        "chatml", ("<|im_start|>", "<|im_end|>"), {r: r for r in GEMMA}, True, None, "<|endoftext|>",
        "<|endoftext|>", False, CHATML_THOUGHT, ("\n", "\n", "\n\n"), split_think_block, answer_lstrip="\n",
    ),
)  # fmt: skip


class TokenizerError(ValueError):
    """A tokenizer that cannot be read, or without the tokens a chat format needs."""


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
    format: ChatFormat
    bos: int | None
    eos: int
    pad: int
    turn_start: int
    turn_end: int
    channel: tuple[int, int] | None  # the thought's open and close tokens

    @property
    def system_turn(self) -> bool:
        return self.format.system_turn

    @classmethod
    def of(cls, tokenizer: Tokenizer, where: str = "tokenizer.json") -> ChatTokens:
        def tid(token: str | None) -> int | None:
            found = None if token is None else tokenizer.token_to_id(token)
            return None if found is None else int(found)

        for f in FORMATS:
            start, end = tid(f.turn[0]), tid(f.turn[1])
            if start is None or end is None:
                continue
            needed = [t for t in (f.bos, f.eos, f.pad) if t is not None]
            missing = [t for t in needed if tid(t) is None]
            if missing:
                raise TokenizerError(f"{where}: no {', '.join(missing)} token; a {f.name} tokenizer has {needed}")
            opened, closed = (tid(t) for t in f.thought or (None, None))
            channel = (opened, closed) if opened is not None and closed is not None else None
            return cls(f, tid(f.bos), tid(f.eos), tid(f.pad), start, end, channel)  # type: ignore[arg-type]
        pairs = " or ".join("/".join(f.turn) for f in FORMATS)
        raise TokenizerError(f"{where}: no turn markers ({pairs}); is this a Gemma or ChatML chat tokenizer?")


class ChatEncoder:
    """Encodes conversations; `loss_on` is TrainingSpec.loss_on."""

    def __init__(
        self, tokenizer: Tokenizer, loss_on: Literal["assistant", "all"] = "assistant", keep_thinking: bool = False
    ):
        self.tokenizer = tokenizer
        self.tokens = ChatTokens.of(tokenizer)
        self.format = f = self.tokens.format
        self.loss_on = loss_on
        self.keep_thinking = keep_thinking
        if keep_thinking and self.tokens.channel is None:
            raise TokenizerError(
                f"dataset.keepThinking: the tokenizer ({f.name} format) has no thought markers to render thinking "
                "in; set keepThinking: false for this model"
            )
        think = None if f.think_token is None else tokenizer.token_to_id(f.think_token)
        # A tokenizer without the <|think|> token reads the template's text as text: so does this encoder.
        self._think_id = None if think is None else int(think)
        self._role_ids = {role: self._text(f"{name}\n") for role, name in f.roles.items()}
        self._newline = self._text("\n")
        # What the generation prompt puts after the model's role line: an empty thought (none without one).
        self._answer_prefix = self._thought("") if self.tokens.channel else []

    def _text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else []

    def _thought(self, thinking: str, ids: list[int] | None = None) -> list[int]:
        """A rendered thought: `ids` (the thought's head, text and tail, already encoded) or `thinking`."""
        c, (head, tail, after) = self.tokens.channel, self.format.thought_text
        assert c is not None
        inner = self._text(f"{head}{thinking}{tail}") if ids is None else ids
        return [c[0], *inner, c[1], *self._text(after)]

    def turns(self, messages: Sequence[Message]) -> list[tuple[str, str]]:
        """(role, content) per turn as the chat template renders them: thinking dropped from model turns,
        trimmed where the format trims, and a system message folded into the first user turn when the format
        has no system turn."""
        f = self.format
        out = [
            (m.role, f.split(m.content)[1] if m.role == "assistant" else m.content.strip() if f.trim else m.content)
            for m in messages
        ]
        if out and out[-1][0] == "assistant" and f.answer_lstrip:
            out[-1] = ("assistant", out[-1][1].lstrip(f.answer_lstrip))
        if out and out[0][0] == "system" and not f.system_turn:
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
        return messages[-1].thinking or self.format.split(messages[-1].content)[0]

    def _thinking_turns(self, turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """`turns` as the template opens them with thinking on: Gemma 4's system turn starts with <|think|>
        (as text where the tokenizer lacks the token, else prepended by id in _assemble)."""
        f = self.format
        if f.think_token is None:
            return turns
        think = "" if self._think_id is not None else f.think_token
        if turns and turns[0][0] == "system":
            return [("system", think + turns[0][1]), *turns[1:]]
        return [("system", think + f.thinking_system_prompt), *turns]

    def encode_many(self, conversations: Sequence[Sequence[Message]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`encode` for many conversations; the texts are tokenised in one parallel batch."""
        head, tail, _ = self.format.thought_text
        thoughts = [self.thought(messages) for messages in conversations]
        turns = [
            self._thinking_turns(self.turns(messages)) if thought else self.turns(messages)
            for messages, thought in zip(conversations, thoughts, strict=True)
        ]
        joined = [[self._joined(c, i) for i in range(len(c))] for c in turns]
        texts = [
            f"{self.format.roles[role]}\n{content}" if join else content
            for conversation, joins in zip(turns, joined, strict=True)
            for (role, content), join in zip(conversation, joins, strict=True)
        ]
        texts += [f"{head}{thought}{tail}" for thought in thoughts if thought]
        pieces = iter(self.tokenizer.encode_batch(texts, add_special_tokens=False) if texts else [])
        parts = [
            [self._piece(role, next(pieces), join) for (role, _), join in zip(conversation, joins, strict=True)]
            for conversation, joins in zip(turns, joined, strict=True)
        ]
        return [
            self._assemble(conversation, self._thought("", list(next(pieces).ids)) if thought else None)
            for conversation, thought in zip(parts, thoughts, strict=True)
        ]

    def _joined(self, turns: list[tuple[str, str]], i: int) -> bool:
        """Whether turn `i`'s role line is tokenised with its content. A format that renders contents as
        written (ChatML) puts them right after the role line's newline, where a content's leading newline
        merges with it ("user\n\nHi": "\n\n" is one Qwen3 token), so the two are tokenised together, as the
        template's text is. Not the final answer: it follows the generation prompt's think block instead."""
        final_answer = i == len(turns) - 1 and turns[i][0] == "assistant"
        return not self.format.trim and not final_answer

    def _piece(self, role: str, encoding: Any, joined: bool) -> tuple[str, list[int], int]:
        """(role, the turn's tokens after <turn_start>, how many of them are the role line's). A token that
        spans the role line's end and the content's start (the merged newlines) counts as the content's: the
        model produces it."""
        ids = list(encoding.ids)
        if not joined:
            return role, [*self._role_ids[role], *ids], len(self._role_ids[role])
        line = len(self.format.roles[role]) + 1
        return role, ids, sum(1 for _, end in encoding.offsets if end <= line)

    def _assemble(
        self, turns: list[tuple[str, list[int], int]], thought: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`turns`: (role, the role line's and the content's tokens, how many are the role line's) each.
        `thought`: the final answer's rendered thought, for an answer rendered thinking on."""
        t = self.tokens
        ids: list[int] = [] if t.bos is None else [t.bos]
        mask: list[bool] = [False] * len(ids)
        every = self.loss_on == "all"
        # A final assistant turn is the answer to the conversation so far: it follows the generation prompt.
        last_answer = len(turns) - 1 if turns and turns[-1][0] == "assistant" else -1
        for i, (role, tokens, line) in enumerate(turns):
            learn = role == "assistant"
            content = tokens[line:]
            if thought is not None and i == 0 and self._think_id is not None:
                content = [self._think_id, *content]
            channel: list[int] = []
            prefix = self._answer_prefix if i == last_answer else []
            if thought is not None and i == last_answer:
                channel, prefix = thought, []
            head = [t.turn_start, *tokens[:line], *prefix]
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
