"""The pure parts of functional evaluation: pass@k from n samples, the code taken from an answer, the seeds.

pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c pass, the chance that k
drawn without replacement include at least one that passes, 1 - C(n-c, k) / C(n, k), computed as a product
so that it stays exact for large n. The set's pass@k is the mean over its problems.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A fenced block: ``` or ~~~ (3 or more), an optional info string, the body, the same fence closing it.
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL)
# Problem i is sampled with seed + i; the seed stays below 2**31 for engines that take a signed 32-bit seed.
_SEED_RANGE = 2**31


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


def mean_pass_at_k(passed: Sequence[Sequence[bool]], k: int) -> float:
    """The set's pass@k: the estimator per problem (its verdicts, one per sample), averaged over problems."""
    if not passed:
        raise ValueError("pass@k of no problems")
    return sum(pass_at_k(len(v), sum(v), k) for v in passed) / len(passed)


def extract_code(answer: str) -> str:
    """The code in an answer: the body of its last fenced block (``` or ~~~, any language tag), else the whole
    answer with surrounding whitespace stripped. An unclosed last fence yields what follows it."""
    blocks = [m.group("body") for m in _FENCE.finditer(answer)]
    if blocks:
        return blocks[-1].strip("\n")
    opened = re.search(r"^(`{3,}|~{3,})[^\n]*\n", answer, re.MULTILINE)
    if opened is not None and answer.count(opened.group(1)) == 1:
        return answer[opened.end() :].strip()
    return answer.strip()


def problem_seed(seed: int, index: int) -> int:
    """The sampling seed of problem `index` (its 0-based place in the set): the same for the base and the
    adapter, and for every rerun with the same spec.evaluation.code.seed."""
    return (seed + index) % _SEED_RANGE
