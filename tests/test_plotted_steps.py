"""A long run's step curves are thinned for the page, never losing a spike or a NaN."""

from __future__ import annotations

import numpy as np

from forensics.report.figures import MAX_PLOTTED_STEPS, plotted_steps


def test_a_long_curve_keeps_its_extremes_and_non_finite_steps():
    steps = np.arange(20_000)
    values = np.sin(steps / 300.0)
    values[12_345] = 50.0
    values[777] = np.nan
    values[19_999] = -np.inf
    kept = plotted_steps(steps, values)
    assert len(kept) <= MAX_PLOTTED_STEPS + 2
    assert {12_345, 777, 19_999} <= set(kept.tolist())
    assert np.all(np.diff(kept) > 0)
    finite = values[kept][np.isfinite(values[kept])]
    assert (finite.max(), finite.min()) == (50.0, values[np.isfinite(values)].min())


def test_a_short_curve_is_plotted_whole():
    assert plotted_steps(np.arange(5), np.ones(5)).tolist() == [0, 1, 2, 3, 4]
