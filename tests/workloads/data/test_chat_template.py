"""data/chat.py's formats against their chat templates: Gemma 4's published one (tests/fixtures/chat_templates)
rendered by transformers' apply_chat_template with thinking off, token for token: the training rows, the
evaluation's prompts and vLLM's serving prompts (rendered with the template the tiny model ships) agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.conversations import CONVERSATIONS
from tpuforge_workloads.data.chat import ChatEncoder, split_think_block, strip_thinking
from tpuforge_workloads.data.records import Message

TEMPLATE = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates" / "gemma-4-31B-it.jinja"


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def encoder(tiny_model_dir: Path) -> ChatEncoder:
    from tokenizers import Tokenizer

    return ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))


def _render(tokenizer: Any, messages: tuple[Message, ...], template: str | None, generation: bool) -> str:
    rows = [{"role": m.role, "content": m.content} for m in messages]
    kw = {"chat_template": template} if template else {}
    text = tokenizer.apply_chat_template(rows, add_generation_prompt=generation, tokenize=False, **kw)
    assert isinstance(text, str)
    return text


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_chat_format_is_gemma4s_published_template_token_for_token(
    name: str, hf_tokenizer: Any, encoder: ChatEncoder
) -> None:
    official = TEMPLATE.read_text()
    conversation = CONVERSATIONS[name]
    history, answer = conversation[:-1], conversation[-1]
    # The prompt the model answers (generation prompt, thinking off) is the template's, token for token.
    prompt = _render(hf_tokenizer, history, official, generation=True)
    assert prompt.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert encoder.prompt(history).tolist() == _ids(hf_tokenizer, prompt)
    # A training row is that prompt followed by the answer and the end of its turn; the loss covers the
    # answers (the earlier one as the template renders history), never the prompt.
    ids, mask = encoder.encode(conversation)
    assert ids.tolist() == _ids(hf_tokenizer, prompt + strip_thinking(answer.content) + "<turn|>\n")
    learned = hf_tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False)
    answers = [strip_thinking(m.content) + "<turn|>" for m in conversation if m.role == "assistant"]
    assert learned == "".join(answers)
    # Earlier turns, as history: the conversation followed by a new user turn renders as the template does.
    more = (*conversation, Message("user", "Thanks."))
    ids, _ = encoder.encode(more)
    assert ids.tolist() == _ids(hf_tokenizer, _render(hf_tokenizer, more, official, generation=False))


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_tiny_models_template_renders_as_the_published_one(name: str, hf_tokenizer: Any) -> None:
    """vLLM serves (and the evaluation Job asks) with the template in the model's tokenizer_config.json."""
    official = TEMPLATE.read_text()
    conversation = CONVERSATIONS[name]
    for messages, generation in ((conversation, False), (conversation[:-1], True)):
        want = _render(hf_tokenizer, messages, official, generation)
        assert _render(hf_tokenizer, messages, None, generation) == want


# Messages whose content is a list of parts, as OpenAI-style chat requests arrive (vLLM hands them to the
# template so, images included, when the template loops over the parts).
PART_CONVERSATIONS = {
    "an image then a question": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<|channel>thought\nlook<channel|>A cat."}]},
    ],
    "text, two images, text; system as a string": [
        {"role": "system", "content": "Describe images."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image"},
                {"type": "text", "text": "and"},
                {"type": "image"},
            ],
        },
        {"role": "assistant", "content": "They differ."},
    ],
}


@pytest.mark.parametrize("name", PART_CONVERSATIONS)
def test_the_tiny_models_template_renders_content_parts_and_images_as_the_published_one(
    name: str, hf_tokenizer: Any
) -> None:
    official = TEMPLATE.read_text()
    conversation = PART_CONVERSATIONS[name]
    for messages, generation in ((conversation, False), (conversation[:-1], True)):
        want = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation, tokenize=False, chat_template=official
        )
        assert "<|image|>" in want
        assert hf_tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False) == want


def test_a_prompt_must_not_end_with_an_answer(encoder: ChatEncoder) -> None:
    with pytest.raises(ValueError, match="already ends with an assistant turn"):
        encoder.prompt(CONVERSATIONS["one exchange, untrimmed"])
    assert isinstance(encoder.prompt([Message("user", "hi")]), np.ndarray)


THINKING = {
    "no system message": (
        Message("user", "What is 2 + 2?"),
        Message("assistant", "4.", "Two and two make four."),
    ),
    "system, and thinking left in an earlier answer": (
        Message("system", "Answer with a number."),
        Message("user", "2 + 2?"),
        Message("assistant", "<|channel>thought\nadd them<channel|>4"),
        Message("user", "and (3 + 3)?"),
        Message("assistant", "6", "Three and three:\n six."),
    ),
}


@pytest.mark.parametrize("name", THINKING)
def test_kept_thinking_is_the_published_templates_thinking_prompt_and_the_models_thought_channel(
    name: str, hf_tokenizer: Any, tiny_model_dir: Path
) -> None:
    from tokenizers import Tokenizer

    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")), keep_thinking=True)
    conversation = THINKING[name]
    history, answer = conversation[:-1], conversation[-1]
    rows = [{"role": m.role, "content": m.content} for m in history]
    prompt = hf_tokenizer.apply_chat_template(
        rows, add_generation_prompt=True, enable_thinking=True, tokenize=False, chat_template=TEMPLATE.read_text()
    )
    assert "<|think|>" in prompt and prompt.endswith("<|turn>model\n")
    produced = f"<|channel>thought\n{answer.thinking}<channel|>{answer.content}<turn|>"
    ids, mask = encoder.encode(conversation)
    assert ids.tolist() == _ids(hf_tokenizer, prompt + produced + "\n")
    learned = hf_tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False)
    earlier = [strip_thinking(m.content) + "<turn|>" for m in history if m.role == "assistant"]
    assert learned == "".join(earlier) + produced


# ChatML (Qwen3): the template qwen3-tiny ships is Qwen3-8B's without its tool branches. Thinking is written
# the Qwen3 way here: a <think> block in the content, or the reasoning beside it.
CHATML_CONVERSATIONS = {
    **CONVERSATIONS,
    "a think block in an earlier answer": (
        Message("system", "Answer with a number."),
        Message("user", "2 + 2?"),
        Message("assistant", "<think>\nadd them\n</think>\n\n4"),
        Message("user", "and 3 + 3?"),
        Message("assistant", "\n\n6"),
    ),
    # Written as is after the role line's newline, a leading newline merges with it ("\n\n" is one token of
    # Qwen3's, and of qwen3-tiny's): the encoder must tokenise the two together, as the template's text is.
    "contents that start with newlines": (
        Message("system", "\nAnswer with a number."),
        Message("user", "\n\n2 + 2?\n\n"),
        Message("assistant", "4"),
    ),
}


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_model_dir))


def _chatml_encoder(model_dir: Path, keep_thinking: bool = False) -> ChatEncoder:
    from tokenizers import Tokenizer

    return ChatEncoder(Tokenizer.from_file(str(model_dir / "tokenizer.json")), keep_thinking=keep_thinking)


@pytest.mark.parametrize("name", CHATML_CONVERSATIONS)
def test_the_chatml_format_is_qwen3s_template_token_for_token(
    name: str, qwen3_tokenizer: Any, tiny_qwen3_model_dir: Path
) -> None:
    encoder = _chatml_encoder(tiny_qwen3_model_dir)
    assert encoder.format.name == "chatml" and encoder.tokens.bos is None
    conversation = CHATML_CONVERSATIONS[name]
    history, answer = conversation[:-1], conversation[-1]
    rows = [{"role": m.role, "content": m.content} for m in history]
    # The prompt the model answers, thinking off, closes an empty think block; no <bos>.
    prompt = qwen3_tokenizer.apply_chat_template(
        rows, add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert encoder.prompt(history).tolist() == _ids(qwen3_tokenizer, prompt)
    # The whole conversation as the template renders it is that prompt, the answer and the end of its turn.
    whole = _render(qwen3_tokenizer, conversation, None, generation=False)
    assert whole == prompt + split_think_block(answer.content)[1].lstrip("\n") + "<|im_end|>\n"
    ids, mask = encoder.encode(conversation)
    assert ids.tolist() == _ids(qwen3_tokenizer, whole)
    learned = qwen3_tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False)
    answers = [split_think_block(m.content)[1] for m in conversation if m.role == "assistant"]
    answers[-1] = answers[-1].lstrip("\n")
    assert learned == "".join(a + "<|im_end|>" for a in answers)
    # Earlier turns, as history: the think block dropped.
    more = (*conversation, Message("user", "Thanks."))
    ids, _ = encoder.encode(more)
    assert ids.tolist() == _ids(qwen3_tokenizer, _render(qwen3_tokenizer, more, None, generation=False))


CHATML_THINKING = {
    "reasoning beside the answer": (
        Message("user", "What is 2 + 2?"),
        Message("assistant", "4.", "Two and two make four."),
    ),
    "a think block in the answer, another in history": (
        Message("system", "Answer with a number."),
        Message("user", "2 + 2?"),
        Message("assistant", "<think>\nadd them\n</think>\n\n4"),
        Message("user", "and (3 + 3)?"),
        Message("assistant", "<think>\nThree and three:\n six.\n</think>\n\n6"),
    ),
}


@pytest.mark.parametrize("name", CHATML_THINKING)
def test_kept_thinking_in_chatml_is_the_think_block_qwen3_renders_and_generates(
    name: str, qwen3_tokenizer: Any, tiny_qwen3_model_dir: Path
) -> None:
    encoder = _chatml_encoder(tiny_qwen3_model_dir, keep_thinking=True)
    conversation = CHATML_THINKING[name]
    history, answer = conversation[:-1], conversation[-1]
    rows = [{"role": m.role, "content": m.content} for m in history]
    prompt = qwen3_tokenizer.apply_chat_template(rows, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    thinking, content = (answer.thinking, answer.content) if answer.thinking else split_think_block(answer.content)
    produced = f"<think>\n{thinking}\n</think>\n\n{content}<|im_end|>"
    # The template renders the conversation's last answer so, from its reasoning_content or its think block.
    final = {"role": "assistant", "content": answer.content, "reasoning_content": answer.thinking or None}
    whole = qwen3_tokenizer.apply_chat_template([*rows, final], tokenize=False)
    assert whole == prompt + produced + "\n"
    ids, mask = encoder.encode(conversation)
    assert ids.tolist() == _ids(qwen3_tokenizer, whole)
    learned = qwen3_tokenizer.decode([int(i) for i in ids[mask]], skip_special_tokens=False)
    earlier = [split_think_block(m.content)[1] + "<|im_end|>" for m in history if m.role == "assistant"]
    assert learned == "".join(earlier) + produced
