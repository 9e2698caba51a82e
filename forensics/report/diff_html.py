"""The diff report: two runs side by side, self-contained like the incident report."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import plotly.graph_objects as go
import polars as pl

from forensics import __version__
from forensics.diff import per_step
from forensics.model import Analysis
from forensics.report.figures import FAILURE_COLOUR, metrics_about
from forensics.report.html import figure_json, plotly_js_gz_b64, template_environment
from forensics.report.scales import compact, thin, value_axis

MAX_SERIES_FIGURES = 6
SIDE_STYLE = {"A": {"dash": "dot", "color": "#b42318"}, "B": {"dash": "solid", "color": "#175cd3"}}
_LAYOUT = {"template": {}, "height": 300, "margin": {"l": 56, "r": 16, "t": 44, "b": 70}}


def _failure_step(fig: go.Figure, side: str, analysis: Analysis) -> None:
    root = analysis.verdict.root_cause
    if root is not None and root.step is not None:
        colour = SIDE_STYLE[side]["color"] if side == "B" else FAILURE_COLOUR
        fig.add_vline(x=root.step, line_dash="dash", line_color=colour, line_width=1, annotation_text=f"{side} failed")


def overlay_figure(a: Analysis, b: Analysis, metric: str, title: str) -> go.Figure | None:
    """One metric of both runs by step, A dotted red and B solid blue, on a shared calm or log axis."""
    fig = go.Figure()
    values: list[float | None] = []
    for side, analysis in (("A", a), ("B", b)):
        data = per_step(analysis.series, metric)
        if data.is_empty():
            continue
        xs, ys = thin(data["step"].to_list(), data["value"].to_list())
        values += ys
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[compact(v) for v in ys],
                mode="lines+markers" if len(xs) <= 120 else "lines",
                name=f"{side}: {analysis.run_name}",
                line=SIDE_STYLE[side],
                marker={"size": 4},
            )
        )
        _failure_step(fig, side, analysis)
    if not fig.data:
        return None
    fig.update_layout(
        title={"text": title, "font": {"size": 13}},
        legend={"orientation": "h", "y": -0.14, "yanchor": "top", "x": 0},
        **_LAYOUT,
    )
    fig.update_yaxes(**value_axis(values))
    return fig


def _root_metrics(a: Analysis, b: Analysis) -> list[str]:
    """The metrics either run's root cause is about (plotted first, marked as the verdict's)."""
    out: list[str] = []
    for run in (a, b):
        root = run.verdict.root_cause
        if root is not None:
            logged = sorted(run.series.filter(pl.col("step").is_not_null()).get_column("metric").unique().to_list())
            out += [m for m in metrics_about(root, logged) if m not in out]
    return out


def diff_figures(a: Analysis, b: Analysis, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures of the diff page as (id, metric, verdict, figure) records, the root causes' metrics first."""
    numbers = [n for n in doc["numbers"] if not n["source"].startswith("gpu/")]  # nvidia-smi samples have no step
    roots = _root_metrics(a, b)
    wanted = [(m, m, True) for m in roots]
    wanted += [(n["source"], f"{n['label']} ({n['unit']})", False) for n in numbers]
    wanted += [(s["metric"], s["metric"], False) for s in doc["series"][:MAX_SERIES_FIGURES]]
    figs, seen = [], set()
    for metric, title, verdict in wanted:
        if metric in seen:
            continue
        seen.add(metric)
        fig = overlay_figure(a, b, metric, title)
        if fig is not None:
            figs.append({"id": metric.replace("/", "-"), "metrics": [metric], "verdict": verdict, "figure": fig})
    return figs


def render_diff_html(a: Analysis, b: Analysis, doc: dict[str, Any]) -> str:
    figs = [  # redacted, labels as text
        {**{k: v for k, v in f.items() if k != "figure"}, "section": "diff", "json": figure_json(f["figure"])}
        for f in diff_figures(a, b, doc)
    ]
    return (
        template_environment()
        .get_template("diff.html.j2")
        .render(
            doc=doc,
            figures=figs,
            plotly_js=plotly_js_gz_b64() if figs else "",
            version=__version__,
            generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
