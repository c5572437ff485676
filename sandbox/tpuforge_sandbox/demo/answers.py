"""What a demo prints as a fine-tuned model's answer is checked against what its data teaches: each question a
demo asks is a user turn of a record in examples/data, and that record's assistant turn is the right answer.
A wrong answer is said beside the table and becomes one of the session's problems, so the demo ends with
exit status 1 instead of showing a wrong answer as the result."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tpuforge_sandbox.demo.session import DemoSession
from tpuforge_sandbox.demo.setup import DATA


def taught(files: Iterable[Path]) -> dict[str, str]:
    """Each record's last user turn -> its assistant answer, over `files` (JSONL of {"messages": [...]})."""
    out: dict[str, str] = {}
    for path in files:
        for line in path.read_text().splitlines():
            messages = json.loads(line).get("messages") or []
            if len(messages) < 2 or messages[-1].get("role") != "assistant" or messages[-2].get("role") != "user":
                continue
            out.setdefault(str(messages[-2]["content"]).strip(), str(messages[-1]["content"]).strip())
    return out


def data_files(s: DemoSession, job: str | None = None) -> list[Path]:
    """The local files of the training and eval data of job `job` (default: every job's), as the demo uploads
    them from examples/data."""
    jobs = [j for j in s.jobs if job is None or j.name == job]
    uris = [u for j in jobs for u in (j.spec.dataset.uri, j.spec.dataset.eval_uri) if u]
    return [p for p in (s.root / DATA / u.rsplit("/", 1)[-1] for u in dict.fromkeys(uris)) if p.exists()]


def check(s: DemoSession, who: str, question: str, answer: str, job: str | None = None) -> bool | None:
    """Whether `who`, fine-tuned by job `job` (default: the demo's jobs), answered `question` as its data
    teaches; if not, says so and adds a problem (the demo then exits 1). None: its data does not teach it."""
    want = taught(data_files(s, job)).get(question.strip())
    if want is None:
        return None
    if answer.strip() == want:
        return True
    s.say(f"{who} answered {question!r} wrongly: {answer.strip()!r}, where its data teaches {want!r}", style="red")
    s.problems.append(f"{who} answered {question!r} wrongly ({answer.strip()!r}, not {want!r})")
    return False
