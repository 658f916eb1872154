"""The statistics the benchmarks report: over their runs (medians, rounded) and over the
streams of one run (how fairly they shared, Jain's index)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def median(values: Sequence[float]) -> float | None:
    """The median of ``values``; None when there are none (every run failed), which a report
    prints as "-" and JSON as null rather than a made-up zero."""
    return statistics.median(values) if values else None


def rounded(x: float | None, ndigits: int | None) -> float | None:
    """``x`` rounded to ``ndigits`` places (None: to a whole number, an int as :func:`round`
    gives, so the JSON says 1234 rather than 1234.0), None left None: a figure that was not
    measured (no median, no rate) stays null in the JSON where rounding it would fail. Every
    report rounds what it prints to what it knows, so it is here rather than in each of them."""
    return None if x is None else round(x, ndigits)


def medians(
    runs: Sequence[Mapping[str, Any]], keys: Iterable[str], ndigits: int | None = None
) -> dict[str, float | None]:
    """The median of each of ``keys`` over the ``runs`` that have it (a missing or None value is
    a run that could not measure it, not a zero), rounded to ``ndigits`` places if given: a
    summary that prints 0.78784999 says more than it knows. The summary line of a benchmark
    that repeats its measurement is this, so each keeps its list of keys, not a loop of its own."""
    out: dict[str, float | None] = {}
    for k in keys:
        m = median([r[k] for r in runs if r.get(k) is not None])
        out[k] = m if ndigits is None else rounded(m, ndigits)
    return out


def jain(rates: Sequence[float]) -> float | None:
    """Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when every stream got the same rate,
    1/n when one got everything; None without rates (none, or all zero)."""
    squares = sum(x * x for x in rates)
    return sum(rates) ** 2 / (len(rates) * squares) if squares > 0 else None
