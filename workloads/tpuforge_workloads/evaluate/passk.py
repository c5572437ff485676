"""The pure parts of functional evaluation: pass@k from n samples, its confidence interval, the code taken
from an answer, the seeds.

pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c pass, the chance that k
drawn without replacement include at least one that passes, 1 - C(n-c, k) / C(n, k), computed as a product
so that it stays exact for large n. The set's pass@k is the mean over its problems.

Its confidence interval is an exact binomial (Clopper-Pearson) interval over problems: the m problems'
estimates, each in [0, 1], summed as x successes out of m trials. A score in [0, 1] with mean p varies at most
as much as a pass/fail one with the same mean (p(1 - p)), so the bound that is exact for m pass/fail problems
holds for any mix of problems, whatever each one's own n samples drew: it covers both which problems the set
happens to hold and which answers the model happened to draw. It needs no minimum count (12 problems is
enough: its coverage is measured in tests/workloads/evaluate/test_interval_coverage.py), stays inside [0, 1],
and does not collapse when every problem scores alike (10 of 10: the low bound is 0.69, not 1). A percentile
bootstrap, used before, covered less than it promised with few problems.

Two models scored on the same problems (the SFT start and the tuned model, a base and its adapter) are compared
by a paired interval on the rise, after - before, over the problems (`paired_rise`), not by whether their two
intervals above overlap (each carries the problems' own spread, which the pairing cancels):

- greedy pass@1 (0/1 per problem): Newcombe's square-and-add interval for the difference of paired
  proportions (Newcombe 1998, Statistics in Medicine 17:2635, the hybrid score interval; the form Fagerland,
  Lydersen and Laake's "Statistical Analysis of Contingency Tables" gives for the paired 2x2 table), built here
  from continuity-corrected Wilson intervals of the two pass rates, which keeps it at or above its level at 12
  to 20 problems where the uncorrected one dips below (tests/workloads/evaluate/test_paired_rise.py measures
  both). Beside it, the exact McNemar test's p-value (twice the binomial tail of the problems that changed,
  b rose and c fell, at one half). An interval from the discordant split alone (Clopper-Pearson on b of
  b + c, scaled by (b + c) / m) was rejected: it takes the count of changed problems as known and, when
  every change is a rise, covers the true rise only about 60% of the time.
- pass@1 estimated from samples (a fraction per problem): the Student t interval of the mean per-problem
  difference, m - 1 degrees of freedom, clipped to [-1, 1]. It needs no seed, and at 12 to 20 problems its
  t quantile (2.20 at 11 degrees of freedom) keeps it wider than a paired percentile bootstrap, which acts
  like a normal interval with the spread's divisor m (1.96 * sqrt(11 / 12) = 1.88 standard errors at 12) and,
  like the percentile bootstrap of one score above, covers less than it promises with few problems. Its
  coverage is measured in
  tests/workloads/evaluate/test_paired_rise.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
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
        # A module with ports (or parameters): a design; a testbench (`module tb;`) has none.
        re.compile(r"^[ \t]*module\s+[A-Za-z_]\w*\s*[#(]", re.MULTILINE),
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
    the code must match (`codePattern` in the record's test, e.g. `module\\s+TopModule\\b`, or the one that
    defines the test's `module`)."""

    language: str | None = None
    pattern: str | None = None


def code_hint(test: Any) -> CodeHint:
    """The extraction hint of a record's test object: its `language` and `codePattern` when set (without a
    codePattern, a test naming its `module` asks for the block that defines that module); else the language
    its test files are written in (tb.v, tb.sv: Verilog; test.py: Python)."""
    if not isinstance(test, Mapping):
        return CodeHint()
    pattern = test.get("codePattern") if isinstance(test.get("codePattern"), str) else None
    module = test.get("module")
    if pattern is None and isinstance(module, str) and module:
        pattern = rf"^[ \t]*module\s+{re.escape(module)}\b"
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


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's method)."""
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            step = 1.0
        elif i % 2:
            step = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            step = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + step * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + step / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return f - 1.0


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b): P(X <= x) for X ~ Beta(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only: use the symmetry
        return 1.0 - beta_cdf(1.0 - x, b, a)
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b)) / a
    return front * _beta_fraction(x, a, b)


def beta_quantile(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q, by bisection (to 1e-10)."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if beta_cdf(mid, a, b) < q else (lo, mid)
    return (lo + hi) / 2


def exact_interval(values: Sequence[float], level: float) -> tuple[float, float]:
    """The Clopper-Pearson interval at `level` (0.95) of the mean of `values`, one per problem, each in [0, 1],
    their sum taken as the successes of len(values) trials. All pass: (lower bound, 1); all fail: (0, upper)."""
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is between 0 and 1 (got {level})")
    if not values:
        raise ValueError("an interval of no problems")
    m, x = len(values), min(max(sum(values), 0.0), float(len(values)))
    tail = (1 - level) / 2
    low = beta_quantile(tail, x, m - x + 1) if x > 0 else 0.0
    high = beta_quantile(1 - tail, x + 1, m - x) if x < m else 1.0
    mean = x / m
    return min(low, mean), max(high, mean)


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of `values` (one per problem): what a rerun on other problems, or other
    samples of the same ones, would move the score by (0 for fewer than 2 problems)."""
    m = len(values)
    if m < 2:
        return 0.0
    mean = sum(values) / m
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (m - 1) / m)


@cache
def t_quantile(q: float, df: int) -> float:
    """The q quantile of Student's t with `df` degrees of freedom, from P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2)."""
    if not 0 < q < 1 or df < 1:
        raise ValueError(f"a t quantile needs 0 < q < 1 and df >= 1 (got q={q}, df={df})")
    if q == 0.5:
        return 0.0
    two_sided = 2 * min(q, 1 - q)  # P(|T| > t) at the quantile sought
    lo, hi = 0.0, 1.0
    while beta_cdf(df / (df + hi * hi), df / 2, 0.5) > two_sided:
        hi *= 2
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if beta_cdf(df / (df + mid * mid), df / 2, 0.5) > two_sided else (lo, mid)
    t = (lo + hi) / 2
    return t if q > 0.5 else -t


@cache
def normal_quantile(q: float) -> float:
    """The q quantile of the standard normal, by bisection on erf (to 1e-12)."""
    if not 0 < q < 1:
        raise ValueError(f"a quantile needs 0 < q < 1 (got {q})")
    lo, hi = -40.0, 40.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < q else (lo, mid)
    return (lo + hi) / 2


def wilson_interval(x: int, n: int, level: float, corrected: bool = True) -> tuple[float, float]:
    """The Wilson score interval at `level` of x passes out of n, with continuity correction (Newcombe 1998's
    method 4 for one proportion) unless `corrected` is False."""
    if n < 1 or not 0 <= x <= n:
        raise ValueError(f"a Wilson interval needs 0 <= x <= n and n >= 1 (got x={x}, n={n})")
    z, p = normal_quantile(1 - (1 - level) / 2), x / n
    if not corrected:
        half = z * math.sqrt(z * z + 4 * n * p * (1 - p))
        return max((2 * n * p + z * z - half) / (2 * (n + z * z)), 0.0), min(
            (2 * n * p + z * z + half) / (2 * (n + z * z)), 1.0
        )
    low = 0.0
    if x > 0:
        low = (2 * n * p + z * z - 1 - z * math.sqrt(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1))) / (2 * (n + z * z))
    high = 1.0
    if x < n:
        high = (2 * n * p + z * z + 1 + z * math.sqrt(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1))) / (
            2 * (n + z * z)
        )
    return max(low, 0.0), min(high, 1.0)


def paired_counts(before: Sequence[bool], after: Sequence[bool]) -> dict[str, int]:
    """The paired 2x2 table of two verdicts per problem: how many problems rose (fail -> pass), fell, passed both
    times and failed both times."""
    if len(before) != len(after):
        raise ValueError(f"paired verdicts of as many problems before as after (got {len(before)}, {len(after)})")
    pairs = [(bool(b), bool(a)) for b, a in zip(before, after, strict=True)]
    return {
        "rose": pairs.count((False, True)),
        "fell": pairs.count((True, False)),
        "bothPassed": pairs.count((True, True)),
        "bothFailed": pairs.count((False, False)),
    }


def paired_proportion_interval(
    before: Sequence[bool], after: Sequence[bool], level: float, corrected: bool = True
) -> tuple[float, float]:
    """Newcombe's square-and-add interval at `level` of the rise in pass@1, after - before, of two pass/fail
    verdicts per problem on the same problems: the Wilson intervals (continuity-corrected unless `corrected` is
    False) of the two pass rates, combined with their correlation phi (AD - BC over the root of the margins'
    product, its numerator less m/2 when above m/2 and 0 when between 0 and m/2; 0 when a margin is empty)."""
    if not before:
        raise ValueError("an interval of no problems")
    t = paired_counts(before, after)
    m, a, b, c, d = len(before), t["bothPassed"], t["rose"], t["fell"], t["bothFailed"]
    p1, p2 = (a + b) / m, (a + c) / m  # after, before
    l1, u1 = wilson_interval(a + b, m, level, corrected)
    l2, u2 = wilson_interval(a + c, m, level, corrected)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    cross_corrected = cross - m / 2 if cross > m / 2 else (0.0 if cross >= 0 else float(cross))
    phi = cross_corrected / math.sqrt(margins) if margins else 0.0
    rise = p1 - p2
    down = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    up = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    return max(rise - math.sqrt(max(down, 0.0)), -1.0), min(rise + math.sqrt(max(up, 0.0)), 1.0)


def mcnemar_exact_p(before: Sequence[bool], after: Sequence[bool]) -> float:
    """The exact McNemar test's two-sided p-value of "no change": of the problems whose verdict changed, the
    chance under a fair coin of a split at least as lopsided as the one seen (1 when none changed)."""
    t = paired_counts(before, after)
    changed, more = t["rose"] + t["fell"], max(t["rose"], t["fell"])
    tail = sum(math.comb(changed, k) for k in range(more, changed + 1)) / (1 << changed)
    return min(1.0, 2 * tail)


def paired_t_interval(before: Sequence[float], after: Sequence[float], level: float) -> tuple[float, float]:
    """The Student t interval at `level` of the mean of after - before, one score in [0, 1] each per problem on
    the same problems (pass@1 estimated from samples), m - 1 degrees of freedom, clipped to [-1, 1]. One
    problem, or every difference alike: the mean, with no spread to widen it."""
    if len(before) != len(after):
        raise ValueError(f"paired scores of as many problems before as after (got {len(before)}, {len(after)})")
    if not before:
        raise ValueError("an interval of no problems")
    if not 0 < level < 1:
        raise ValueError(f"a confidence level is between 0 and 1 (got {level})")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    mean, m = sum(diffs) / len(diffs), len(diffs)
    if m < 2:
        return mean, mean
    half = t_quantile(1 - (1 - level) / 2, m - 1) * standard_error(diffs)
    return max(mean - half, -1.0), min(mean + half, 1.0)


def paired_rise(before: Sequence[float], after: Sequence[float], level: float, exact: bool) -> dict[str, Any]:
    """The rise in pass@1 from `before` to `after` (one score per problem, the same problems in the same order)
    with its paired interval at `level`: for 0/1 verdicts (`exact`), Newcombe's (paired_proportion_interval),
    with the paired counts and the exact McNemar p-value; for per-problem fractions, the t interval
    (paired_t_interval). `beyondInterval`: the interval's low bound is above 0."""
    if len(before) != len(after):
        raise ValueError(f"paired scores of as many problems before as after (got {len(before)}, {len(after)})")
    if not before:
        raise ValueError("a rise over no problems")
    extra: dict[str, Any]
    if exact:
        if any(v not in (0, 1) for v in (*before, *after)):
            raise ValueError("the paired proportion interval takes 0/1 verdicts per problem")
        pb, pa = [bool(v) for v in before], [bool(v) for v in after]
        low, high = paired_proportion_interval(pb, pa, level)
        extra = {
            **paired_counts(pb, pa),
            "mcnemarExactP": mcnemar_exact_p(pb, pa),
            "method": "Newcombe square-and-add, continuity-corrected Wilson",
        }
    else:
        low, high = paired_t_interval(before, after, level)
        extra = {"method": "Student t over the per-problem differences"}
    return {
        "rise": (sum(after) - sum(before)) / len(before),
        "interval": [low, high],
        "beyondInterval": low > 0,
        **extra,
    }


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
    module with ports, not a testbench; a Python `def`/`class`/`import`); else the last whose info string
    names the language; else the last block. Without a fenced block: for a language with a known span
    (Verilog: from the first `module` to the last `endmodule`), that span; else the whole answer with
    surrounding whitespace stripped."""
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
