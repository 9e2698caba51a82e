"""A long run's step curves are thinned for the page, never losing a spike or a NaN."""

from __future__ import annotations

import math

from forensics.report.scales import MAX_POINTS, thin


def test_a_long_curve_keeps_its_extremes_and_non_finite_steps():
    steps = list(range(20_000))
    values = [math.sin(s / 300.0) for s in steps]
    values[12_345] = 50.0
    values[777] = math.nan
    values[19_998] = -math.inf
    xs, ys = thin(steps, values)
    assert len(xs) <= MAX_POINTS + 4
    assert {12_345, 777, 19_998} <= set(xs)
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    finite = [y for y in ys if math.isfinite(y)]
    assert (max(finite), min(finite)) == (50.0, min(v for v in values if math.isfinite(v)))


def test_a_short_curve_is_plotted_whole():
    assert thin([0, 1, 2, 3, 4], [1.0] * 5) == ([0, 1, 2, 3, 4], [1.0] * 5)


def test_thinning_keeps_each_bucket_s_first_lowest_highest_and_every_nan_or_inf():
    import math
    import random

    from forensics.report.scales import thin

    def by_hand(xs, ys, cap):  # the definition, one bucket at a time
        n, buckets = len(xs), max(1, cap // 3)
        keep = {0, n - 1} | {i for i, y in enumerate(ys) if y is not None and not math.isfinite(y)}
        for b in range(buckets):
            start, end = int(b * n / buckets), min(n, int((b + 1) * n / buckets))
            span = [(ys[i], i) for i in range(start, end) if ys[i] is not None and math.isfinite(ys[i])]
            keep |= {start, min(span)[1], max(span)[1]} if span else {start}
        return [xs[i] for i in sorted(keep)]

    rng = random.Random(5)
    for n, cap in ((2500, 2000), (20000, 2000), (40, 7), (10, 1)):
        pool = [None, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0]
        ys = [rng.choice(pool) if rng.random() < 0.3 else round(rng.gauss(0, 1), 1) for _ in range(n)]
        xs = list(range(n))
        kept_x, kept_y = thin(xs, ys, cap)
        assert kept_x == by_hand(xs, ys, cap)
        assert all(y is ys[x] for x, y in zip(kept_x, kept_y, strict=True))
