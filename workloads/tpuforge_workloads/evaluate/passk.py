"""The pure parts of functional evaluation: pass@k from n samples, its confidence interval, the code taken
from an answer, the seeds.

pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c pass, the chance that k
drawn without replacement include at least one that passes, 1 - C(n-c, k) / C(n, k), computed as a product
so that it stays exact for large n. The set's pass@k is the mean over its problems.

Its confidence interval is a percentile bootstrap over problems: the problems are drawn again with
replacement, `resamples` times with a fixed seed, and the interval is the middle `level` of the resampled
means. Each problem's estimate already carries the noise of its own n samples, so the spread of the resampled
means covers both which problems the set happens to hold and which answers the model happened to draw; it
stays inside [0, 1] and follows the skew of a score near 0 or 1, which a normal approximation does not.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A fenced block: ``` or ~~~ (3 or more), an optional info string, the body, the same fence closing it.
_FENCE = re.compile(
    r"^(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL
)
_OPEN = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n", re.MULTILINE)
# Problem i is sampled with seed + i; the seed stays below 2**31 for engines that take a signed 32-bit seed.
_SEED_RANGE = 2**31


@dataclass(frozen=True)
class Language:
    """What tells a language's code apart in an answer: the info strings of its fenced blocks, the file
    extensions of a test written for it, a declaration its code holds, and (optionally) where its code starts
    and ends in an answer without fences."""

    names: frozenset[str]
    extensions: tuple[str, ...]
    declares: re.Pattern[str]
    span: tuple[re.Pattern[str], re.Pattern[str]] | None = None


LANGUAGES: dict[str, Language] = {
    "verilog": Language(
        frozenset({"verilog", "v", "systemverilog", "sv"}),
        (".v", ".sv", ".vh", ".svh"),
        re.compile(r"^[ \t]*module\s+[A-Za-z_]\w*", re.MULTILINE),
        (re.compile(r"^[ \t]*module\s", re.MULTILINE), re.compile(r"\bendmodule\b")),
    ),
    "python": Language(
        frozenset({"python", "py", "python3"}),
        (".py",),
        re.compile(r"^(def|class|async def)\s+\w+|^(import|from)\s+\w+", re.MULTILINE),
    ),
}


@dataclass(frozen=True)
class CodeHint:
    """What picks the code out of an answer: the problem's language (None: unknown) and, optionally, a regex
    the code must match (`codePattern` in the record's test, e.g. `module\\s+TopModule\\b`)."""

    language: str | None = None
    pattern: str | None = None


def code_hint(test: Any) -> CodeHint:
    """The extraction hint of a record's test object: its `language` and `codePattern` when set; else the
    language its test files are written in (tb.v, tb.sv: Verilog; test.py: Python)."""
    if not isinstance(test, Mapping):
        return CodeHint()
    pattern = test.get("codePattern") if isinstance(test.get("codePattern"), str) else None
    language = test.get("language")
    if isinstance(language, str) and language.lower() in LANGUAGES:
        return CodeHint(language.lower(), pattern)
    files = test.get("files")
    names = [str(n).lower() for n in files] if isinstance(files, Mapping) else []
    for name, lang in LANGUAGES.items():
        if any(n.endswith(lang.extensions) for n in names):
            return CodeHint(name, pattern)
    return CodeHint(None, pattern)


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that at least one of k of the n samples passes, c of them passing."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def problem_pass_at_k(passed: Sequence[Sequence[bool]], k: int) -> list[float]:
    """The estimator per problem (its verdicts, one per sample)."""
    return [pass_at_k(len(v), sum(v), k) for v in passed]


def mean_pass_at_k(passed: Sequence[Sequence[bool]], k: int) -> float:
    """The set's pass@k: the estimator per problem (its verdicts, one per sample), averaged over problems."""
    if not passed:
        raise ValueError("pass@k of no problems")
    return sum(problem_pass_at_k(passed, k)) / len(passed)


def resamples_of(problems: int, resamples: int, seed: int) -> list[list[int]]:
    """`resamples` draws of `problems` problem indices with replacement, from a fixed seed: the same draws
    serve every k and both models, so their intervals are comparable and a rerun gives the same ones."""
    if problems < 1 or resamples < 1:
        raise ValueError(f"a bootstrap needs problems and resamples (got {problems} and {resamples})")
    rng = random.Random(seed)
    return [rng.choices(range(problems), k=problems) for _ in range(resamples)]


def bootstrap_interval(values: Sequence[float], draws: Sequence[Sequence[int]], level: float) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (one per problem) at `level` (0.95), over
    `draws` (resamples_of). Widened, if need be, to hold the mean itself."""
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is between 0 and 1 (got {level})")
    means = sorted(sum(values[i] for i in d) / len(d) for d in draws)
    tail = (1 - level) / 2
    low = means[min(math.floor(tail * len(means)), len(means) - 1)]
    high = means[max(math.ceil((1 - tail) * len(means)) - 1, 0)]
    mean = sum(values) / len(values)
    return min(low, mean), max(high, mean)


def _blocks(answer: str) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block, in order; an unclosed last fence counts as a block up to the
    end of the answer."""
    found = [(m.group("info").strip(), m.group("body").strip("\n")) for m in _FENCE.finditer(answer)]
    end = max((m.end() for m in _FENCE.finditer(answer)), default=0)
    opened = _OPEN.search(answer, end)
    if opened is not None and opened.group("fence") not in answer[opened.end() :]:
        found.append((opened.group("info").strip(), answer[opened.end() :].strip()))
    return found


def _info_language(info: str) -> str:
    return info.split()[0].lower().lstrip("{.").rstrip("}") if info.split() else ""


def extract_code(answer: str, hint: CodeHint | None = None) -> str:
    """The code in an answer. Among its fenced blocks (``` or ~~~, an unclosed last one included), the last
    that matches the hint's `pattern`; else the last that declares code of the hint's language (a Verilog
    `module`, a Python `def`/`class`/`import`); else the last whose info string names the language; else the
    last block. Without a fenced block: for a language with a known span (Verilog: from the first `module` to
    the last `endmodule`), that span; else the whole answer with surrounding whitespace stripped."""
    hint = hint or CodeHint()
    lang = LANGUAGES.get(hint.language or "")
    blocks = _blocks(answer)
    if blocks:
        preferences: list[Callable[[str, str], bool]] = []
        if hint.pattern:
            pattern = re.compile(hint.pattern, re.MULTILINE)
            preferences.append(lambda info, body: pattern.search(body) is not None)
        if lang is not None:
            declares, names = lang.declares, lang.names
            preferences.append(lambda info, body: declares.search(body) is not None)
            preferences.append(lambda info, body: _info_language(info) in names)
        for prefer in preferences:
            chosen = [body for info, body in blocks if prefer(info, body)]
            if chosen:
                return chosen[-1]
        return blocks[-1][1]
    if lang is not None and lang.span is not None:
        start, stop = lang.span
        first, ends = start.search(answer), list(stop.finditer(answer))
        if first is not None and ends and ends[-1].start() > first.start():
            return answer[first.start() : ends[-1].end()].strip()
    return answer.strip()


def problem_seed(seed: int, index: int) -> int:
    """The sampling seed of problem `index` (its 0-based place in the set): the same for the base and the
    adapter, and for every rerun with the same spec.evaluation.code.seed."""
    return (seed + index) % _SEED_RANGE
