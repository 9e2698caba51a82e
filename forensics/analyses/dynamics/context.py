"""Per-run metric curves: what detectors and checks read, and how their detections point at the log.

The series table holds every sample of every source (console step lines, each rank's stdout, the
file logger, nvidia-smi); a `Curve` is one metric by step with the duplicate copies joined, and a
`Context` bundles the curves with what a finding needs to point at the log: the line of each step,
its time where the log has one, the GPU samples over time and the GPU's memory capacity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from forensics.analyses.explain.cuda_oom import oom_budget
from forensics.catalogue import Detection
from forensics.metric_semantics import Vocabulary, bundled
from forensics.model import Evidence
from forensics.series_table import metric_codes, where

GPU_SOURCES = ("nvidia_smi", "dcgm")
GIB_PER_MIB = 1 / 1024
MIN_POINTS = 8  # fewer steps than this after warm-up: too short to judge a trend


@dataclass(frozen=True)
class Curve:
    """One metric by step (steps sorted and unique; NaN and inf kept)."""

    metric: str
    steps: np.ndarray
    values: np.ndarray

    def finite(self) -> Curve:
        keep = np.isfinite(self.values)
        return Curve(self.metric, self.steps[keep], self.values[keep])

    def after(self, step: int) -> Curve:
        keep = self.steps > step
        return Curve(self.metric, self.steps[keep], self.values[keep])

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class Context:
    """Everything the detectors read, built once per run."""

    curves: Mapping[str, Curve]  # built on demand (StepCurves)
    rank_curves: dict[str, dict[int, Curve]]  # metric -> rank -> curve, only where ranks logged apart
    gpu: pl.DataFrame  # per-GPU samples over time (nvidia-smi, dcgm-exporter)
    capacity_gib: float | None
    overhead_gib: float  # GPU memory outside PyTorch's allocator, when an OOM message told it
    marks: dict[int, tuple[str, int, int]]  # step -> (file, line, file index) of its first step line
    mark_ts: dict[int, datetime]  # step -> time inferred from the nearest stamped line before it
    stamped: pl.DataFrame  # events with their own timestamp: file, line, ts
    config: dict[str, Any] = field(default_factory=dict)
    vocabulary: Vocabulary = field(default_factory=bundled)

    def judged(self, detector: str, kinds: tuple[str, ...] = ()) -> list[Curve]:
        """The curves the metric files say `detector` judges (of these kinds, when given), by name."""
        names = self.vocabulary.with_detector(self.curves, detector)
        return [self.curves[n] for n in names if not kinds or self.vocabulary.kind(n) in kinds]

    def first(self, detector: str, kinds: tuple[str, ...] = ()) -> Curve | None:
        """The curve `detector` judges first: the metric files' order (verl's names before the others)."""
        found = {c.metric: c for c in self.judged(detector, kinds)}
        order = [s.name for s in self.vocabulary.specs if s.name in found]
        return found[order[0]] if order else (next(iter(found.values())) if found else None)

    def kind_of(self, metric: str) -> str:
        return self.vocabulary.kind(metric)


def metric_leaf(metric: str) -> str:
    return metric.rsplit("/", 1)[-1]


def _reduction(metric: str, vocabulary: Vocabulary) -> str:
    """How copies of one step are joined: the metric file's `reduce`, else verl's rule (max for keys naming
    `max`, min for `min`, else mean)."""
    given = vocabulary.spec(metric).reduce
    if given:
        return given
    if "max" in metric:
        return "max"
    if "min" in metric:
        return "min"
    return "mean"


def warmup_steps(n: int) -> int:
    """Steps skipped before judging a trend: 10% of the run, at least 2 and at most 10."""
    return min(10, max(2, n // 10))


class StepCurves(Mapping[str, Curve]):
    """One run-level curve per metric, the copies of each step (one per rank) joined; each is built when first
    asked for, so a run of 150 metrics over 20,000 steps does not hold every sample again as curves."""

    def __init__(self, series: pl.DataFrame, vocabulary: Vocabulary | None = None) -> None:
        self._vocabulary = vocabulary or bundled()
        self._by_step = where(series, pl.col("step").is_not_null() & ~pl.col("source").is_in(GPU_SOURCES))
        self._codes, self._code_of = metric_codes(self._by_step)
        self._built: dict[str, Curve] = {}

    def __getitem__(self, metric: str) -> Curve:
        if metric not in self._built:
            rows = np.flatnonzero(self._codes == self._code_of[metric])  # KeyError: never logged by step
            how = _reduction(metric, self._vocabulary)
            agg = {"max": pl.col("value").max(), "min": pl.col("value").min()}.get(how, pl.col("value").mean())
            grouped = self._by_step[rows].group_by("step").agg(agg.alias("value")).sort("step")
            steps, values = grouped["step"].to_numpy().astype(np.int64), grouped["value"].to_numpy().astype(float)
            self._built[metric] = Curve(metric, steps, values)
        return self._built[metric]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._code_of))

    def __len__(self) -> int:
        return len(self._code_of)

    def __contains__(self, metric: object) -> bool:
        return metric in self._code_of


def step_curves(series: pl.DataFrame, vocabulary: Vocabulary | None = None) -> StepCurves:
    """One run-level curve per metric: the copies of each step (one per rank) joined."""
    return StepCurves(series, vocabulary)


def rank_curves(series: pl.DataFrame) -> dict[str, dict[int, Curve]]:
    """Per-rank curves, only for metrics that at least two ranks logged with different values."""
    ranked = series.filter(
        pl.col("step").is_not_null() & pl.col("rank").is_not_null() & ~pl.col("source").is_in(GPU_SOURCES)
    )
    out: dict[str, dict[int, Curve]] = {}
    if ranked.is_empty():
        return out
    for (metric,), part in ranked.group_by("metric"):
        if part["rank"].n_unique() < 2:
            continue
        per = {}
        for (rank,), rows in part.group_by("rank"):
            grouped = rows.group_by("step").agg(pl.col("value").mean()).sort("step")
            per[int(rank)] = Curve(str(metric), grouped["step"].to_numpy(), grouped["value"].to_numpy().astype(float))
        values = {tuple(np.round(c.values, 12)) for c in per.values()}
        if len(values) > 1:
            out[str(metric)] = per
    return out


def _oom_memory(events: pl.DataFrame) -> tuple[float | None, float]:
    """(capacity, memory outside PyTorch's allocator) in GiB from a CUDA OOM message, when one was logged.

    The memory not available to tensors (CUDA context, NCCL buffers, other processes) makes a leak reach
    its limit that much earlier.
    """
    oom = events.filter(pl.col("fields").str.contains('"capacity"', literal=True))
    for raw in oom.get_column("fields").to_list():
        fields = json.loads(raw)
        budget = oom_budget({"tried": "0 B", **fields})
        if budget is not None and budget.capacity:
            return budget.capacity, budget.outside_allocator or 0.0
    return None, 0.0


def _capacity_gib(events: pl.DataFrame, environment: dict[str, Any], gpu: pl.DataFrame) -> float | None:
    """GPU memory capacity: from a CUDA OOM message, else nvidia-smi (-q or CSV) / dcgm-exporter."""
    capacity, _ = _oom_memory(events)
    if capacity:
        return capacity
    total = environment.get("gpu_memory_total_mib")
    if isinstance(total, (int, float)) and total > 0:
        return float(total) * GIB_PER_MIB
    totals = gpu.filter(pl.col("metric") == "gpu/memory_total_mib").get_column("value")
    return float(totals.max()) * GIB_PER_MIB if totals.len() else None


def _marks(step_marks: list[tuple[str, int, int]], file_order: dict[str, int]) -> dict[int, tuple[str, int, int]]:
    first: dict[int, tuple[str, int, int]] = {}
    for file, line, step in step_marks:
        candidate = (file, line, file_order.get(file, 0))
        if step not in first or (candidate[2], line) < (first[step][2], first[step][1]):
            first[step] = candidate
    return first


def _mark_times(marks: dict[int, tuple[str, int, int]], events: pl.DataFrame) -> dict[int, datetime]:
    """Each step line's time, taken from the nearest earlier line of its file that has one."""
    stamped = events.filter(pl.col("ts").is_not_null()).select("file", "line", "ts").sort("file", "line")
    if stamped.is_empty() or not marks:
        return {}
    frame = pl.DataFrame(
        {"step": list(marks), "file": [m[0] for m in marks.values()], "line": [m[1] for m in marks.values()]},
        schema={"step": pl.Int64, "file": pl.String, "line": pl.Int64},
    ).sort("file", "line")
    joined = frame.join_asof(stamped, on="line", by="file", strategy="backward", check_sortedness=False)
    return {row["step"]: row["ts"] for row in joined.iter_rows(named=True) if row["ts"] is not None}


def build_context(
    series: pl.DataFrame,
    events: pl.DataFrame,
    step_marks: list[tuple[str, int, int]],
    file_order: dict[str, int],
    environment: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    vocabulary: Vocabulary | None = None,
) -> Context:
    vocabulary = vocabulary or bundled()
    gpu = series.filter(pl.col("source").is_in(GPU_SOURCES))
    marks = _marks(step_marks, file_order)
    stamped = events.filter(pl.col("ts").is_not_null() & ~pl.col("ts_inferred")).select("file", "line", "ts")
    return Context(
        curves=step_curves(series, vocabulary),
        rank_curves=rank_curves(series),
        gpu=gpu,
        capacity_gib=_capacity_gib(events, environment or {}, gpu),
        overhead_gib=_oom_memory(events)[1],
        marks=marks,
        mark_ts=_mark_times(marks, events),
        stamped=stamped,
        config=config or {},
        vocabulary=vocabulary,
    )


# --- building findings -------------------------------------------------------------------------


def fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e7:
        return f"{value:.3g}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def evidence_at(ctx: Context, step: int, metric: str, value: float) -> Evidence | None:
    mark = ctx.marks.get(step)
    if mark is None:
        return None
    return Evidence(mark[0], mark[1], f"step:{step} - … - {metric}:{value:.6g} - …")


def value_at(curve: Curve, step: int) -> float:
    hit = np.flatnonzero(curve.steps == step)
    return float(curve.values[hit[0]]) if len(hit) else math.nan


def detection(
    ctx: Context,
    entry: str,
    *,
    curve: Curve | None,
    steps: tuple[int, int],
    explanation: str,
    fields: dict[str, Any] | None = None,
    rank: int | None = None,
) -> Detection:
    """What a detector found over `steps` (first, last) of `curve`, pointing at those steps' lines; the
    catalogue entry `entry` describes it."""
    first, last = int(steps[0]), int(steps[1])
    evidence = []
    if curve is not None:
        for step in dict.fromkeys((first, last)):
            ev = evidence_at(ctx, step, curve.metric, value_at(curve, step))
            if ev is not None:
                evidence.append(ev)
    mark = ctx.marks.get(first)
    order = (mark[2], mark[1], 0) if mark else (1 << 30, first, 0)
    extra = {k: v.item() if isinstance(v, np.generic) else v for k, v in (fields or {}).items()}
    return Detection(
        id=entry,
        rank=rank,
        ts=ctx.mark_ts.get(first),
        ts_inferred=True,
        order=order,
        evidence=evidence,
        fields={
            "detector": entry,
            **({"metric": curve.metric} if curve else {}),
            "steps": [first, last],
            **extra,
        },
        step=first,
        explanation=explanation,
    )


def pick(ctx: Context, *names: str) -> Curve | None:
    for name in names:
        if name in ctx.curves:
            return ctx.curves[name]
    return None


def after_warmup(curve: Curve) -> Curve | None:
    """The finite part of a curve after its warm-up, or None when too short to judge."""
    finite = curve.finite()
    if len(finite) < MIN_POINTS + 2:
        return None
    judged = finite.after(int(finite.steps[warmup_steps(len(finite)) - 1]))
    return judged if len(judged) >= MIN_POINTS else None


def runs_of(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of True."""
    out = []
    start = None
    for i, v in enumerate(mask):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(mask) - 1))
    return out
