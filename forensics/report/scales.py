"""Axes that tell the truth about a curve, and curves thinned to what a plot can show.

Plotly fits the y axis to the data, so a loss that wanders between 6.70 and 6.72 fills the panel and looks
like a collapse. A range narrower than a few percent of the values' size is widened to that band; values
that span decades so unevenly that a linear axis would flatten most of them to its floor (a decaying
learning rate, a grad norm that exploded) get a log axis, on which both the quiet part and the blow-up stay
readable; a reward that climbs from 0.001 to 0.9 stays linear. Long series are cut to a few thousand
points per trace, keeping each bucket's lowest and highest value so that a spike survives the thinning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

LOG_SPAN = 100.0  # largest / smallest positive value from which the axis may turn logarithmic (two decades)
FLATTENED_SHARE = 0.5  # ... when a linear axis would press at least this share of the points into its bottom 5%
CALM_FRACTION = 0.05  # the y range spans at least this fraction of the values' magnitude
MAX_POINTS = 2000  # per trace in a figure


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def value_axis(values: Iterable[float | None]) -> dict[str, Any]:
    """Plotly y-axis settings for these values: `type: log`, a calm `range`, or nothing (plotly's own fit)."""
    shown = finite(values)
    if len(shown) < 2:
        return {}
    lo, hi = min(shown), max(shown)
    if lo > 0 and hi / lo >= LOG_SPAN:
        floor = lo + 0.05 * (hi - lo)
        if sum(v <= floor for v in shown) >= FLATTENED_SHARE * len(shown):
            return {"type": "log"}
    magnitude = max(abs(lo), abs(hi))
    if magnitude == 0 or hi - lo >= CALM_FRACTION * magnitude:
        return {}
    half = CALM_FRACTION * magnitude / 2  # under the values' magnitude: a positive quantity's axis stays positive
    centre = (lo + hi) / 2
    return {"range": [centre - half, centre + half]}


def thin(xs: Sequence[Any], ys: Sequence[float | None], cap: int = MAX_POINTS) -> tuple[list[Any], list[float | None]]:
    """About `cap` points: per bucket the first, lowest and highest, and every NaN or inf, in x order.

    A short series is unchanged.
    """
    n = len(xs)
    if n <= cap:
        return list(xs), list(ys)
    buckets = max(1, cap // 3)
    size = n / buckets
    keep: set[int] = {0, n - 1} | {i for i, y in enumerate(ys) if y is not None and not math.isfinite(y)}
    for b in range(buckets):
        start, end = int(b * size), min(n, int((b + 1) * size))
        if start >= end:
            continue
        keep.add(start)
        span = [(ys[i], i) for i in range(start, end) if ys[i] is not None and math.isfinite(ys[i])]
        if span:
            keep.add(min(span)[1])
            keep.add(max(span)[1])
    order = sorted(keep)
    return [xs[i] for i in order], [ys[i] for i in order]


def compact(value: float | None) -> float | None:
    """Six significant digits (what a plot can show), and None for NaN and inf (JSON has no such numbers)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")
