"""The pass@k interval's coverage, measured: sets of 12 problems with n=5 samples each are drawn from a known
true pass@1 (every problem alike, or problems of mixed difficulty drawn from a known mix: the truth is then the
mix's mean, the pass@1 of the population the set's problems come from), the interval is computed as the
evaluator computes it (evaluate.passk.exact_interval over the per-problem estimates), and the share of sets
whose interval holds the truth must be at least the nominal level, each tail at most its half of the rest."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache

import pytest

from tpuforge.api.code_eval import CONFIDENCE_LEVEL
from tpuforge_workloads.evaluate.passk import exact_interval, pass_at_k, standard_error

PROBLEMS, SAMPLES, TRIALS = 12, 5, 4000


@cache
def _interval(successes_in_fifths: int) -> tuple[float, float]:
    # pass@1 per problem is c/5, so a set's sum of estimates takes few values: compute each once.
    x = successes_in_fifths / SAMPLES
    return exact_interval([x / PROBLEMS] * PROBLEMS, CONFIDENCE_LEVEL)


def coverage(rates: Callable[[random.Random], list[float]], truth: float, seed: int = 0) -> tuple[float, float, float]:
    """(covered, low above the truth, high below it), as shares of TRIALS sets of problems of `rates`."""
    rng = random.Random(seed)
    covered = above = below = 0
    for _ in range(TRIALS):
        p = rates(rng)
        passed = [sum(rng.random() < r for _ in range(SAMPLES)) for r in p]
        low, high = _interval(sum(passed))
        covered += low <= truth <= high
        above += low > truth
        below += high < truth
    return covered / TRIALS, above / TRIALS, below / TRIALS


def mix(*rates: float) -> Callable[[random.Random], list[float]]:
    """Problems whose true pass@1 is one of `rates`, each as likely."""
    return lambda rng: [rng.choice(rates) for _ in range(PROBLEMS)]


# name -> (the problems' true rates, the true pass@1)
CASES = {
    "every problem at 0.8": (mix(0.8), 0.8),
    "every problem at 0.5": (mix(0.5), 0.5),
    "every problem at 0.95": (mix(0.95), 0.95),
    "mixed, mean 0.8": (mix(1.0, 1.0, 0.9, 0.5, 0.6), 0.8),
    "pass or fail, mean 0.8": (mix(1.0, 1.0, 1.0, 1.0, 0.0), 0.8),
    "mixed, mean 0.3": (mix(0.0, 0.0, 0.0, 0.5, 1.0), 0.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_interval_covers_the_truth_at_least_as_often_as_it_promises_with_12_problems(case: str) -> None:
    covered, above, below = coverage(*CASES[case])
    tail = (1 - CONFIDENCE_LEVEL) / 2
    assert covered >= CONFIDENCE_LEVEL, (case, covered, above, below)
    assert above <= tail and below <= tail, (case, covered, above, below)


def test_all_pass_and_all_fail_keep_an_honest_width() -> None:
    # 10 of 10 problems pass every sample: the low bound is the exact binomial one, not 1.0.
    low, high = exact_interval([1.0] * 10, 0.95)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10), abs=1e-6)  # 0.6915
    low, high = exact_interval([0.0] * 10, 0.95)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-6)
    assert exact_interval([pass_at_k(5, 5, 1)] * 3, 0.95)[0] < 0.3  # three problems prove little
    with pytest.raises(ValueError, match="confidence level"):
        exact_interval([0.5], 1.5)


def test_more_problems_narrow_the_interval_and_the_standard_error() -> None:
    per = [1.0, 0.0, 0.4, 0.6]
    small, large = exact_interval(per, 0.95), exact_interval(per * 25, 0.95)
    assert large[1] - large[0] < (small[1] - small[0]) / 3
    assert standard_error(per * 25) < standard_error(per) / 4
    assert standard_error([1.0]) == 0.0
