"""Every logged series, thinned, for the report's picker: the reader finds any metric by name and plots it.

Metrics logged by step are plotted by step (a line per rank), samples without a step (nvidia-smi, DCGM) in
time, as epoch milliseconds (plotly reads numbers on a date axis as such; ISO strings would triple the size).
The page embeds at most `MAX_VALUES` values: past that each trace gets fewer points, and past the floor the
remaining metrics are listed by name only, so a run with thousands of metrics still gives a small report.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from forensics.report.scales import compact, thin, value_axis
from forensics.series_table import rows_by_metric

MAX_VALUES = 150_000
MAX_POINTS_PER_TRACE = 1000
MIN_POINTS_PER_TRACE = 100
MAX_TRACES_PER_METRIC = 16  # ranks or GPUs; the rest are listed as left out
MAX_METRICS = 2000  # buttons in the picker; more are named in a line


def _points(series: pl.DataFrame) -> pl.DataFrame:
    """(metric, source, rank, x, value, by_step): by step where the metric has steps, else in time.

    Rows with no rank are dropped for a metric that some rank logged (see `figures.known_ranks_only`).
    """
    by_step = series.filter(pl.col("step").is_not_null()).get_column("metric").unique()
    ranked = series.filter(pl.col("rank").is_not_null()).get_column("metric").unique()
    kept = series.filter(pl.col("rank").is_not_null() | ~pl.col("metric").is_in(ranked.implode()))
    stepped = kept.filter(pl.col("step").is_not_null() & pl.col("metric").is_in(by_step.implode())).select(
        "metric", "source", "rank", pl.col("step").alias("x"), "value", pl.lit(True).alias("by_step")
    )
    timed = kept.filter(pl.col("ts").is_not_null() & ~pl.col("metric").is_in(by_step.implode())).select(
        "metric", "source", "rank", pl.col("ts").dt.epoch("ms").alias("x"), "value", pl.lit(False).alias("by_step")
    )
    return pl.concat([stepped, timed])


def _traces(part: pl.DataFrame) -> pl.DataFrame:
    """One metric's rows as one row per (source, rank): the x and y lists in x order, the copies of one x
    averaged (a mean of one value is the value, but for -0.0: + 0.0 drops its sign, as a mean does)."""
    once = part.group_by("source", "rank").agg(
        pl.col("x").sort(),
        (pl.col("value") + 0.0).sort_by("x"),
        pl.col("by_step").first(),
        (pl.col("x").n_unique() == pl.len()).alias("_once"),
    )
    if once["_once"].all():
        grouped = once.drop("_once")
    else:
        grouped = (
            part.group_by("source", "rank", "x")
            .agg(pl.col("value").mean(), pl.col("by_step").first())
            .group_by("source", "rank")
            .agg(pl.col("x").sort(), pl.col("value").sort_by("x"), pl.col("by_step").first())
        )
    return grouped.sort("rank", "source", nulls_last=True)


def _trace_name(rank: int | None, source: str, by_step: bool, several_sources: bool) -> str:
    who = ("rank" if by_step else "GPU") + (f" {rank}" if rank is not None else "s (all)")
    return f"{who} · {source}" if several_sources else who


def _shown_sizes(part: pl.DataFrame) -> list[int]:
    """How many points each trace of one metric has (distinct x), for the traces the picker shows."""
    sizes = part.group_by("source", "rank").agg(pl.col("x").n_unique()).sort("rank", "source", nulls_last=True)
    return sizes.get_column("x").head(MAX_TRACES_PER_METRIC).to_list()


def _metric_entry(name: str, part: pl.DataFrame, cap: int) -> dict[str, Any]:
    """One metric's picker entry: its traces thinned to `cap` points, its axis, and how many were left out."""
    grouped = _traces(part)
    several_sources = grouped.get_column("source").n_unique() > 1
    shown = grouped.head(MAX_TRACES_PER_METRIC)
    traces = []
    for row, (xs, ys) in zip(shown.drop("x", "value").iter_rows(named=True), _point_arrays(shown), strict=True):
        xs, ys = thin(xs, ys, cap)
        trace_name = _trace_name(row["rank"], row["source"], row["by_step"], several_sources)
        traces.append({"name": trace_name, "x": xs, "y": [compact(v) for v in ys]})
    values = [v for t in traces for v in t["y"]]
    return {
        "name": name,
        "x": "step" if grouped.item(0, "by_step") else "time",
        "traces": traces,
        "left_out": max(0, grouped.height - MAX_TRACES_PER_METRIC),
        "axis": value_axis(values),
    }


def _point_arrays(grouped: pl.DataFrame) -> list[tuple[Any, Any]]:
    """Each row's x and y: numpy views into one flat array each, or lists when a value is missing (thinning
    keeps a NaN, never a missing value: they must stay apart)."""
    xs, ys = grouped["x"].explode(), grouped["value"].explode()
    if xs.null_count() or ys.null_count():
        return list(zip(grouped["x"].to_list(), grouped["value"].to_list(), strict=True))
    ends = np.cumsum(grouped["x"].list.len().to_numpy())
    x_all, y_all = xs.to_numpy(), ys.to_numpy()
    return [(x_all[a:b], y_all[a:b]) for a, b in zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True)]


def series_catalogue(series: pl.DataFrame) -> dict[str, Any]:
    """{"metrics": [{name, x: step|time, axis, traces: [{name, x, y}], left_out}], "names_only": [...]}."""
    if series.is_empty():
        return {"metrics": [], "names_only": []}
    points = _points(series)
    metrics = rows_by_metric(points)
    # per metric, as the entries are built below: one group_by over the whole table took ~140 MB more at 3M samples
    sizes = [_shown_sizes(points[rows]) for _, rows in metrics]
    cap = MAX_POINTS_PER_TRACE
    while cap > MIN_POINTS_PER_TRACE and sum(min(n, cap) for shown in sizes for n in shown) > MAX_VALUES:
        cap //= 2
    kept, names_only, used = [], [], 0
    for (name, rows), shown in zip(metrics, sizes, strict=True):
        budget = sum(min(n, cap) for n in shown)
        if used + budget > MAX_VALUES or len(kept) >= MAX_METRICS:
            names_only.append(name)
            continue
        entry = _metric_entry(name, points[rows], cap)
        used += sum(len(t["x"]) for t in entry["traces"])
        kept.append(entry)
    return {"metrics": kept, "names_only": names_only}
