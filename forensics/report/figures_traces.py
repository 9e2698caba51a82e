"""GPU trace figures: where each rank's time went, its NCCL time by collective, and what the straggler costs (the
what-if replay). Pure: dicts in, figures out."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from forensics.model import Analysis

BREAKDOWN = (
    ("compute", "#1f77b4"),
    ("communication", "#ff7f0e"),
    ("memory", "#2ca02c"),
    ("idle", "#c7c7c7"),
)
_LAYOUT = {"template": {}, "height": 340, "margin": {"l": 60, "r": 20, "t": 40, "b": 60}}


def _scale(device: dict[str, Any], basis: str) -> float:
    """Divide totals by the step count when the comparison is per step."""
    return device["steps"] if basis == "per step" and device.get("steps") else 1


def breakdown_figure(traces: dict[str, Any]) -> go.Figure | None:
    devices = traces.get("devices") or []
    if not devices:
        return None
    basis = traces.get("basis", "over the window")
    labels = [d["label"] for d in devices]
    fig = go.Figure()
    for name, colour in BREAKDOWN:
        values = [(d["breakdown_ms"][name] or 0) / _scale(d, basis) for d in devices]
        fig.add_trace(go.Bar(name=name, x=labels, y=values, marker_color=colour))
    straggler = traces.get("straggler")
    if straggler and straggler["label"] in labels:
        fig.add_annotation(x=straggler["label"], y=1.02, yref="paper", text="straggler", showarrow=False)
    unit = "ms per step" if basis == "per step" else "ms over the profiled window"
    title = "GPU time by rank: compute, exposed communication, memory, idle"
    fig.update_layout(title=title, barmode="stack", yaxis_title=unit, **_LAYOUT)
    return fig


def nccl_figure(traces: dict[str, Any]) -> go.Figure | None:
    devices = [d for d in traces.get("devices") or [] if d["nccl"]]
    if not devices:
        return None
    basis = traces.get("basis", "over the window")
    ops = sorted({n["op"] for d in devices for n in d["nccl"]})
    fig = go.Figure()
    for op in ops:
        values = [sum(n["total_ms"] for n in d["nccl"] if n["op"] == op) / _scale(d, basis) for d in devices]
        fig.add_trace(go.Bar(name=op, x=[d["label"] for d in devices], y=values))
    unit = "ms per step" if basis == "per step" else "ms over the profiled window"
    fig.update_layout(
        title="NCCL kernel time by rank and collective", barmode="stack", yaxis_title=unit, showlegend=True, **_LAYOUT
    )
    return fig


WHAT_IF_BARS = (
    ("measured_ms", "measured", "#7f7f7f"),
    ("without_ms", "without rank {rank}'s lateness", "#2ca02c"),
    ("compute_only_ms", "without its extra compute only", "#1f77b4"),
    ("balanced_ms", "every rank like the median", "#9467bd"),
)


def what_if_figure(traces: dict[str, Any]) -> go.Figure | None:
    """Step time as measured and as replayed without the costliest rank's lateness, per step."""
    wi = traces.get("what_if")
    if not wi or not wi.get("steps"):
        return None
    rank = wi["worst"]["rank"]
    labels = [f"step {s['step']}" if s["step"] is not None else "window" for s in wi["steps"]]
    fig = go.Figure()
    for key, name, colour in WHAT_IF_BARS:
        fig.add_trace(
            go.Bar(name=name.format(rank=rank), x=labels, y=[s[key] for s in wi["steps"]], marker_color=colour)
        )
    unit = "ms per step" if wi["basis"] == "per step" else "ms over the profiled window"
    title = f"What it costs: {wi['worst']['faster_pct']:.0f}% faster without rank {rank}'s lateness (replayed)"
    fig.update_layout(title=title, barmode="group", yaxis_title=unit, **_LAYOUT)
    return fig


def figures(a: Analysis) -> list[tuple[str, go.Figure | None]]:
    return [
        ("traces-breakdown", breakdown_figure(a.traces)),
        ("traces-nccl", nccl_figure(a.traces)),
        ("traces-what-if", what_if_figure(a.traces)),
    ]
