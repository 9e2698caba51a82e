"""The batch report `index.html`: the fleet at a glance, recurring failures, hosts that keep failing.

Self-contained like the incident report (same template environment, plotly inlined gzip-compressed).
Figures are pure functions of the fleet table; links point at each run's own report under `runs/`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import plotly.graph_objects as go
import polars as pl

from forensics import __version__
from forensics.report.colours import class_colour
from forensics.report.html import figure_json, plotly_js_gz_b64, template_environment
from forensics.report.labels import class_label

MAX_HEATMAP_HOSTS = 40
MAX_HEATMAP_RUNS = 200
MAX_GROUP_LINKS = 12
# z = 0 took part, 1 a failure on the host, 2 the root cause on the host
HEATMAP_COLOURS = [
    [0, "#e4e7ec"],
    [0.33, "#e4e7ec"],
    [0.34, "#f79009"],
    [0.66, "#f79009"],
    [0.67, "#d92d20"],
    [1, "#d92d20"],
]
STATUS_ORDER = {"error": 0, "failed": 1, "inconclusive": 2, "degraded": 3, "healthy": 4}
_LAYOUT = {"template": {}, "margin": {"l": 60, "r": 20, "t": 40, "b": 60}}


def _when() -> pl.Expr:
    """A run's time: its first log timestamp, else when its newest file was written."""
    return pl.coalesce("started", "modified").alias("when")


def _outcome() -> pl.Expr:
    """The root-cause class of a failed run, or its status when it has none."""
    return pl.when(pl.col("class").is_not_null()).then(pl.col("class")).otherwise(pl.col("status")).alias("outcome")


def _bucket(span: timedelta) -> str:
    if span > timedelta(days=3):
        return "1d"
    if span > timedelta(hours=6):
        return "1h"
    return "10m"


def classes_over_time(fleet: pl.DataFrame) -> go.Figure | None:
    """Stacked counts of root-cause classes per day (or hour): is a failure becoming common?"""
    timed = fleet.select(_when(), _outcome()).drop_nulls("when")
    if timed.is_empty():
        return None
    span = timed.get_column("when").max() - timed.get_column("when").min()
    counts = (
        timed.with_columns(pl.col("when").dt.truncate(_bucket(span)))
        .group_by("when", "outcome")
        .len()
        .sort("when", "outcome")
    )
    fig = go.Figure()
    for outcome in sorted(set(counts.get_column("outcome").to_list()), key=lambda c: (c == "healthy", c)):
        part = counts.filter(pl.col("outcome") == outcome)
        fig.add_trace(
            go.Bar(
                x=part["when"].to_list(),
                y=part["len"].to_list(),
                name=class_label(outcome),
                marker_color=class_colour(outcome),
            )
        )
    fig.update_layout(
        title="Runs by root-cause class over time",
        barmode="stack",
        height=340,
        legend={"orientation": "h", "y": -0.25, "x": 0},
        **_LAYOUT,
    )
    return fig


def host_heatmap(fleet: pl.DataFrame) -> go.Figure | None:
    """Hosts × runs: red where the root cause was on the host, orange for another failure there.

    A host that is red across many runs points at its hardware, not at the jobs.
    """
    per_host = (
        fleet.select("run", _when(), "hosts", "failed_hosts", "host")
        .explode("hosts")
        .drop_nulls("hosts")
        .with_columns(
            pl.when(pl.col("hosts") == pl.col("host"))
            .then(2)
            .when(pl.col("failed_hosts").list.contains(pl.col("hosts")))
            .then(1)
            .otherwise(0)
            .alias("z")
        )
    )
    if per_host.is_empty():
        return None
    ranking = (
        per_host.group_by("hosts")
        .agg((pl.col("z") == 2).sum().alias("root"), (pl.col("z") >= 1).sum().alias("failed"), pl.len().alias("runs"))
        .sort(["root", "failed", "runs", "hosts"], descending=[True, True, True, False])
        .head(MAX_HEATMAP_HOSTS)
    )
    hosts = ranking.get_column("hosts").to_list()
    shown = per_host.filter(pl.col("hosts").is_in(hosts))
    runs = (
        shown.group_by("run")
        .agg(pl.col("when").first(), pl.col("z").max())
        .sort(["z", "when", "run"], descending=[True, True, False], nulls_last=True)
        .head(MAX_HEATMAP_RUNS)
        .sort("when", "run", nulls_last=True)
        .get_column("run")
        .to_list()
    )
    cells = {(r["hosts"], r["run"]): r["z"] for r in shown.iter_rows(named=True)}
    z = [[cells.get((h, r)) for r in runs] for h in hosts]
    words = {None: "not in this run", 0: "took part, no failure", 1: "a failure here", 2: "root cause here"}
    text = [[f"{h} · {r}: {words[cells.get((h, r))]}" for r in runs] for h in hosts]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=runs,
            y=[f"{h} ({n} root)" for h, n in zip(hosts, ranking.get_column("root").to_list(), strict=True)],
            text=text,
            hoverinfo="text",
            zmin=0,
            zmax=2,
            colorscale=HEATMAP_COLOURS,
            showscale=False,
            xgap=1,
            ygap=1,
        )
    )
    height = max(240, 60 + 22 * len(hosts))
    fig.update_layout(title="Hosts × runs (red: root cause on the host)", height=height, **_LAYOUT)
    fig.update_xaxes(showticklabels=len(runs) <= 40)
    return fig


def recurring_failures(fleet: pl.DataFrame, new: set[str]) -> list[dict[str, Any]]:
    """Failures grouped by fingerprint, most frequent first, with links to the runs of each group."""
    failing = fleet.filter(pl.col("fingerprint").is_not_null()).with_columns(_when(), _outcome())
    if failing.is_empty():
        return []
    groups = (
        failing.sort("when", "run", nulls_last=True)
        .group_by("fingerprint")
        .agg(
            pl.len().alias("count"),
            pl.col("outcome").first(),
            pl.col("rule").first(),
            pl.col("signature").first(),
            pl.col("when").min().alias("first_seen"),
            pl.col("when").max().alias("last_seen"),
            pl.col("host").drop_nulls().n_unique().alias("hosts"),
            pl.struct("run", "report_html").alias("runs"),
        )
        .sort(["count", "last_seen", "fingerprint"], descending=[True, True, False], nulls_last=True)
    )
    out = []
    for g in groups.iter_rows(named=True):
        g["new"] = g["fingerprint"] in new
        g["more"] = max(0, len(g["runs"]) - MAX_GROUP_LINKS)
        g["runs"] = g["runs"][-MAX_GROUP_LINKS:]
        out.append(g)
    return out


def _counts(fleet: pl.DataFrame) -> dict[str, Any]:
    """Runs per status (the usual three always, the others when they occur) and per root-cause class."""
    by_status = dict(fleet.group_by("status").len().iter_rows())
    by_class = fleet.filter(pl.col("class").is_not_null()).group_by("class").len().sort("len", descending=True)
    shown = {s: by_status.get(s, 0) for s in STATUS_ORDER if by_status.get(s) or s in ("failed", "degraded", "healthy")}
    shown |= {s: n for s, n in by_status.items() if s not in shown}
    return {"status": shown, "classes": list(by_class.iter_rows())}


def _runs_table(fleet: pl.DataFrame) -> list[dict[str, Any]]:
    return (
        fleet.with_columns(_when(), pl.col("status").replace_strict(STATUS_ORDER, default=9).alias("_order"))
        .sort(["_order", "when", "run"], descending=[False, True, False], nulls_last=True)
        .drop("_order")
        .to_dicts()
    )


def batch_figures(fleet: pl.DataFrame) -> list[tuple[str, go.Figure]]:
    candidates = [("classes-over-time", classes_over_time(fleet)), ("hosts", host_heatmap(fleet))]
    return [(name, fig) for name, fig in candidates if fig is not None]


def render_batch_html(fleet: pl.DataFrame, new: set[str] | None = None, title: str = "batch") -> str:
    figs = [  # redacted, labels as text
        {"id": n, "section": n, "metrics": [], "verdict": False, "json": figure_json(f)}
        for n, f in batch_figures(fleet)
    ]
    return (
        template_environment()
        .get_template("batch.html.j2")
        .render(
            title=title,
            counts=_counts(fleet),
            total=fleet.height,
            groups=recurring_failures(fleet, new or set()),
            runs=_runs_table(fleet),
            has_hosts=any(f["id"] == "hosts" for f in figs),
            status_order=STATUS_ORDER,
            figures=figs,
            plotly_js=plotly_js_gz_b64() if figs else "",
            version=__version__,
            generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
