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
