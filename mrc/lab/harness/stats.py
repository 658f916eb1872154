"""The statistics the benchmarks report over their runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float | None:
    """The median of ``values``; None when there are none (every run failed), which a report
    prints as "-" and JSON as null rather than a made-up zero."""
    return statistics.median(values) if values else None
