"""Frames to plotly figures. Pure: no file access, no rendering."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from forensics.metric_semantics import panel
from forensics.model import Analysis, Finding
from forensics.report import figures_traces

TRAINING_METRICS = panel("training")  # what each metric is, and where it is drawn: patterns/metrics/
THROUGHPUT_METRICS = panel("throughput")
MEMORY_METRICS = panel("memory")
CLASS_COLOURS = {
    "cuda_oom": "#d62728",
    "host_oom": "#e377c2",
    "nccl_timeout": "#ff7f0e",
    "nccl_error": "#bcbd22",
    "process_killed": "#8c564b",
    "cuda_error": "#9467bd",
    "training_instability": "#17becf",
}
_LAYOUT = {"template": {}, "height": 320, "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}
MAX_PLOTTED_STEPS = 2000  # points of one step curve in the page (wider than the plot is)


def plotted_steps(steps: np.ndarray, values: np.ndarray, points: int = MAX_PLOTTED_STEPS) -> np.ndarray:
    """Indexes of the steps to plot: all of them up to `points`, else the lowest and the highest value of
    each of points/2 runs of steps (a spike stays in view; a curve of 20,000 steps is not 20,000 points
    in the page), and every non-finite one."""
    if len(steps) <= points:
        return np.arange(len(steps))
    finite = np.isfinite(values)
    kept = [np.flatnonzero(~finite)]
    for run in np.array_split(np.arange(len(steps)), points // 2):
        ok = run[finite[run]]
        if len(ok):
            kept.append(ok[[np.argmin(values[ok]), np.argmax(values[ok])]])
    return np.unique(np.concatenate(kept))


def _by_step(series: pl.DataFrame, metrics: tuple[str, ...]) -> pl.DataFrame:
    return (
        series.filter(pl.col("metric").is_in(metrics) & pl.col("step").is_not_null())
        .group_by("metric", "step")
        .agg(pl.col("value").mean())
        .sort("metric", "step")
    )


def _step_figure(
    series: pl.DataFrame, metrics: tuple[str, ...], title: str, marker_step: int | None, columns: int = 2
) -> go.Figure | None:
    """Small multiples: one panel per metric that was logged, each with its own y axis."""
    data = _by_step(series, metrics)
    if data.is_empty():
        return None
    present = set(data.get_column("metric").to_list())
    shown = [m for m in metrics if m in present][:8]
    rows = (len(shown) + columns - 1) // columns
    fig = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=shown,
        horizontal_spacing=0.08,
        vertical_spacing=min(0.12, 0.5 / max(rows, 1)),
    )
    for i, metric in enumerate(shown):
        part = data.filter(pl.col("metric") == metric)
        steps, values = part["step"].to_numpy(), part["value"].to_numpy()
        shown_at = plotted_steps(steps, values)
        row, col = divmod(i, columns)
        fig.add_trace(
            go.Scatter(
                x=steps[shown_at].tolist(),
                y=values[shown_at].tolist(),
                mode="lines+markers",
                name=metric,
                marker={"size": 4},
                showlegend=False,
            ),
            row=row + 1,
            col=col + 1,
        )
        if marker_step is not None:
            fig.add_vline(x=marker_step, line_dash="dash", line_color="#d62728", row=row + 1, col=col + 1)
    fig.update_layout(
        title=title + (f" (dashed: failure at step {marker_step})" if marker_step is not None else ""),
        **{**_LAYOUT, "height": 60 + 230 * rows},
    )
    return fig


def shade_findings(fig: go.Figure | None, findings: list[Finding], metrics: tuple[str, ...]) -> go.Figure | None:
    """Shade, in the panel of its metric, the steps a detector finding covers (`fields.steps` or `fields.spans`)."""
    if fig is None:
        return None
    panels = {t.name: (t.xaxis or "x", t.yaxis or "y") for t in fig.data}
    for f in findings:
        metric = f.fields.get("metric")
        if metric not in metrics or metric not in panels or not f.fields.get("steps"):
            continue
        xref, yref = panels[metric]
        colour = "#d62728" if f.severity in ("error", "critical") else "#ff7f0e"
        for first, last in f.fields.get("spans") or [f.fields["steps"]]:
            fig.add_shape(
                type="rect",
                xref=xref,
                yref=f"{yref} domain",
                x0=first - 0.5,
                x1=last + 0.5,
                y0=0,
                y1=1,
                fillcolor=colour,
                opacity=0.15,
                line_width=0,
                layer="below",
            )
        fig.add_annotation(
            xref=xref,
            yref=f"{yref} domain",
            x=f.fields["steps"][0],
            y=1,
            text=f.rule,
            showarrow=False,
            font={"size": 10, "color": colour},
            xanchor="left",
            yanchor="top",
        )
    return fig


def gpu_memory_figure(series: pl.DataFrame) -> go.Figure | None:
    used = series.filter((pl.col("source") == "nvidia_smi") & (pl.col("metric") == "gpu/memory_used_mib"))
    if used.is_empty():
        return None
    total = series.filter((pl.col("source") == "nvidia_smi") & (pl.col("metric") == "gpu/memory_total_mib"))
    fig = go.Figure()
    for gpu in sorted(used.get_column("rank").drop_nulls().unique().to_list()):
        part = used.filter(pl.col("rank") == gpu).sort("ts")
        fig.add_trace(
            go.Scatter(x=part["ts"].to_list(), y=(part["value"] / 1024).to_list(), mode="lines", name=f"GPU {gpu} used")
        )
    if not total.is_empty():
        fig.add_hline(y=float(total["value"].max()) / 1024, line_dash="dot", annotation_text="capacity")
    fig.update_layout(title="GPU memory (nvidia-smi)", yaxis_title="GiB", **_LAYOUT)
    return fig


def gpu_util_figure(series: pl.DataFrame) -> go.Figure | None:
    util = series.filter((pl.col("source") == "nvidia_smi") & (pl.col("metric") == "gpu/util_pct"))
    if util.is_empty():
        return None
    fig = go.Figure()
    for gpu in sorted(util.get_column("rank").drop_nulls().unique().to_list()):
        part = util.filter(pl.col("rank") == gpu).sort("ts")
        fig.add_trace(go.Scatter(x=part["ts"].to_list(), y=part["value"].to_list(), mode="lines", name=f"GPU {gpu}"))
    fig.update_layout(title="GPU utilisation (nvidia-smi)", yaxis_title="%", **_LAYOUT)
    return fig


def _symbol(is_root: bool, inferred: bool) -> str:
    """Stars for the root cause; open markers where the time was inferred from a neighbouring line."""
    return ("star" if is_root else "circle") + ("-open" if inferred else "")


def _hover(f: Finding) -> str:
    where = f"<br>{f.evidence[0].file}:{f.evidence[0].line}" if f.evidence else ""  # a detector may cite no line
    return f"{f.rule} ×{f.count}{where}"


def timeline_figure(a: Analysis) -> go.Figure | None:
    """Findings across ranks in time: the first domino stands out on the left."""
    points = [f for f in a.findings if f.ts is not None]
    if not points:
        return None
    fig = go.Figure()
    root = a.verdict.root_cause
    for cls in sorted({f.cls for f in points}):
        group = [f for f in points if f.cls == cls]
        fig.add_trace(
            go.Scatter(
                x=[f.ts for f in group],
                y=[f"rank {f.rank}" if f.rank is not None else "run" for f in group],
                mode="markers",
                name=cls,
                marker={
                    "size": [18 if f is root else 11 for f in group],
                    "color": CLASS_COLOURS.get(cls),
                    "symbol": [_symbol(f is root, f.ts_inferred) for f in group],
                },
                text=[_hover(f) for f in group],
                hovertemplate="%{x}<br>%{y}<br>%{text}<extra>" + cls + "</extra>",
            )
        )
    fig.update_layout(title="Timeline of findings by rank (★ root cause)", **{**_LAYOUT, "height": 280})
    return fig


def figures(a: Analysis) -> list[tuple[str, go.Figure]]:
    """Every figure the incident report shows, with an anchor name, in display order."""
    step = a.verdict.root_cause.step if a.verdict.root_cause else None
    candidates = [
        ("timeline", timeline_figure(a)),
        ("training", _step_figure(a.series, TRAINING_METRICS, "Training metrics by step", step)),
        ("throughput", _step_figure(a.series, THROUGHPUT_METRICS, "Throughput and step time", step)),
        ("memory", _step_figure(a.series, MEMORY_METRICS, "Peak GPU memory by step (GiB, max over ranks)", step)),
        ("gpu-memory", gpu_memory_figure(a.series)),
        ("gpu-util", gpu_util_figure(a.series)),
        *figures_traces.figures(a),
    ]
    shaded = {"training": TRAINING_METRICS, "throughput": THROUGHPUT_METRICS, "memory": MEMORY_METRICS}
    candidates = [(name, shade_findings(fig, a.findings, shaded.get(name, ()))) for name, fig in candidates]
    return [(name, fig) for name, fig in candidates if fig is not None]
