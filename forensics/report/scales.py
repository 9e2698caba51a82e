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

import numpy as np

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
        return _pick(xs, None), _pick(ys, None)
    buckets = max(1, cap // 3)
    size = n / buckets
    bounds = [(int(b * size), min(n, int((b + 1) * size))) for b in range(buckets)]
    starts = np.array([start for start, end in bounds if start < end], dtype=np.int64)
    if isinstance(ys, np.ndarray):  # numbers only: a missing value is a list's None
        missing, values = np.zeros(n, dtype=bool), ys.astype(np.float64, copy=False)
    else:
        missing = np.fromiter((y is None for y in ys), dtype=bool, count=n)
        values = np.fromiter((math.nan if y is None else y for y in ys), dtype=np.float64, count=n)
    shown = np.isfinite(values)
    keep = [np.array([0, n - 1]), starts, np.flatnonzero(~shown & ~missing)]  # the ends, buckets, NaN and inf
    bucket = np.searchsorted(starts, np.arange(n), side="right") - 1
    for fill, reduce, last in ((math.inf, np.minimum, False), (-math.inf, np.maximum, True)):
        # per bucket the lowest (its first index) and the highest (its last) of the finite values
        extreme = reduce.reduceat(np.where(shown, values, fill), starts)
        at = np.flatnonzero(shown & (values == extreme[bucket]))
        if last:
            at = at[::-1]
        _, first = np.unique(bucket[at], return_index=True)
        keep.append(at[first])
    order = np.unique(np.concatenate(keep))
    return _pick(xs, order), _pick(ys, order)


def _pick(values: Sequence[Any], order: np.ndarray | None) -> list[Any]:
    """The values at `order` (all of them for None) as a list of Python objects, from a list or a numpy array."""
    if isinstance(values, np.ndarray):
        return (values if order is None else values[order]).tolist()
    return list(values) if order is None else [values[i] for i in order.tolist()]


def compact(value: float | None) -> float | None:
    """Six significant digits (what a plot can show), and None for NaN and inf (JSON has no such numbers)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")
