"""The demo's chat task: a fixed country -> capital mapping asked in several phrasings.

Small enough for the tiny Gemma 4 model to learn visibly in a few dozen LoRA steps on a CPU (the answer's
frame within a few steps, the capitals soon after), and plain English, so the tiny model's tokenizer is
trained on the same text. examples/data/demo-chat.jsonl is `records()` written out (a test keeps them equal).
"""

from __future__ import annotations

import json
import random
from typing import Any

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Chile": "Santiago",
    "Italy": "Rome",
    "India": "New Delhi",
    "Spain": "Madrid",
    "Ghana": "Accra",
    "Poland": "Warsaw",
    "Cuba": "Havana",
    "Greece": "Athens",
    "Nepal": "Kathmandu",
}
QUESTIONS = (
    "What is the capital of {country}?",
    "Which city is the capital of {country}?",
    "Name the capital city of {country}.",
    "Tell me the capital of {country}.",
    "{country}: which city is its capital?",
    "Capital of {country}?",
    "Do you know the capital of {country}?",
    "I need the capital of {country}, please.",
    "Where is the seat of government of {country}?",
    "What city serves as the capital of {country}?",
    "Quick question: capital of {country}?",
    "In {country}, which city is the capital?",
)
ANSWER = "The capital of {country} is {capital}."
SYSTEM = "You answer geography questions in one sentence."


def records(seed: int = 0) -> list[dict[str, Any]]:
    """Every (country, phrasing) pair once, shuffled; every fourth record has a system prompt."""
    out = []
    for country, capital in CAPITALS.items():
        for q in QUESTIONS:
            out.append(
                [
                    {"role": "user", "content": q.format(country=country)},
                    {"role": "assistant", "content": ANSWER.format(country=country, capital=capital)},
                ]
            )
    random.Random(seed).shuffle(out)
    return [
        {"messages": ([{"role": "system", "content": SYSTEM}] if i % 4 == 0 else []) + messages}
        for i, messages in enumerate(out)
    ]


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def corpus() -> list[str]:
    """Text for training the tiny model's tokenizer: every message of the task, plus plain prose."""
    texts = [m["content"] for r in records() for m in r["messages"]]
    texts += [
        "The quick brown fox jumps over the lazy dog.",
        "Hello! How are you today? I am fine, thank you.",
        "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
        "Please answer the question in one short sentence.",
    ]
    return texts
