"""The diff report: two runs side by side, self-contained like the incident report."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import plotly.graph_objects as go

from forensics import __version__
from forensics.diff import per_step
from forensics.model import Analysis
from forensics.report.html import figure_json, plotly_js_gz_b64, template_environment

MAX_SERIES_FIGURES = 6
SIDE_STYLE = {"A": {"dash": "dot", "color": "#b42318"}, "B": {"dash": "solid", "color": "#175cd3"}}
_LAYOUT = {"template": {}, "height": 300, "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}


def overlay_figure(a: Analysis, b: Analysis, metric: str, title: str) -> go.Figure | None:
    """One metric of both runs by step, A dotted red and B solid blue."""
    fig = go.Figure()
    for side, analysis in (("A", a), ("B", b)):
        data = per_step(analysis.series, metric)
        if data.is_empty():
            continue
        fig.add_trace(
            go.Scatter(
                x=data["step"].to_list(),
                y=data["value"].to_list(),
                mode="lines+markers",
                name=f"{side}: {analysis.run_name}",
                line=SIDE_STYLE[side],
                marker={"size": 4},
            )
        )
    if not fig.data:
        return None
    fig.update_layout(title=title, xaxis_title="step", **_LAYOUT)
    return fig


def diff_figures(a: Analysis, b: Analysis, doc: dict[str, Any]) -> list[tuple[str, go.Figure]]:
    numbers = [n for n in doc["numbers"] if not n["source"].startswith("gpu/")]  # nvidia-smi samples have no step
    wanted = [(n["source"], f"{n['label']} ({n['unit']})") for n in numbers]
    wanted += [(s["metric"], s["metric"]) for s in doc["series"][:MAX_SERIES_FIGURES]]
    figs = []
    for metric, title in wanted:
        fig = overlay_figure(a, b, metric, title)
        if fig is not None:
            figs.append((metric.replace("/", "-"), fig))
    return figs


def render_diff_html(a: Analysis, b: Analysis, doc: dict[str, Any]) -> str:
    figs = [{"id": n, "json": figure_json(f)} for n, f in diff_figures(a, b, doc)]  # redacted, labels as text
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
