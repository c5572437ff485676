"""The short texts `kubectl get` shows for status numbers. Printer columns can only show fields, so status
carries these strings beside the numbers; the trainer and the operator both format through these functions,
so a value never reads differently depending on who wrote it."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """A duration in its two largest units, as kubectl prints ages: 45s, 1m41s, 3h12m, 2d5h."""
    s = max(math.ceil(seconds), 0)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size}{unit}" + (f"{rest}{sub}" if rest else "")
    return f"{s}s"


def significant(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits, trailing zeros kept (2.500, 0.01234, 1234)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    text = f"{value:#.{digits}g}"
    return text.rstrip(".") if "e" not in text else text


def hbm_gib(value: float) -> str:
    """A chip's HBM in GiB as libtpu gives it (95.74, 31.25, 15.75); a whole number without decimals (95)."""
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def percent(value: float) -> str:
    """Percent done: whole numbers except near the ends, where a tenth says that something moved (0.4%, 99.9%)."""
    if 0 < value < 1 or 99 < value < 100:
        return f"{math.floor(value * 10) / 10:.1f}%"
    return f"{math.floor(value):.0f}%"


def usd(value: float) -> str:
    """An amount in US dollars, to the cent: $1.23, $1,234.50."""
    return f"${value:,.2f}"


def verdict(passed: bool, metrics: dict[str, float]) -> str:
    """An evaluation's verdict, with its pass@k at the smallest k when code was run: Passed, or
    Failed (pass@1 0.17). Other metrics stay out: the column has room for one number."""
    word = "Passed" if passed else "Failed"
    ks = sorted(int(name.removeprefix("pass@")) for name in metrics if name.startswith("pass@"))
    return f"{word} (pass@{ks[0]} {metrics[f'pass@{ks[0]}']:.2f})" if ks else word


def estimate(shown: str) -> str:
    """A figure shown as an estimate, not a measurement: ~2h10m (est)."""
    return f"~{shown} (est)"
