"""Every logged series, thinned, for the report's picker: the reader finds any metric by name and plots it.

Metrics logged by step are plotted by step (a line per rank), samples without a step (nvidia-smi, DCGM) in
time, as epoch milliseconds (plotly reads numbers on a date axis as such; ISO strings would triple the size).
The page embeds at most `MAX_VALUES` values: past that each trace gets fewer points, and past the floor the
remaining metrics are listed by name only, so a run with thousands of metrics still gives a small report.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from forensics.report.figures import known_ranks_only
from forensics.report.scales import compact, thin, value_axis

MAX_VALUES = 150_000
MAX_POINTS_PER_TRACE = 1000
MIN_POINTS_PER_TRACE = 100
MAX_TRACES_PER_METRIC = 16  # ranks or GPUs; the rest are listed as left out


def _traces(part: pl.DataFrame, by_step: bool) -> tuple[list[dict[str, Any]], int]:
    """(name, x, y) per rank (and source, when several logged the metric), and how many were left out."""
    x = "step" if by_step else "ts"
    grouped = (
        part.filter(pl.col(x).is_not_null())
        .group_by("source", "rank", x)
        .agg(pl.col("value").mean())
        .sort("rank", "source", x, nulls_last=True)
    )
    sources = grouped.get_column("source").unique().to_list()
    keys = grouped.select("rank", "source").unique(maintain_order=True).rows()
    out = []
    for rank, source in keys[:MAX_TRACES_PER_METRIC]:
        rows = grouped.filter(
            (pl.col("rank").is_null() if rank is None else pl.col("rank") == rank) & (pl.col("source") == source)
        )
        who = ("GPU" if not by_step else "rank") + (f" {rank}" if rank is not None else "s (all)")
        name = f"{who} · {source}" if len(sources) > 1 else who
        xs = rows.get_column(x)
        xs_out = xs.to_list() if by_step else (xs.dt.epoch("ms")).to_list()
        out.append({"name": name, "x": xs_out, "y": rows.get_column("value").to_list()})
    return out, max(0, len(keys) - MAX_TRACES_PER_METRIC)


def series_catalogue(series: pl.DataFrame) -> dict[str, Any]:
    """{"metrics": [{name, x: step|time, axis, traces: [{name, x, y}], left_out}], "names_only": [...]}."""
    if series.is_empty():
        return {"metrics": [], "names_only": []}
    by_step_names = set(series.filter(pl.col("step").is_not_null()).get_column("metric").unique().to_list())
    raw = []
    for name in sorted(series.get_column("metric").unique().to_list()):
        by_step = name in by_step_names
        traces, left_out = _traces(known_ranks_only(series.filter(pl.col("metric") == name)), by_step)
        if traces:
            raw.append({"name": name, "x": "step" if by_step else "time", "traces": traces, "left_out": left_out})
    cap = MAX_POINTS_PER_TRACE
    while cap > MIN_POINTS_PER_TRACE and sum(min(len(t["x"]), cap) for m in raw for t in m["traces"]) > MAX_VALUES:
        cap //= 2
    kept, names_only, used = [], [], 0
    for m in raw:
        traces = []
        for t in m["traces"]:
            xs, ys = thin(t["x"], t["y"], cap)
            traces.append({"name": t["name"], "x": xs, "y": [compact(v) for v in ys]})
        points = sum(len(t["x"]) for t in traces)
        if used + points > MAX_VALUES:
            names_only.append(m["name"])
            continue
        used += points
        values = [v for t in traces for v in t["y"]]
        kept.append({**m, "traces": traces, "axis": value_axis(values)})
    return {"metrics": kept, "names_only": names_only}
