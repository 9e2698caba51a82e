"""Frames to plotly figures for the incident report. Pure: no file access, no rendering.

One figure per metric, so that the page can lay them out as small multiples at any width. The plots a
reader needs first are the ones the verdict is about: every metric a finding names (its `metric` field, the
metrics it lists, or the ones its class is read from: memory for an OOM, step time for a hang), with the
steps it covers shaded and the failure marked. Every step plot shares one step axis and every wall-clock
plot (the findings timeline, nvidia-smi and DCGM samples) one time axis, so that a reader can look down
the page at one moment. Ranks are always in numeric order and classes keep their colour (see `colours`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
import polars as pl

from forensics.metric_semantics import panel
from forensics.model import Analysis, Finding
from forensics.report import figures_traces
from forensics.report.colours import class_colour
from forensics.report.labels import class_label
from forensics.report.scales import compact, thin, value_axis

TRAINING_METRICS = panel("training")  # what each metric is, and where it is drawn: patterns/metrics/
THROUGHPUT_METRICS = panel("throughput")
MEMORY_METRICS = panel("memory")
MEMORY_WORDS = re.compile(r"memory|_mem_|mem_used|rss", re.I)
# What a finding of each class is read from, when it names no metric itself (a name or the end of a name).
CLASS_METRICS = {
    "cuda_oom": ("max_memory_allocated_gb", "max_memory_reserved_gb", "gpu/memory_used_mib"),
    "kv_cache_insufficient": ("gpu/memory_used_mib",),
    "host_oom": ("cpu_memory_used_gb", "host/memory_used_gb"),
    "process_killed": ("cpu_memory_used_gb", "gpu/memory_used_mib"),
    "straggler": ("perf/throughput", "timing_s/step", "gpu/util_pct"),
    "hang": ("timing_s/step", "perf/throughput", "gpu/util_pct"),
    "nccl_timeout": ("timing_s/step", "gpu/util_pct"),
    "nccl_error": ("timing_s/step", "gpu/util_pct"),
    "collective_mismatch": ("timing_s/step",),
    "ray_node_died": ("cpu_memory_used_gb", "timing_s/step"),
    "ray_actor_died": ("cpu_memory_used_gb", "timing_s/step"),
    "cuda_error": ("gpu/util_pct", "gpu/temperature_c", "gpu/power_w"),
    "gpu_hardware": ("gpu/util_pct", "gpu/temperature_c", "gpu/power_w"),
    "training_instability": ("actor/pg_loss", "actor/grad_norm", "actor/lr"),
}
CLOCK_METRICS = {  # wall-clock samples: title, unit, scale
    "gpu/memory_used_mib": ("GPU memory used", "GiB", 1 / 1024),
    "gpu/util_pct": ("GPU utilisation", "%", 1.0),
    "gpu/power_w": ("GPU power", "W", 1.0),
    "gpu/temperature_c": ("GPU temperature", "°C", 1.0),
}
MAX_METRICS_PER_FINDING = 4
MAX_TIMELINE_HEIGHT = 900  # 512 ranks share it: the first domino still stands out, the labels thin out
MAX_RANK_TRACES = 8  # more ranks than this: their min, median and max, plus the ranks a finding names
FAILURE_COLOUR = "#d62728"
# UTC times on one tick line (a second, plotly's date line, would hit the legend); the date is in the header
CLOCK_TICKS, DAYS_TICKS = "%H:%M:%S", "%m-%d %H:%M"
_LAYOUT: dict[str, Any] = {"template": {}, "height": 260, "margin": {"l": 56, "r": 16, "t": 44, "b": 32}}
_LEGEND_BELOW = {"orientation": "h", "y": -0.14, "yanchor": "top", "x": 0, "font": {"size": 11}, "traceorder": "normal"}


@dataclass
class Plot:
    """A figure and what the page needs to know about it."""

    id: str  # the anchor: `plot-<id>`
    section: str  # verdict | timeline | memory | training | throughput | gpu | traces
    figure: go.Figure
    metrics: tuple[str, ...] = ()
    verdict: bool = False  # plots a metric the root cause is about


@dataclass(frozen=True)
class _Frame:
    """What every figure of one page shares: the failure, the common axes, the findings."""

    findings: list[Finding]
    root: Finding | None
    step_range: tuple[float, float] | None
    time_range: tuple[datetime, datetime] | None


def slug(metric: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", metric.lower()).strip("-") or "metric"


def _parsed_list(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if isinstance(value, str) and value.startswith("["):
        try:
            return [str(v) for v in json.loads(value.replace("'", '"'))]
        except ValueError:
            return []
    return []


def _matches(metric: str, wanted: str) -> bool:
    return metric == wanted or metric.endswith("/" + wanted) or metric.endswith(wanted)


def metrics_about(f: Finding, logged: list[str]) -> list[str]:
    """The logged metrics a finding is about: those it names, else those its class is read from."""
    named = []
    for key in ("metric", "metrics", "non_finite"):
        value = f.fields.get(key)
        named += [value] if isinstance(value, str) and not value.startswith("[") else _parsed_list(value)
    chosen = [m for m in dict.fromkeys(named) if m in logged]
    return (chosen or _class_metrics(f, logged))[:MAX_METRICS_PER_FINDING]


def _class_metrics(f: Finding, logged: list[str]) -> list[str]:
    chosen: list[str] = []
    for wanted in CLASS_METRICS.get(f.cls, ()):
        chosen += [m for m in logged if _matches(m, wanted) and m not in chosen][:1]
    return chosen


def context_metrics(f: Finding, logged: list[str]) -> list[str]:
    """Metrics its class is read from that a finding does not name itself (the learning rate beside a loss)."""
    about = metrics_about(f, logged)
    return [m for m in _class_metrics(f, logged) if m not in about][:MAX_METRICS_PER_FINDING]


def _step_range(series: pl.DataFrame, root: Finding | None) -> tuple[float, float] | None:
    steps = series.get_column("step")
    if steps.null_count() == len(steps):
        return None
    lo, hi = int(steps.min()), int(steps.max())  # min and max pass over the nulls
    if root is not None and root.step is not None:
        lo, hi = min(lo, root.step), max(hi, root.step)
    return (lo - 0.5, hi + 0.5)


def _time_range(a: Analysis) -> tuple[datetime, datetime] | None:
    columns = [frame.get_column("ts") for frame in (a.events, a.series)]  # min and max pass over the nulls
    found = [(c.min(), c.max()) for c in columns if c.null_count() < len(c)]
    if not found:
        return None
    lo, hi = min(f[0] for f in found), max(f[1] for f in found)
    pad = (hi - lo) * 0.02
    return (lo - pad, hi + pad)


def _ticks(frame: _Frame) -> str:
    within_a_day = frame.time_range is None or frame.time_range[1] - frame.time_range[0] < timedelta(days=1)
    return CLOCK_TICKS if within_a_day else DAYS_TICKS


def _rank_name(rank: int | None) -> str:
    return f"rank {rank}" if rank is not None else "all ranks"


def known_ranks_only(part: pl.DataFrame) -> pl.DataFrame:
    """A metric's rows without those of no rank when some rank logged it: verl's file logger re-logs what
    rank 0 printed, and the copy would show as a second line."""
    ranked = part.filter(pl.col("rank").is_not_null())
    return ranked if ranked.height else part


def _per_rank(series: pl.DataFrame, metric: str) -> pl.DataFrame:
    """(rank, step, value): one value per rank and step (duplicate lines from two sources averaged)."""
    return (
        known_ranks_only(series.filter((pl.col("metric") == metric) & pl.col("step").is_not_null()))
        .group_by("rank", "step")
        .agg(pl.col("value").mean())
        .sort("rank", "step", nulls_last=False)
    )


def _rank_traces(data: pl.DataFrame, named: set[int]) -> list[tuple[str, list[Any], list[float | None]]]:
    """A trace per rank in rank order; with many ranks their min, median and max, and the named ranks."""
    ranks = data.get_column("rank").unique().sort(nulls_last=True).to_list()
    out = []
    if len(ranks) > MAX_RANK_TRACES:
        spread = data.group_by("step").agg(
            pl.col("value").min().alias("min"),
            pl.col("value").median().alias("median"),
            pl.col("value").max().alias("max"),
        )
        spread = spread.sort("step")
        for stat in ("max", "median", "min"):
            out.append((f"{stat} over {len(ranks)} ranks", spread["step"].to_list(), spread[stat].to_list()))
        ranks = sorted(r for r in ranks if r in named)
    for rank in ranks:
        part = data.filter(pl.col("rank").is_null() if rank is None else pl.col("rank") == rank)
        out.append((_rank_name(rank), part["step"].to_list(), part["value"].to_list()))
    return out


def _about(f: Finding, metric: str) -> bool:
    names = [f.fields.get("metric"), *_parsed_list(f.fields.get("metrics"))]
    return metric in names


def _shade(fig: go.Figure, findings: list[Finding], metric: str) -> None:
    """Shade the steps each finding about this metric covers, and name the finding at the first."""
    for f in findings:
        if not _about(f, metric) or not f.fields.get("steps"):
            continue
        steps = _parsed_steps(f.fields["steps"])
        if steps is None:
            continue
        colour = FAILURE_COLOUR if f.severity in ("error", "critical") else "#ff7f0e"
        spans = f.fields.get("spans") or [steps]
        for first, last in (s for s in (_parsed_steps(x) for x in spans) if s):
            fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=colour, opacity=0.15, line_width=0, layer="below")
        fig.add_annotation(
            x=steps[0],
            y=1,
            yref="paper",
            text=f.rule,
            showarrow=False,
            font={"size": 10, "color": colour},
            xanchor="left",
        )


def _parsed_steps(value: Any) -> tuple[int, int] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list | tuple) and len(value) == 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
    return None


def _mark_step(fig: go.Figure, root: Finding | None) -> None:
    if root is not None and root.step is not None:
        fig.add_vline(x=root.step, line_dash="dash", line_color=FAILURE_COLOUR, line_width=1.5)
        fig.add_annotation(
            x=root.step, y=1, yref="paper", text=f"failure · step {root.step}", showarrow=False,
            font={"size": 10, "color": FAILURE_COLOUR}, xanchor="right", yanchor="bottom",
        )  # fmt: skip


def _mark_time(fig: go.Figure, root: Finding | None, time_range: tuple[datetime, datetime] | None) -> None:
    """The moment of the root cause as a dashed line across a wall-clock plot."""
    if root is None or root.ts is None:
        return
    fig.add_shape(
        type="line", x0=root.ts, x1=root.ts, y0=0, y1=1, yref="paper",
        line={"dash": "dash", "color": FAILURE_COLOUR, "width": 1.5},
    )  # fmt: skip
    rank = f" · rank {root.rank}" if root.rank is not None else ""
    late = time_range is not None and root.ts > time_range[0] + (time_range[1] - time_range[0]) / 2
    fig.add_annotation(
        x=root.ts, y=1, yref="paper", text=f"{class_label(root.cls)}{rank}", showarrow=False,
        font={"size": 10, "color": FAILURE_COLOUR}, xanchor="right" if late else "left", yanchor="bottom",
    )  # fmt: skip


def _legend(fig: go.Figure) -> None:
    many = len(fig.data) > 1
    fig.update_layout(showlegend=many, legend=_LEGEND_BELOW if many else None)
    if many:
        fig.update_layout(height=fig.layout.height + 30, margin={**_LAYOUT["margin"], "b": 62})


def step_figure(series: pl.DataFrame, metric: str, frame: _Frame, title: str = "") -> go.Figure | None:
    """One metric by step: a line per rank, its axis calm or logarithmic, the failure step marked."""
    data = _per_rank(series, metric)
    if data.is_empty():
        return None
    named = {f.rank for f in frame.findings if f.rank is not None and _about(f, metric)}
    if frame.root is not None and frame.root.rank is not None:
        named.add(frame.root.rank)
    fig = go.Figure()
    values: list[float | None] = []
    for name, xs, ys in _rank_traces(data, named):
        xs, ys = thin(xs, ys)
        values += ys
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[compact(v) for v in ys],
                mode="lines+markers" if len(xs) <= 120 else "lines",
                name=name,
                marker={"size": 4},
            )
        )
    axis = value_axis(values)
    fig.update_layout(title={"text": title or metric, "font": {"size": 13}}, **_LAYOUT)
    fig.update_yaxes(**axis, title_text="log scale" if axis.get("type") == "log" else None)
    fig.update_xaxes(range=list(frame.step_range) if frame.step_range else None)
    _shade(fig, frame.findings, metric)
    _mark_step(fig, frame.root)
    _legend(fig)
    return fig


def _gpu_name(rank: int | None, source: str, several_sources: bool) -> str:
    name = f"GPU {rank}" if rank is not None else "GPU"
    return f"{name} · {source.replace('_', '-')}" if several_sources else name


def clock_figure(series: pl.DataFrame, metric: str, frame: _Frame) -> go.Figure | None:
    """Samples of one GPU metric in time, a line per GPU from every source that logged it."""
    title, unit, scale = CLOCK_METRICS.get(metric, (metric, "", 1.0))
    samples = series.filter((pl.col("metric") == metric) & pl.col("ts").is_not_null())
    if samples.is_empty():
        return None
    sources = sorted(samples.get_column("source").unique().to_list())
    fig = go.Figure()
    values: list[float | None] = []
    for source in sources:
        for rank in samples.filter(pl.col("source") == source).get_column("rank").unique().sort(nulls_last=True):
            part = samples.filter((pl.col("source") == source) & (pl.col("rank") == rank)).sort("ts")
            xs, ys = thin(part["ts"].to_list(), (part["value"] * scale).to_list())
            values += ys
            fig.add_trace(
                go.Scatter(
                    x=xs, y=[compact(v) for v in ys], mode="lines", name=_gpu_name(rank, source, len(sources) > 1)
                )
            )
    if metric == "gpu/memory_used_mib":
        _capacity_line(fig, series)
        _oom_points(fig, frame.findings)
    axis = value_axis(values)
    fig.update_layout(title={"text": f"{title} ({unit})", "font": {"size": 13}}, **_LAYOUT)
    fig.update_yaxes(**axis)
    fig.update_xaxes(range=list(frame.time_range) if frame.time_range else None, tickformat=_ticks(frame))
    _mark_time(fig, frame.root, frame.time_range)
    _legend(fig)
    return fig


def _capacity_line(fig: go.Figure, series: pl.DataFrame) -> None:
    total = series.filter(pl.col("metric") == "gpu/memory_total_mib").get_column("value")
    if not total.is_empty():
        fig.add_hline(
            y=float(total.max()) / 1024, line_dash="dot", line_color="#667085",
            annotation_text="capacity", annotation_position="top left",
        )  # fmt: skip


_GIB = re.compile(r"(?P<n>[\d.]+)\s*(?P<unit>[KMGT]?i?B)")
_UNIT_GIB = {"B": 1 / 1024**3, "KiB": 1 / 1024**2, "KB": 1 / 1024**2, "MiB": 1 / 1024, "MB": 1 / 1024}
_UNIT_GIB |= {"GiB": 1.0, "GB": 1.0, "TiB": 1024.0, "TB": 1024.0}


def gib(value: Any) -> float | None:
    """`18.55 GiB` as 18.55; None when the text holds no size."""
    m = _GIB.search(str(value or ""))
    if not m:
        return None
    return float(m["n"]) * _UNIT_GIB.get(m["unit"], 1.0)


def _oom_points(fig: go.Figure, findings: list[Finding]) -> None:
    """Each CUDA OOM as a point at the memory its process held when the allocation failed."""
    ooms = [f for f in findings if f.cls == "cuda_oom" and f.ts is not None and gib(f.fields.get("process_in_use"))]
    if not ooms:
        return
    fig.add_trace(
        go.Scatter(
            x=[f.ts for f in ooms],
            y=[gib(f.fields["process_in_use"]) for f in ooms],
            mode="markers",
            name="OOM (held by the process)",
            marker={"symbol": "x", "size": 12, "color": class_colour("cuda_oom")},
            text=[f"rank {f.rank}: tried {f.fields.get('tried', '?')}" for f in ooms],
            hovertemplate="%{text}<br>%{y:.2f} GiB<extra></extra>",
        )
    )


OOM_PARTS = (  # (field, label, colour): what the OOM message says the GPU's memory held
    ("allocated", "allocated by PyTorch", "#1f77b4"),
    ("reserved_unallocated", "reserved, unallocated", "#aec7e8"),
    ("other", "outside PyTorch", "#ff7f0e"),
    ("free", "free", "#c7c7c7"),
)


def oom_budget_figure(findings: list[Finding]) -> go.Figure | None:
    """Per rank that ran out of memory: what its GPU held at that moment, as the OOM message tells it."""
    ooms = sorted(
        (f for f in findings if f.cls == "cuda_oom" and gib(f.fields.get("capacity"))),
        key=lambda f: (f.rank is None, f.rank or 0),
    )
    if not ooms:
        return None
    labels = [_rank_name(f.rank) for f in ooms]
    parts: dict[str, list[float]] = {key: [] for key, _, _ in OOM_PARTS}
    for f in ooms:
        allocated = gib(f.fields.get("allocated")) or 0.0
        reserved = gib(f.fields.get("reserved_unallocated")) or 0.0
        in_use = gib(f.fields.get("process_in_use")) or allocated + reserved
        parts["allocated"].append(allocated)
        parts["reserved_unallocated"].append(reserved)
        parts["other"].append(max(0.0, in_use - allocated - reserved))
        parts["free"].append(gib(f.fields.get("free")) or 0.0)
    fig = go.Figure()
    for key, label, colour in OOM_PARTS:
        fig.add_trace(
            go.Bar(y=labels, x=[round(v, 2) for v in parts[key]], name=label, marker_color=colour, orientation="h")
        )
    for f, label in zip(ooms, labels, strict=True):
        tried = gib(f.fields.get("tried"))
        if tried:
            free = gib(f.fields.get("free"))
            note = f"asked for {tried:.2f} GiB" + (f" with {free:.2f} GiB free" if free is not None else "")
            fig.add_annotation(
                y=label, x=0, text=note, showarrow=False, xanchor="left", font={"color": "#ffffff", "size": 11}
            )
    height = 140 + 34 * len(ooms)
    fig.update_layout(
        title={"text": "GPU memory at the OOM (GiB, from the error message)", "font": {"size": 13}}, barmode="stack",
        **{**_LAYOUT, "height": height},
    )  # fmt: skip
    _legend(fig)
    return fig


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def host_memory_figure(findings: list[Finding]) -> go.Figure | None:
    """Per node where Ray's memory monitor killed a worker: the host memory in use then, against the node's total."""
    kills = {}
    for f in findings:
        used, total = _number(f.fields.get("node_used_gb")), _number(f.fields.get("node_total_gb"))
        if f.cls == "host_oom" and used is not None and total:
            kills.setdefault(str(f.fields.get("node_ip") or f.host or "node"), (used, total, f.fields.get("threshold")))
    if not kills:
        return None
    nodes = sorted(kills)
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            y=nodes,
            x=[kills[n][0] for n in nodes],
            name="in use",
            marker_color=class_colour("host_oom"),
            orientation="h",
        )
    )
    fig.add_trace(
        go.Bar(
            y=nodes, x=[kills[n][1] - kills[n][0] for n in nodes], name="free", marker_color="#c7c7c7", orientation="h"
        )
    )
    for n in nodes:
        threshold = _number(kills[n][2])
        if threshold:
            fig.add_annotation(
                y=n, x=threshold * kills[n][1], text="kill threshold", showarrow=True, arrowhead=0, ay=-24
            )
    fig.update_layout(
        title={"text": "Host memory when Ray's memory monitor killed a worker (GiB)", "font": {"size": 13}},
        barmode="stack", **{**_LAYOUT, "height": 150 + 34 * len(nodes)},
    )  # fmt: skip
    _legend(fig)
    return fig


def _rank_order(label: str) -> tuple[int, int]:
    return (0, int(label.split()[1])) if label.startswith("rank ") else (1, 0)


def _hover(f: Finding) -> str:
    where = f"<br>{f.evidence[0].file}:{f.evidence[0].line}" if f.evidence else ""  # a detector may cite no line
    return f"{f.rule} ×{f.count}{where}"


def timeline_figure(a: Analysis, frame: _Frame) -> go.Figure | None:
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
                y=[_rank_name(f.rank) if f.rank is not None else "run" for f in group],
                mode="markers",
                name=class_label(cls),
                marker={
                    "size": [18 if f is root else 11 for f in group],
                    "color": class_colour(cls),
                    "symbol": [("star" if f is root else "circle") + ("-open" if f.ts_inferred else "") for f in group],
                    "line": {"width": 1, "color": "#101828"},
                },
                text=[_hover(f) for f in group],
                hovertemplate="%{x}<br>%{y}<br>%{text}<extra>" + cls + "</extra>",
            )
        )
    lanes = sorted({_rank_name(f.rank) if f.rank is not None else "run" for f in points}, key=_rank_order)
    fig.update_layout(title={"text": "Findings by rank in time (★ root cause)", "font": {"size": 13}}, **_LAYOUT)
    fig.update_layout(height=min(MAX_TIMELINE_HEIGHT, max(220, 120 + 28 * len(lanes))))
    fig.update_yaxes(categoryorder="array", categoryarray=lanes[::-1])
    fig.update_xaxes(range=list(frame.time_range) if frame.time_range else None, tickformat=_ticks(frame))
    _mark_time(fig, root, frame.time_range)
    _legend(fig)
    return fig


def _memory_metrics(logged: list[str], by_step: set[str]) -> list[str]:
    return [m for m in logged if m in by_step and (m in MEMORY_METRICS or MEMORY_WORDS.search(m))]


def plots(a: Analysis) -> list[Plot]:
    """Every figure of the incident report, in page order, each metric once (where the verdict puts it first)."""
    root = a.verdict.root_cause
    frame = _Frame(a.findings, root, _step_range(a.series, root), _time_range(a))
    logged = sorted(a.series.get_column("metric").unique().to_list())
    by_step = set(a.series.filter(pl.col("step").is_not_null()).get_column("metric").unique().to_list())
    out: list[Plot] = []
    placed: set[str] = set()

    def add(section: str, metric: str, verdict: bool = False) -> None:
        if metric in placed:
            return
        fig = step_figure(a.series, metric, frame) if metric in by_step else clock_figure(a.series, metric, frame)
        if fig is not None:
            placed.add(metric)
            out.append(Plot(f"metric-{slug(metric)}", section, fig, (metric,), verdict))

    if root is not None:
        for metric in metrics_about(root, logged):
            add("verdict", metric, verdict=True)
        for metric in context_metrics(root, logged):
            add("verdict", metric)
    for f in a.findings:
        for metric in metrics_about(f, logged):
            add("verdict", metric)
    host = host_memory_figure(a.findings)
    if host is not None:
        about_root = bool(root and root.cls == "host_oom")
        out.append(Plot("host-memory", "verdict" if about_root else "memory", host, (), about_root))
    budget = oom_budget_figure(a.findings)
    if budget is not None:
        out.append(
            Plot(
                "oom-budget",
                "verdict" if root and root.cls == "cuda_oom" else "memory",
                budget,
                (),
                bool(root and root.cls == "cuda_oom"),
            )
        )
    timeline = timeline_figure(a, frame)
    if timeline is not None:
        out.append(Plot("timeline", "timeline", timeline))
    for metric in ("gpu/memory_used_mib", "gpu/util_pct"):
        add("timeline", metric)
    for metric in _memory_metrics(logged, by_step):
        add("memory", metric)
    for metric in TRAINING_METRICS:
        add("training", metric)
    for metric in THROUGHPUT_METRICS:
        add("throughput", metric)
    out += [Plot(name, "traces", fig) for name, fig in figures_traces.figures(a) if fig is not None]
    return out


def figures(a: Analysis) -> list[tuple[str, go.Figure]]:
    """(anchor name, figure) of every plot of the incident report, in page order."""
    return [(p.id, p.figure) for p in plots(a)]
