"""The demo's chat tasks: a fixed country -> capital mapping asked in several phrasings, and a second task
(country -> language) for a second adapter on the same base.

Small enough for the tiny Gemma 4 model to learn visibly in a few dozen LoRA steps on a CPU (the answer's
frame within a few steps, the facts soon after), and plain English, so the tiny model's tokenizer is
trained on the same text (the capitals task's; its byte-level BPE encodes any other text too).
examples/data/demo-chat.jsonl is `records()` written out, examples/data/demo-languages.jsonl
`records(LANGUAGES_TASK)`, each task's *-eval.jsonl is `eval_records(task)`, and
examples/data/demo-preferences.jsonl is `preference_records()` and examples/data/demo-preferences-sft.jsonl
`preference_sft_records(preference_records())` (tests keep them equal).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
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
# Phrasings the training data never has, for scoring what a run learnt beyond its own records
# (benchmarks/learning_quality.py).
HELD_OUT_QUESTIONS = (
    "What's the capital city of {country}?",
    "Which city is {country}'s capital?",
    "Can you tell me the capital of {country}?",
)
ANSWER = "The capital of {country} is {capital}."
SYSTEM = "You answer geography questions in one sentence."


LANGUAGES = {
    "Brazil": "Portuguese",
    "Mexico": "Spanish",
    "Germany": "German",
    "Egypt": "Arabic",
    "Japan": "Japanese",
    "Kenya": "Swahili",
    "Russia": "Russian",
    "Turkey": "Turkish",
    "Iran": "Persian",
    "Greece": "Greek",
    "Poland": "Polish",
    "Vietnam": "Vietnamese",
}
LANGUAGE_QUESTIONS = (
    "What language is spoken in {country}?",
    "Which language do people speak in {country}?",
    "What is the main language of {country}?",
    "Tell me the language of {country}.",
    "{country}: which language is spoken there?",
    "Language of {country}?",
    "Do you know what people in {country} speak?",
    "In {country}, what language do people use?",
)
HELD_OUT_LANGUAGE_QUESTIONS = (
    "Which language is spoken in {country}?",
    "What do people speak in {country}?",
    "Can you tell me the language of {country}?",
)


@dataclass(frozen=True)
class Task:
    name: str
    facts: dict[str, str]  # country -> answer
    questions: tuple[str, ...]  # with {country}
    answer: str  # with {country} and {fact}
    system: str
    held_out: tuple[str, ...] = ()  # phrasings absent from records(): what a run learnt beyond them


CAPITALS_TASK = Task("capitals", CAPITALS, QUESTIONS, ANSWER.replace("{capital}", "{fact}"), SYSTEM, HELD_OUT_QUESTIONS)
LANGUAGES_TASK = Task(
    "languages",
    LANGUAGES,
    LANGUAGE_QUESTIONS,
    "People in {country} speak {fact}.",
    "You answer questions about languages in one sentence.",
    HELD_OUT_LANGUAGE_QUESTIONS,
)
TASKS = {t.name: t for t in (CAPITALS_TASK, LANGUAGES_TASK)}


def chat(task: Task, country: str, question: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": question.format(country=country)},
        {"role": "assistant", "content": task.answer.format(country=country, fact=task.facts[country])},
    ]


def records(task: Task = CAPITALS_TASK, seed: int = 0) -> list[dict[str, Any]]:
    """Every (country, phrasing) pair once, shuffled; every fourth record has a system prompt."""
    out = [chat(task, country, q) for country in task.facts for q in task.questions]
    random.Random(seed).shuffle(out)
    return [
        {"messages": ([{"role": "system", "content": task.system}] if i % 4 == 0 else []) + messages}
        for i, messages in enumerate(out)
    ]


def eval_records(task: Task = CAPITALS_TASK) -> list[dict[str, Any]]:
    """One question per country, in the task's first phrasing: what the demo's evaluation asks. The tiny model
    is trained on these phrasings (it is not meant to generalise); a real evaluation set is held out."""
    return [{"messages": chat(task, country, task.questions[0])} for country in task.facts]


def seen_records(task: Task = CAPITALS_TASK) -> list[dict[str, Any]]:
    """Every country in the task's first two phrasings (training records; the demo asks the second)."""
    return [{"messages": chat(task, country, q)} for q in task.questions[:2] for country in task.facts]


def held_out_records(task: Task = CAPITALS_TASK) -> list[dict[str, Any]]:
    """Every country in each held-out phrasing: questions no training record asks."""
    return [{"messages": chat(task, country, q)} for q in task.held_out for country in task.facts]


# The city each country's capital is often mistaken for: its best-known other city.
MISTAKEN_CAPITALS = {
    "France": "Marseille",
    "Japan": "Osaka",
    "Kenya": "Mombasa",
    "Peru": "Cusco",
    "Norway": "Bergen",
    "Egypt": "Alexandria",
    "Canada": "Toronto",
    "Chile": "Valparaiso",
    "Italy": "Milan",
    "India": "Mumbai",
    "Spain": "Barcelona",
    "Ghana": "Kumasi",
    "Poland": "Krakow",
    "Cuba": "Holguin",
    "Greece": "Thessaloniki",
    "Nepal": "Pokhara",
}


def preference_records(
    task: Task = CAPITALS_TASK, phrasings: int = 4, seed: int = 0, rejected: str = "mistaken"
) -> list[dict[str, Any]]:
    """Preference pairs (spec.method dpo/orpo; examples/data/demo-preferences.jsonl): each country in the
    task's first `phrasings` phrasings, the chosen answer right and the rejected one, in the same sentence,
    wrong: the city the capital is often mistaken for (`rejected` mistaken, the capitals task only), or the
    next country's fact (swapped: every wrong answer is another pair's right one, so only a model that reads
    the country can rank them). Every other prompt is a chat (a system message and the question) rather than
    plain text, so both record shapes are in the set; shuffled."""
    rng = random.Random(seed)
    countries = list(task.facts)
    out: list[dict[str, Any]] = []
    for n, country in enumerate(countries):
        swapped = task.facts[countries[(n + 1) % len(countries)]]
        wrong = MISTAKEN_CAPITALS[country] if rejected == "mistaken" else swapped
        for q in task.questions[:phrasings]:
            question = q.format(country=country)
            prompt: Any = question
            if len(out) % 2:
                prompt = [{"role": "system", "content": task.system}, {"role": "user", "content": question}]
            out.append(
                {
                    "prompt": prompt,
                    "chosen": task.answer.format(country=country, fact=task.facts[country]),
                    "rejected": task.answer.format(country=country, fact=wrong),
                }
            )
    rng.shuffle(out)
    return out


# What the preference demo holds out of its pairs (examples/finetune-dpo-demo.yaml: spec.dataset.evalFraction,
# splitSeed unset).
PREFERENCE_EVAL_FRACTION = 0.25
PREFERENCE_SPLIT_SEED = 0


def preference_sft_records(
    pairs: list[dict[str, Any]],
    eval_fraction: float = PREFERENCE_EVAL_FRACTION,
    split_seed: int = PREFERENCE_SPLIT_SEED,
) -> list[dict[str, Any]]:
    """The SFT start of preference tuning on `pairs` (examples/data/demo-preferences-sft.jsonl): the chosen
    answer of each pair the trainer trains on, as a chat record (the pair's prompt and its chosen answer), in
    the pairs' order. The pairs the trainer holds out (spec.dataset.evalFraction and splitSeed, data/split.py)
    are left out, so that the held-out pairs stay unseen by the SFT model as by the preference run."""
    from tpuforge_workloads.data.preference import parse_preference
    from tpuforge_workloads.data.split import split

    parsed: list[Any] = [parse_preference(obj, f"pairs:{n}", n) for n, obj in enumerate(pairs, 1)]
    trained: list[Any] = split(parsed, eval_fraction, split_seed, "pairs")[0]  # PreferenceRecords
    return [{"messages": [{"role": m.role, "content": m.content} for m in (*r.prompt, *r.chosen)]} for r in trained]


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
