"""The paired interval of a rise in pass@1 (evaluate.passk): its parts against values worked by hand, and its
coverage measured. Two models are scored on the same problems; the truth is the rise over the population the
problems come from (a mix of kinds of problem, each kind with a chance to rise, fall, pass or fail both times, or
a pass@1 before and after), sets of 12 or 20 problems are drawn from it, and the share of sets whose interval
holds the truth is counted."""

from __future__ import annotations

import math
import random

import pytest

from tpuforge_workloads.evaluate.passk import (
    exact_interval,
    mcnemar_exact_p,
    normal_quantile,
    paired_counts,
    paired_proportion_interval,
    paired_rise,
    paired_t_interval,
    t_quantile,
    wilson_interval,
)

Z = 1.959963984540054  # the normal's 0.975 quantile


def table(both: int, rose: int, fell: int, neither: int) -> tuple[list[bool], list[bool]]:
    """(before, after) verdicts of a paired 2x2 table's problems."""
    before = [True] * both + [False] * rose + [True] * fell + [False] * neither
    after = [True] * both + [True] * rose + [False] * fell + [False] * neither
    return before, after


def test_the_quantiles_are_the_tables() -> None:
    assert normal_quantile(0.975) == pytest.approx(Z, abs=1e-9)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-9)
    # Student t, two-sided 95%: 12.706 at 1 degree of freedom, 4.303 at 2, 2.201 at 11, 2.093 at 19.
    for df, t in ((1, 12.706205), (2, 4.302653), (11, 2.200985), (19, 2.093024)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-5)
        assert t_quantile(0.025, df) == pytest.approx(-t, abs=1e-5)
    assert t_quantile(0.5, 7) == 0.0
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


def test_the_wilson_interval_by_hand() -> None:
    # 0 of 10 with continuity correction: the upper bound is (z^2 + 1 + z sqrt(z^2 + 2 - 1/10)) / (2 (10 + z^2)).
    high = (Z * Z + 1 + Z * math.sqrt(Z * Z + 2 - 0.1)) / (2 * (10 + Z * Z))
    assert wilson_interval(0, 10, 0.95) == pytest.approx((0.0, high))
    assert high == pytest.approx(0.3445, abs=1e-4)
    # 10 of 10 mirrors it; without the correction the low bound of n of n is n / (n + z^2).
    assert wilson_interval(10, 10, 0.95) == pytest.approx((1 - high, 1.0))
    assert wilson_interval(10, 10, 0.95, corrected=False) == pytest.approx((10 / (10 + Z * Z), 1.0))
    low, high = wilson_interval(5, 10, 0.95)
    assert low == pytest.approx(1 - high) and low < 0.5 < high


def test_the_paired_counts_and_the_exact_mcnemar_p() -> None:
    before, after = table(6, 5, 0, 1)
    assert paired_counts(before, after) == {"rose": 5, "fell": 0, "bothPassed": 6, "bothFailed": 1}
    assert mcnemar_exact_p(before, after) == pytest.approx(2 / 2**5)  # 0.0625: five of five is not enough
    assert mcnemar_exact_p(*table(6, 6, 0, 0)) == pytest.approx(2 / 2**6)  # 0.031
    assert mcnemar_exact_p(*table(3, 8, 1, 8)) == pytest.approx(2 * (1 + 9) / 2**9)  # 8 of 9: 0.039
    assert mcnemar_exact_p(*table(4, 0, 0, 8)) == 1.0  # nothing changed
    assert mcnemar_exact_p(*table(4, 2, 2, 4)) == 1.0  # min(1, twice a tail past one half)
    with pytest.raises(ValueError, match="as many problems"):
        paired_counts([True], [True, False])


def test_the_paired_proportion_interval_by_hand() -> None:
    # Every problem rose (0 of 10 before, 10 of 10 after): a margin is empty, so phi is 0, and the low bound is
    # 1 - sqrt((1 - l1)^2 + u2^2) with l1 = 1 - u2 by symmetry: 1 - sqrt(2) u2; the high bound is 1.
    u2 = wilson_interval(0, 10, 0.95)[1]
    assert paired_proportion_interval(*table(0, 10, 0, 0), 0.95) == pytest.approx((1 - math.sqrt(2) * u2, 1.0))
    # Nothing changed, half passing: the interval is symmetric around 0 and narrower than phi = 0 would make it
    # (phi = (36 - 12 / 2) / 36 with both margins 6 and 6).
    low, high = paired_proportion_interval(*table(6, 0, 0, 6), 0.95)
    wh = wilson_interval(6, 12, 0.95)[1]
    assert low == pytest.approx(-high)
    assert high == pytest.approx(math.sqrt(2 * (wh - 0.5) ** 2 * (1 - 30 / 36)))
    # Rises and falls swapped: the interval mirrors.
    up = paired_proportion_interval(*table(6, 5, 1, 0), 0.95)
    down = paired_proportion_interval(*table(6, 1, 5, 0), 0.95)
    assert up == pytest.approx((-down[1], -down[0]))
    # The table of the 12-problem run before this interval (6 both, 5 rose, 0 fell, 1 neither): the low bound
    # just under 0, as the exact McNemar test (p 0.0625) says; without the correction it would be just above.
    assert paired_proportion_interval(*table(6, 5, 0, 1), 0.95) == pytest.approx((-0.0060, 0.7048), abs=1e-4)
    assert paired_proportion_interval(*table(6, 5, 0, 1), 0.95, corrected=False) == pytest.approx(
        (0.0509, 0.6722), abs=1e-4
    )


def test_the_paired_t_interval_by_hand() -> None:
    # Differences 0, 0.5, 1: mean 0.5, standard deviation 0.5, t(0.975, 2) = 4.3027; clipped at 1.
    low, high = paired_t_interval([0.0, 0.0, 0.0], [0.0, 0.5, 1.0], 0.95)
    assert low == pytest.approx(0.5 - 4.302653 * 0.5 / math.sqrt(3), abs=1e-5) and high == 1.0
    # Every difference alike: no spread, the interval is the mean.
    assert paired_t_interval([0.25] * 5, [0.75] * 5, 0.95) == pytest.approx((0.5, 0.5))
    assert paired_t_interval([0.5], [1.0], 0.95) == (0.5, 0.5)
    with pytest.raises(ValueError, match="as many problems"):
        paired_t_interval([0.5], [0.5, 1.0], 0.95)


def test_paired_rise_reports_the_rise_its_interval_and_the_verdict() -> None:
    before, after = table(10, 8, 0, 2)
    r = paired_rise([int(v) for v in before], [int(v) for v in after], 0.95, exact=True)
    assert r["rise"] == pytest.approx(0.4) and r["rose"] == 8 and r["fell"] == 0 and r["bothFailed"] == 2
    assert r["interval"][0] > 0 and r["beyondInterval"] is True
    assert r["mcnemarExactP"] == pytest.approx(2 / 2**8)
    assert paired_rise(*table(6, 5, 0, 1), 0.95, exact=True)["beyondInterval"] is False
    s = paired_rise([0.5, 0.25, 0.0], [1.0, 0.75, 0.5], 0.95, exact=False)
    assert s["rise"] == pytest.approx(0.5) and s["interval"] == pytest.approx([0.5, 0.5]) and s["beyondInterval"]
    assert "rose" not in s and s["method"].startswith("Student t")
    with pytest.raises(ValueError, match="0/1 verdicts"):
        paired_rise([0.5], [1.0], 0.95, exact=True)


# (both, rose, fell, neither) chances of a problem; the true rise is rose - fell.
KINDS = {
    "most rise, none fall": (0.5, 0.4, 0.0, 0.1),
    "rise and some fall": (0.5, 0.3, 0.05, 0.15),
    "as many fall as rise": (0.4, 0.1, 0.1, 0.4),
    "changes swap often": (0.3, 0.2, 0.2, 0.3),
    "few changes, all rises": (0.9, 0.05, 0.0, 0.05),
}
TRIALS = 2000


def _discordant_split(before: list[bool], after: list[bool]) -> tuple[float, float]:
    """The rejected interval: Clopper-Pearson on the rises among the changed problems, scaled to the rise."""
    t = paired_counts(before, after)
    changed = t["rose"] + t["fell"]
    if not changed:
        return 0.0, 0.0
    low, high = exact_interval([1.0] * t["rose"] + [0.0] * t["fell"], 0.95)
    return changed / len(before) * (2 * low - 1), changed / len(before) * (2 * high - 1)


def _verdict_coverage(m: int, chances: tuple[float, ...], interval: object, seed: int = 0) -> float:
    rng, truth, covered = random.Random(seed), chances[1] - chances[2], 0
    for _ in range(TRIALS):
        counts = [0, 0, 0, 0]
        for kind in rng.choices(range(4), weights=chances, k=m):
            counts[kind] += 1
        low, high = interval(*table(*counts))  # type: ignore[operator]
        covered += low - 1e-12 <= truth <= high + 1e-12
    return covered / TRIALS


@pytest.mark.parametrize("m", [12, 20])
def test_newcombes_interval_covers_the_true_rise_at_least_as_often_as_it_promises(m: int) -> None:
    uncorrected = []
    for kind, chances in KINDS.items():
        corrected = _verdict_coverage(m, chances, lambda b, a: paired_proportion_interval(b, a, 0.95))
        assert corrected >= 0.95, (kind, corrected)
        uncorrected.append(
            _verdict_coverage(m, chances, lambda b, a: paired_proportion_interval(b, a, 0.95, corrected=False))
        )
    if m == 12:  # why the correction: without it the interval dips below its level with few problems
        assert min(uncorrected) < 0.945, uncorrected
    # The interval from the discordant split alone takes the count of changes as known: when every change is a
    # rise it misses the true rise about as often as it holds it.
    assert _verdict_coverage(m, KINDS["most rise, none fall"], _discordant_split) < 0.7


# (pass@1 before, after) of each kind of problem, as likely each; 8 samples a problem, as the benchmark draws.
MIXES = {
    "every problem 0.5 -> 0.9": ((0.5, 0.9),),
    "mixed rises": ((0.1, 0.9), (0.9, 1.0), (0.5, 0.5), (0.2, 0.8)),
    "no change": ((0.5, 0.5),),
    "all or nothing": ((0.0, 1.0), (1.0, 1.0)),
    "rises and falls": ((0.5, 0.95), (0.5, 0.05)),
}


@pytest.mark.parametrize("m", [12, 20])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_the_t_interval_of_sampled_pass_at_1_covers_the_true_rise_about_as_often_as_it_promises(
    m: int, mix: str
) -> None:
    pairs, samples = MIXES[mix], 8
    truth = sum(a - b for b, a in pairs) / len(pairs)
    rng, covered, above, below = random.Random(1), 0, 0, 0
    for _ in range(TRIALS):
        chosen = [rng.choice(pairs) for _ in range(m)]
        before = [sum(rng.random() < b for _ in range(samples)) / samples for b, _ in chosen]
        after = [sum(rng.random() < a for _ in range(samples)) / samples for _, a in chosen]
        low, high = paired_t_interval(before, after, 0.95)
        covered += low - 1e-12 <= truth <= high + 1e-12
        above += low > truth + 1e-12
        below += high < truth - 1e-12
    # Within the Monte Carlo error of 2000 sets (a standard error of 0.005) of 95%, neither tail far past 2.5%.
    assert covered / TRIALS >= 0.935 and max(above, below) / TRIALS <= 0.045, (covered, above, below)
