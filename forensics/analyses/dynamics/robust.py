"""Robust statistics for short, noisy training curves.

Training curves are short (tens to thousands of points), heavy-tailed (one bad batch) and trending
(a loss that falls), so mean and standard deviation mislead. These helpers use medians, the median
absolute deviation (MAD, scaled by 1.4826 to match a normal sigma), first differences (which ignore
slow trends) and a least-squares single change point on a spike-cleaned copy of the curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826
MAX_PAIRWISE_POINTS = 1000


def mad_scale(x: np.ndarray) -> float:
    """Robust spread: 1.4826 x median(|x - median(x)|); 0 for fewer than two points."""
    if len(x) < 2:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def noise_scale(x: np.ndarray) -> float:
    """Point-to-point noise, blind to slow trends: the MAD of first differences over sqrt(2)."""
    if len(x) < 3:
        return 0.0
    return mad_scale(np.diff(x)) / np.sqrt(2.0)


def rolling_median(x: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median; the window shrinks at the ends."""
    n = len(x)
    half = window // 2
    if n <= window:
        return np.array([np.median(x[max(0, i - half) : min(n, i + half + 1)]) for i in range(n)])
    out = np.empty(n)
    out[half : n - half] = np.median(np.lib.stride_tricks.sliding_window_view(x, 2 * half + 1), axis=1)
    for i in [*range(half), *range(n - half, n)]:
        out[i] = np.median(x[max(0, i - half) : min(n, i + half + 1)])
    return out


def trailing_median(x: np.ndarray, window: int) -> np.ndarray:
    """Median of each point and the window - 1 points before it (fewer at the start): no look-ahead."""
    n = len(x)
    out = np.empty(n)
    head = min(n, window - 1)
    for i in range(head):
        out[i] = np.median(x[: i + 1])
    if n >= window:
        out[window - 1 :] = np.median(np.lib.stride_tricks.sliding_window_view(x, window), axis=1)
    return out


def rolling_noise(x: np.ndarray, window: int) -> np.ndarray:
    """`noise_scale` of every window of `window` points."""
    d = np.diff(x)
    if len(d) < window - 1 or window < 3:
        return np.array([noise_scale(x)])
    views = np.lib.stride_tricks.sliding_window_view(d, window - 1)
    centre = np.median(views, axis=1, keepdims=True)
    return MAD_TO_SIGMA * np.median(np.abs(views - centre), axis=1) / np.sqrt(2.0)


def hampel(x: np.ndarray, window: int = 7, k: float = 4.0) -> np.ndarray:
    """A copy where isolated outliers (beyond k robust sigmas of the local median) take that median.

    Used before change-point search so that one spike does not pass for a level shift.
    """
    if len(x) < 3:
        return x.copy()
    med = rolling_median(x, window)
    resid = np.abs(x - med)
    scale = MAD_TO_SIGMA * rolling_median(resid, window)
    floor = max(noise_scale(x), 1e-12)
    out = x.copy()
    bad = resid > k * np.maximum(scale, floor)
    out[bad] = med[bad]
    return out


@dataclass(frozen=True)
class ChangePoint:
    """The best single split of a curve into two levels, with what it takes to judge it."""

    index: int  # first index of the second segment
    before: float  # median of the first segment
    after: float  # median of the second segment
    noise: float  # pooled point-to-point noise of the two segments
    spread: float  # pooled robust spread (MAD) within the two segments
    separation: float  # share of points on their own segment's side of the midpoint between the medians
    local_jump: float  # median of the 3 points after the split minus median of the 3 before

    @property
    def shift(self) -> float:
        return self.after - self.before

    @property
    def relative_shift(self) -> float:
        return self.shift / abs(self.before) if self.before else float("inf")

    @property
    def strength(self) -> float:
        """The shift in units of point-to-point noise (large: a real level change, not jitter)."""
        return abs(self.shift) / self.noise if self.noise > 0 else float("inf")

    def is_step(self, min_separation: float = 0.8, min_sudden: float = 0.5, noise_k: float = 5.0) -> bool:
        """A sudden, lasting level change, not a slow trend or jitter.

        The segments barely overlap (`separation`), and the jump across the split carries a good part of
        the shift or stands far above the point-to-point noise (a trend plus a jump splits the shift).
        """
        jump = abs(self.local_jump)
        sudden = jump >= min_sudden * abs(self.shift) or (self.noise > 0 and jump >= noise_k * self.noise)
        return self.separation >= min_separation and sudden


def change_point(x: np.ndarray, min_size: int = 3) -> ChangePoint | None:
    """The split minimising the squared deviation from two segment means, on a spike-cleaned copy."""
    n = len(x)
    if n < 2 * min_size:
        return None
    clean = hampel(x)
    csum = np.cumsum(clean)
    csum2 = np.cumsum(clean**2)
    best, best_cost = None, np.inf
    for i in range(min_size, n - min_size + 1):
        left = csum2[i - 1] - csum[i - 1] ** 2 / i
        right = (csum2[-1] - csum2[i - 1]) - (csum[-1] - csum[i - 1]) ** 2 / (n - i)
        if left + right < best_cost:
            best, best_cost = i, left + right
    if best is None:
        return None
    first, second = x[:best], x[best:]
    before, after = float(np.median(first)), float(np.median(second))
    middle = (before + after) / 2
    up = after >= before
    on_side = np.r_[first <= middle, second >= middle] if up else np.r_[first >= middle, second <= middle]
    return ChangePoint(
        index=best,
        before=before,
        after=after,
        noise=float(np.sqrt((noise_scale(first) ** 2 + noise_scale(second) ** 2) / 2)),
        spread=float(np.sqrt((mad_scale(first) ** 2 + mad_scale(second) ** 2) / 2)),
        separation=float(np.mean(on_side)),
        local_jump=float(np.median(second[:3]) - np.median(first[-3:])),
    )


def _thinned(*arrays: np.ndarray, limit: int = MAX_PAIRWISE_POINTS) -> tuple[np.ndarray, ...]:
    """An even subsample of at most `limit` points: pairwise statistics grow as n squared."""
    n = len(arrays[0])
    if n <= limit:
        return arrays
    pick = np.linspace(0, n - 1, limit).astype(int)
    return tuple(a[pick] for a in arrays)


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """Median of pairwise slopes: a trend that a few outliers cannot bend."""
    x, y = _thinned(x, y)
    if len(x) < 2:
        return 0.0
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    return float(np.median((y[j] - y[i])[keep] / dx[keep])) if keep.any() else 0.0


def kendall_tau(y: np.ndarray) -> float:
    """Rank agreement of y with its order: +1 always rising, -1 always falling, ~0 no trend."""
    (y,) = _thinned(y)
    n = len(y)
    if n < 2:
        return 0.0
    i, j = np.triu_indices(n, k=1)
    signs = np.sign(y[j] - y[i])
    return float(signs.sum() / len(signs))
