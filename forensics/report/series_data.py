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

MAX_VALUES = 150_000
MAX_POINTS_PER_TRACE = 1000
MIN_POINTS_PER_TRACE = 100
MAX_TRACES_PER_METRIC = 16  # ranks or GPUs; the rest are listed as left out
MAX_METRICS = 2000  # buttons in the picker; more are named in a line


def _grouped(series: pl.DataFrame) -> pl.DataFrame:
    """One row per (metric, source, rank): the x and y lists, by step where the metric has steps, else in time.

    Rows with no rank are dropped for a metric that some rank logged (see `figures.known_ranks_only`). A few
    passes over the table, however many metrics it holds.
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
    points = pl.concat([stepped, timed])
    # one trace per (metric, source, rank), its points in x order; the copies of one x averaged. Where every x
    # of a trace is its only one (each step logged once, as one_sample_per_step leaves them), the averaging
    # group_by is left out: over 3M samples its hash table of four keys took ~600 MB. A mean of one value is the
    # value, but for -0.0 (a sum from 0.0 drops its sign): + 0.0 does the same.
    once = points.group_by("metric", "source", "rank").agg(
        pl.col("x").sort(),
        (pl.col("value") + 0.0).sort_by("x"),
        pl.col("by_step").first(),
        (pl.col("x").n_unique() == pl.len()).alias("_once"),
    )
    if once["_once"].all():
        grouped = once.drop("_once")
    else:
        del once
        grouped = (
            points.group_by("metric", "source", "rank", "x")
            .agg(pl.col("value").mean(), pl.col("by_step").first())
            .group_by("metric", "source", "rank")
            .agg(pl.col("x").sort(), pl.col("value").sort_by("x"), pl.col("by_step").first())
        )
    return grouped.sort("metric", "rank", "source", nulls_last=True)


def _trace_name(rank: int | None, source: str, by_step: bool, several_sources: bool) -> str:
    who = ("rank" if by_step else "GPU") + (f" {rank}" if rank is not None else "s (all)")
    return f"{who} · {source}" if several_sources else who


def _raw_metrics(series: pl.DataFrame) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    grouped = _grouped(series)
    sources = dict(grouped.group_by("metric").agg(pl.col("source").n_unique()).iter_rows())
    points = _points(grouped)
    grouped = grouped.drop("x", "value")
    for row, (xs, ys) in zip(grouped.iter_rows(named=True), points, strict=True):
        row["x"], row["value"] = xs, ys
        m = out.setdefault(
            row["metric"],
            {"name": row["metric"], "x": "step" if row["by_step"] else "time", "traces": [], "left_out": 0},
        )
        if len(m["traces"]) >= MAX_TRACES_PER_METRIC:
            m["left_out"] += 1
            continue
        name = _trace_name(row["rank"], row["source"], row["by_step"], sources[row["metric"]] > 1)
        m["traces"].append({"name": name, "x": row["x"], "y": row["value"]})
    return list(out.values())


def _points(grouped: pl.DataFrame) -> list[tuple[Any, Any]]:
    """Each row's x and y: numpy views into one flat array each (3M samples as Python objects took ~250 MB),
    or lists when a value is missing (thinning keeps a NaN, never a missing value: they must stay apart)."""
    values = grouped["value"].explode()
    if values.null_count() or grouped["x"].explode().null_count():
        return list(zip(grouped["x"].to_list(), grouped["value"].to_list(), strict=True))
    ends = np.cumsum(grouped["x"].list.len().to_numpy())
    xs, ys = grouped["x"].explode().to_numpy(), values.to_numpy()
    return [(xs[a:b], ys[a:b]) for a, b in zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True)]


def series_catalogue(series: pl.DataFrame) -> dict[str, Any]:
    """{"metrics": [{name, x: step|time, axis, traces: [{name, x, y}], left_out}], "names_only": [...]}."""
    if series.is_empty():
        return {"metrics": [], "names_only": []}
    raw = _raw_metrics(series)
    cap = MAX_POINTS_PER_TRACE
    while cap > MIN_POINTS_PER_TRACE and sum(min(len(t["x"]), cap) for m in raw for t in m["traces"]) > MAX_VALUES:
        cap //= 2
    kept, names_only, used = [], [], 0
    for m in raw:
        points = sum(min(len(t["x"]), cap) for t in m["traces"])
        if used + points > MAX_VALUES or len(kept) >= MAX_METRICS:
            names_only.append(m["name"])
            continue
        traces = []
        for t in m["traces"]:
            xs, ys = thin(t["x"], t["y"], cap)
            traces.append({"name": t["name"], "x": xs, "y": [compact(v) for v in ys]})
        used += sum(len(t["x"]) for t in traces)
        values = [v for t in traces for v in t["y"]]
        kept.append({**m, "traces": traces, "axis": value_axis(values)})
    return {"metrics": kept, "names_only": names_only}
