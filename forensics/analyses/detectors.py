"""Detectors: what went wrong with the training itself, read from the metric series.

Many RL runs do not crash: the loss diverges or bounces, entropy collapses, KL blows up, memory
creeps up to an OOM, throughput falls when one rank slows down, or the job stops making steps.
Each detector is a pure function of a `Context` built from the series table (plus the step lines'
positions for evidence and ordering) that returns findings with a plain-language `explanation` and
the steps it covers in `fields["steps"]` (`[first, last]`), which the report shades on its plots.

Statistics are robust (medians, MAD, first differences, a change point on a spike-cleaned curve):
a warm-up bump or the usual noise of RL metrics must not raise an alarm on a healthy run, so every
threshold asks for a large effect relative to the curve's own noise *and* to its level.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from forensics.analyses.diagnosis import _sort_key
from forensics.analyses.robust import (
    MAD_TO_SIGMA,
    change_point,
    kendall_tau,
    noise_scale,
    rolling_median,
    rolling_noise,
    theil_sen,
)
from forensics.model import Evidence, Finding

GPU_SOURCES = ("nvidia_smi", "dcgm")
NON_FINITE_RULE = "non-finite-loss"
# Findings that are usually the consequence of another instability (a divergence, a NaN, an oscillation):
# when one of those is present they are listed as its symptoms, not as rival root causes.
CONSEQUENCE_OF = ("training_instability",)  # the YAML rule that catches the first non-finite step line
GIB_PER_MIB = 1 / 1024

MIN_POINTS = 8  # fewer steps than this after warm-up: too short to judge a trend
DIVERGENCE_NOISE_K = 10.0  # a divergence stands this many noise units above where the loss started...
DIVERGENCE_START_FRACTION = 0.25  # ...and a quarter above it...
DIVERGENCE_MIN_STEPS = 5  # ...for this many steps in a row;
DIVERGENCE_EXPLOSION_FACTOR = 2.0  # (a positive loss at three times its start is far above it, whatever its noise)
DIVERGENCE_PROGRESS_FRACTION = 0.5  # or it climbs back, giving back half the progress, to the end
EPISODE_SKIP = 2  # the first steps of a run are not judged (initial loss, first updates)
EPISODE_NOISE_K = 4.0  # an episode stands this many calm-noise units above the best level so far...
EPISODE_RELATIVE = 0.1  # ...and 10% above it
OSCILLATION_MIN_EPISODES = 3  # bouncing back up three times or more is an oscillation
REGRESSION_MIN_STEPS = 5  # one long climb back up is a regression
SPIKE_Z = 10.0  # robust z-score of a spike against the preceding window
SPIKE_RATIO = 2.0  # and at least twice the local level
SPIKE_WINDOW = 15
EXPLOSION_FACTOR = 10.0  # grad norm 10x its early level, for EXPLOSION_MIN_STEPS steps in a row
EXPLOSION_MIN_STEPS = 3
ENTROPY_COLLAPSE_FRACTION = 0.1  # entropy ends below 10% of where it started
KL_FACTOR = 10.0
KL_FLOOR = {"ppo_kl": 0.05, "kl_loss": 0.5}
KL_MIN_STEPS = 3
CLIPFRAC_HIGH = 0.2
RESPONSE_CLIP_HIGH = 0.2
REWARD_SHIFT_STRENGTH = 6.0  # noise units
REWARD_SUDDEN_FRACTION = 0.5  # half the shift happens within three steps of the change point
LENGTH_COLLAPSE_FRACTION = 0.3
LENGTH_COLLAPSE_WINDOW = 3  # steps between the reward jump and the length drop
MEMORY_MIN_TAU = 0.7  # memory rises almost every step
MEMORY_MIN_RISE_GIB = 1.0
MEMORY_MIN_RISE_FRACTION = 0.05  # of the GPU's capacity
THROUGHPUT_DROP = 0.15  # a sustained drop of 15% or more
GPU_SHIFT_STRENGTH = 5.0  # noise units of the power spread between GPUs
GPU_BUSY_RATIO = 1.5  # the straggler draws this much more power than the GPUs waiting for it
SLOW_RANK_RATIO = 1.15
STALL_FACTOR = 10.0  # no new step for 10x the usual step time...
STALL_MIN_S = 120.0  # ...and at least two minutes


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

    curves: dict[str, Curve]
    rank_curves: dict[str, dict[int, Curve]]  # metric -> rank -> curve, only where ranks logged apart
    gpu: pl.DataFrame  # per-GPU samples over time (nvidia-smi, dcgm-exporter)
    capacity_gib: float | None
    overhead_gib: float  # GPU memory outside PyTorch's allocator, when an OOM message told it
    marks: dict[int, tuple[str, int, int]]  # step -> (file, line, file index) of its first step line
    mark_ts: dict[int, datetime]  # step -> time inferred from the nearest stamped line before it
    stamped: pl.DataFrame  # events with their own timestamp: file, line, ts
    config: dict[str, Any] = field(default_factory=dict)


def _leaf(metric: str) -> str:
    return metric.rsplit("/", 1)[-1]


def _is_loss(metric: str) -> bool:
    leaf = _leaf(metric)
    return (leaf == "loss" or leaf.endswith("_loss")) and leaf not in ("entropy_loss", "kl_loss")


def _is_grad_norm(metric: str) -> bool:
    return _leaf(metric).endswith("grad_norm")


def _is_watched_for_non_finite(metric: str) -> bool:
    leaf = _leaf(metric)
    return leaf.endswith("loss") or leaf.endswith("grad_norm") or leaf in ("ppo_kl", "entropy")


def _reduction(metric: str) -> str:
    """verl reduces worker metrics with max for keys naming `max`, min for `min`, else mean."""
    if "max" in metric:
        return "max"
    if "min" in metric:
        return "min"
    return "mean"


def warmup_steps(n: int) -> int:
    """Steps skipped before judging a trend: 10% of the run, at least 2 and at most 10."""
    return min(10, max(2, n // 10))


def step_curves(series: pl.DataFrame) -> dict[str, Curve]:
    """One run-level curve per metric: the duplicate copies (console, per-rank stdout, JSONL) joined."""
    by_step = series.filter(pl.col("step").is_not_null() & ~pl.col("source").is_in(GPU_SOURCES))
    if by_step.is_empty():
        return {}
    curves = {}
    for (metric,), part in by_step.group_by("metric"):
        how = _reduction(str(metric))
        agg = {"max": pl.col("value").max(), "min": pl.col("value").min()}.get(how, pl.col("value").mean())
        grouped = part.group_by("step").agg(agg.alias("value")).sort("step")
        curves[str(metric)] = Curve(
            str(metric), grouped["step"].to_numpy().astype(np.int64), grouped["value"].to_numpy().astype(float)
        )
    return curves


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

    The message says how much of the GPU was in use in all (capacity - free) and how much PyTorch holds
    (allocated + reserved but unallocated); the rest (CUDA context, NCCL buffers, other processes) is
    not available to tensors, so a leak reaches its limit that much earlier.
    """
    oom = events.filter(pl.col("fields").str.contains('"capacity"', literal=True))
    for raw in oom.get_column("fields").to_list():
        fields = json.loads(raw)
        capacity = _parse_size_gib(fields.get("capacity"))
        if not capacity:
            continue
        parts = [_parse_size_gib(fields.get(k)) for k in ("free", "allocated", "reserved_unallocated")]
        if all(p is not None for p in parts):
            free, allocated, cached = parts
            return capacity, max(0.0, capacity - free - allocated - cached)
        return capacity, 0.0
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


def _parse_size_gib(text: str | None) -> float | None:
    if not text:
        return None
    number, _, unit = text.strip().partition(" ")
    scale = {"GiB": 1.0, "GB": 1.0, "MiB": 1 / 1024, "MB": 1 / 1024, "TiB": 1024.0, "KiB": 1 / 1024**2}.get(unit)
    try:
        return float(number) * scale if scale else None
    except ValueError:
        return None


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
) -> Context:
    gpu = series.filter(pl.col("source").is_in(GPU_SOURCES))
    marks = _marks(step_marks, file_order)
    stamped = events.filter(pl.col("ts").is_not_null() & ~pl.col("ts_inferred")).select("file", "line", "ts")
    return Context(
        curves=step_curves(series),
        rank_curves=rank_curves(series),
        gpu=gpu,
        capacity_gib=_capacity_gib(events, environment or {}, gpu),
        overhead_gib=_oom_memory(events)[1],
        marks=marks,
        mark_ts=_mark_times(marks, events),
        stamped=stamped,
        config=config or {},
    )


# --- building findings -------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e7:
        return f"{value:.3g}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _evidence(ctx: Context, step: int, metric: str, value: float) -> Evidence | None:
    mark = ctx.marks.get(step)
    if mark is None:
        return None
    return Evidence(mark[0], mark[1], f"step:{step} - … - {metric}:{_fmt(value)} - …")


def _value_at(curve: Curve, step: int) -> float:
    hit = np.flatnonzero(curve.steps == step)
    return float(curve.values[hit[0]]) if len(hit) else math.nan


def _finding(
    ctx: Context,
    *,
    rule: str,
    cls: str,
    title: str,
    severity: str,
    layer: str,
    curve: Curve | None,
    steps: tuple[int, int],
    explanation: str,
    remediation: list[str],
    fields: dict[str, Any] | None = None,
    rank: int | None = None,
    symptom_of: tuple[str, ...] = (),
) -> Finding:
    first, last = int(steps[0]), int(steps[1])
    evidence = []
    if curve is not None:
        for step in dict.fromkeys((first, last)):
            ev = _evidence(ctx, step, curve.metric, _value_at(curve, step))
            if ev is not None:
                evidence.append(ev)
    mark = ctx.marks.get(first)
    order = (mark[2], mark[1], 0) if mark else (1 << 30, first, 0)
    return Finding(
        rule=rule,
        cls=cls,
        title=title,
        severity=severity,
        layer=layer,
        rank=rank,
        host=None,
        role=None,
        ts=ctx.mark_ts.get(first),
        ts_inferred=True,
        order=order,
        count=1,
        evidence=evidence,
        fields={
            "detector": rule,
            **({"metric": curve.metric} if curve else {}),
            "steps": [first, last],
            **(fields or {}),
        },
        remediation=remediation,
        symptom_of=symptom_of,
        step=first,
        explanation=explanation,
    )


def _pick(ctx: Context, *names: str) -> Curve | None:
    for name in names:
        if name in ctx.curves:
            return ctx.curves[name]
    return None


def _matching(ctx: Context, predicate: Callable[[str], bool]) -> list[Curve]:
    return [c for m, c in sorted(ctx.curves.items()) if predicate(m) and not m.startswith("val-")]


def _judged(curve: Curve) -> Curve | None:
    """The finite part of a curve after its warm-up, or None when too short to judge."""
    finite = curve.finite()
    if len(finite) < MIN_POINTS + 2:
        return None
    judged = finite.after(int(finite.steps[warmup_steps(len(finite)) - 1]))
    return judged if len(judged) >= MIN_POINTS else None


# --- numerical failure -------------------------------------------------------------------------


def detect_non_finite(ctx: Context) -> list[Finding]:
    """The first step where a loss, grad norm, KL or entropy became NaN or inf, and whether it recovered."""
    watched = _matching(ctx, _is_watched_for_non_finite)
    first_bad: dict[str, int] = {}
    bad_steps: set[int] = set()
    for curve in watched:
        bad = ~np.isfinite(curve.values)
        if bad.any():
            first_bad[curve.metric] = int(curve.steps[bad][0])
            bad_steps.update(int(s) for s in curve.steps[bad])
    if not first_bad:
        return []
    start = min(first_bad.values())
    at_start = sorted(m for m, s in first_bad.items() if s == start)
    primary = next((m for m in at_start if _is_loss(m)), at_start[0])
    curve = ctx.curves[primary]
    before = curve.finite()
    before = Curve(primary, before.steps[before.steps < start], before.values[before.steps < start])
    last_step = int(max(int(c.steps[-1]) for c in watched))
    later = last_step - start + 1
    persisted = max(bad_steps) == last_step
    only_grad_norm = all(_is_grad_norm(m) for m in first_bad)
    severity = "warning" if only_grad_norm and not persisted else "error"
    prior = f" (last finite value {_fmt(before.values[-1])} at step {before.steps[-1]})" if len(before) else ""
    also = (
        f"; also non-finite at that step: {', '.join(m for m in at_start if m != primary)}" if len(at_start) > 1 else ""
    )
    if persisted:
        outcome = (
            f"{len(bad_steps)} of the {later} steps from there to the end of the log stayed non-finite: the "
            "weights themselves are most likely NaN now, so every later update is garbage."
        )
    else:
        outcome = f"{len(bad_steps)} step(s) were non-finite and training produced finite values again afterwards."
    explanation = f"{primary} was {_fmt(_value_at(curve, start))} at step {start}{prior}{also}. {outcome}"
    return [
        _finding(
            ctx,
            rule="non-finite-metric",
            cls="training_instability",
            title="Loss or gradient norm became NaN/inf",
            severity=severity,
            layer="script",
            curve=curve,
            steps=(start, max(bad_steps)),
            explanation=explanation,
            remediation=[
                "Resume from the last checkpoint before step "
                f"{start} with a lower learning rate (actor_rollout_ref.actor.optim.lr) and gradient clipping on.",
                "Look at the batch of that step: extreme rewards or advantages, empty responses, or fp16 overflow "
                "(keep the loss and softmax in fp32 under bf16).",
            ],
            fields={"metrics": at_start[:10], "non_finite_steps": len(bad_steps), "recovered": not persisted},
        )
    ]


def _calm_noise(y: np.ndarray, window: int = 10) -> float:
    """Point-to-point noise of the calmer stretches of a curve (the 25th percentile over windows).

    Unstable stretches inflate the noise of the whole curve; the calm ones tell how noisy the metric is
    when training behaves.
    """
    if len(y) < window + 2:
        return noise_scale(y)
    return float(np.percentile(rolling_noise(y, window), 25))


def _divergence(finite: Curve) -> tuple[int, int, str] | None:
    """(onset index, last index, how) of a divergence: far above the start, or back up to the end."""
    y = finite.values
    smooth = rolling_median(y, 5)
    start = min(float(np.median(y[:3])), float(y[0]))  # a loss that explodes at once started at y[0]
    noise_margin = DIVERGENCE_NOISE_K * _calm_noise(y)
    if start > 0 and np.mean(y > 0) >= 0.9:  # a positive loss that explodes at once has no calm stretch:
        noise_margin = min(noise_margin, DIVERGENCE_EXPLOSION_FACTOR * start)  # tripling it is enough
    margin = max(noise_margin, DIVERGENCE_START_FRACTION * abs(start))
    runs = [(a, b) for a, b in _runs(smooth > start + margin) if b - a + 1 >= DIVERGENCE_MIN_STEPS]
    if runs:
        b = runs[-1][1]
        a = int(np.flatnonzero(y[: runs[0][0] + 1] <= start + margin)[-1]) + 1 if y[0] <= start + margin else 0
        a = min(a, runs[0][0])
        peak = int(a + np.argmax(y[a : b + 1]))
        how = (
            f"{finite.metric} started at {_fmt(start)} and from step {finite.steps[a]} climbed far above it, to "
            f"{_fmt(float(y[peak]))} at step {finite.steps[peak]}"
        )
        if b == len(y) - 1:
            how += ", and was still there when the log ended."
        else:
            tail = float(np.median(y[b + 1 :]))
            how += f"; after step {finite.steps[b]} it came back down, to {_fmt(tail)}"
            how += "." if tail < start - margin else ", no better than where it started: the run learnt nothing."
        return a, b, how
    tail = max(3, len(y) // 5)
    best = int(np.argmin(smooth[:-tail]))
    level = float(smooth[best])
    final = float(np.median(y[-tail:]))
    rise = final - level
    progress = max(start - level, 0.0)
    if rise <= max(margin, DIVERGENCE_PROGRESS_FRACTION * progress):
        return None
    half = level + rise / 2
    above = np.flatnonzero(smooth[best:] > half)
    onset = best + int(above[0]) if len(above) else best
    if np.mean(y[onset:] > half) < 0.8:  # not sustained: bouncing, judged by the episode detector
        return None
    how = (
        f"{finite.metric} fell to {_fmt(level)} by step {finite.steps[best]}, then from step {finite.steps[onset]} "
        f"climbed back to {_fmt(final)} (median of the last {tail} steps)"
    )
    if progress > 0:
        how += f", giving back {rise / progress:.0%} of what it had learnt"
    return onset, len(y) - 1, how + ", and did not come back down."


def detect_divergence(ctx: Context) -> list[Finding]:
    """A loss far above where it started for several steps, or one that climbs back up and stays there."""
    out = []
    for curve in _matching(ctx, _is_loss):
        finite = curve.finite()
        if len(finite) < MIN_POINTS + 2:
            continue
        found = _divergence(finite)
        if found is None:
            continue
        onset, last, how = found
        start = int(finite.steps[onset])
        out.append(
            _finding(
                ctx,
                rule="loss-divergence",
                cls="training_instability",
                title=f"{curve.metric} diverged",
                severity="error",
                layer="script",
                curve=curve,
                steps=(start, int(finite.steps[last])),
                explanation=how,
                remediation=[
                    "Lower the learning rate (actor_rollout_ref.actor.optim.lr, critic.optim.lr) or lengthen its "
                    "warm-up; keep gradient clipping on (actor_rollout_ref.actor.grad_clip).",
                    f"Resume from a checkpoint saved before step {start} rather than from the latest one.",
                ],
            )
        )
    return out


def _episodes(y: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Stretches where a loss stands well above the best level it had reached, and that best level."""
    best = np.minimum.accumulate(rolling_median(y, 5))
    threshold = np.maximum(EPISODE_NOISE_K * _calm_noise(y), EPISODE_RELATIVE * np.abs(best))
    return _runs(y - best > threshold), best


def detect_loss_instability(ctx: Context) -> list[Finding]:
    """A positive loss that keeps bouncing back above its best level (oscillation), or climbs back for a while."""
    diverged = {f.fields["metric"] for f in detect_divergence(ctx)}
    out = []
    for curve in _matching(ctx, _is_loss):
        finite = curve.finite()
        if curve.metric in diverged or len(finite) < MIN_POINTS + EPISODE_SKIP:
            continue
        judged = Curve(curve.metric, finite.steps[EPISODE_SKIP:], finite.values[EPISODE_SKIP:])
        y = judged.values
        if np.mean(y > 0) < 0.9:  # zero-centred (an RL policy loss): bouncing around 0 is its nature
            continue
        episodes, best = _episodes(y)
        length = sum(b - a + 1 for a, b in episodes)
        if len(episodes) < OSCILLATION_MIN_EPISODES and length < REGRESSION_MIN_STEPS:
            continue
        worst = max(range(len(y)), key=lambda i: (y[i] - best[i]) / abs(best[i]) if best[i] else 0.0)
        rise = (y[worst] - best[worst]) / abs(best[worst]) if best[worst] else float("inf")
        first, last = int(judged.steps[episodes[0][0]]), int(judged.steps[episodes[-1][1]])
        spans = [[int(judged.steps[a]), int(judged.steps[b])] for a, b in episodes]
        if len(episodes) >= OSCILLATION_MIN_EPISODES:
            rule, title = "loss-oscillation", f"{curve.metric} oscillates"
            explanation = (
                f"{curve.metric} jumped back above the best level it had reached {len(episodes)} times between "
                f"steps {first} and {last}, by up to {rise:.0%} (step {judged.steps[worst]}), instead of settling: "
                "the updates overshoot, typically a learning rate at the edge of stability."
            )
        else:
            rule, title = "loss-regression", f"{curve.metric} climbed back up for {length} steps"
            explanation = (
                f"{curve.metric} climbed back above the best level it had reached ({_fmt(float(best[episodes[0][0]]))})"
                f" from step {first} to step {last}, by up to {rise:.0%} at step {judged.steps[worst]}: an update "
                "overshot and training spent those steps recovering."
            )
        out.append(
            _finding(
                ctx,
                rule=rule,
                cls="training_instability",
                title=title,
                severity="warning",
                layer="script",
                curve=curve,
                steps=(first, last),
                explanation=explanation,
                remediation=[
                    "Lower the learning rate or lengthen its warm-up; keep gradient clipping on.",
                    "If it coincides with grad-norm spikes, look at the batches of those steps for outliers.",
                ],
                fields={"episodes": len(episodes), "spans": spans[:50], "max_rise": round(rise, 3)},
            )
        )
    return out


def _spike_indices(y: np.ndarray) -> list[tuple[int, float, float]]:
    """(index, z, local level) of points far above the window before them that then come back down."""
    if len(y) <= SPIKE_WINDOW:
        return []
    windows = np.lib.stride_tricks.sliding_window_view(y[:-1], SPIKE_WINDOW)  # row j: the points before j + W
    level = np.median(windows, axis=1)
    mad = MAD_TO_SIGMA * np.median(np.abs(windows - level[:, None]), axis=1)
    noise = rolling_noise(y[:-1], SPIKE_WINDOW)
    scale = np.maximum.reduce([mad, noise, 1e-3 * np.abs(level), np.full(len(level), 1e-12)])
    point = y[SPIKE_WINDOW:]
    excursion = point - level
    following = np.r_[y[SPIKE_WINDOW + 1 :], -np.inf]  # the last point counts as come back down
    hits = (excursion / scale >= SPIKE_Z) & (excursion >= (SPIKE_RATIO - 1) * np.abs(level))
    hits &= following < level + excursion / 2
    return [(int(j + SPIKE_WINDOW), float(excursion[j] / scale[j]), float(level[j])) for j in np.flatnonzero(hits)]


def detect_spikes(ctx: Context) -> list[Finding]:
    """Single-step jumps of a loss or grad norm far above its recent level (robust z-score)."""
    out = []
    for curve in _matching(ctx, lambda m: _is_loss(m) or _is_grad_norm(m)):
        judged = _judged(curve)
        if judged is None:
            continue
        spikes = _spike_indices(judged.values)
        if not spikes:
            continue
        steps = [int(judged.steps[i]) for i, _, _ in spikes]
        worst = max(spikes, key=lambda s: s[1])
        worst_step = int(judged.steps[worst[0]])
        explanation = (
            f"{curve.metric} jumped to {_fmt(float(judged.values[worst[0]]))} at step {worst_step}, "
            f"{worst[1]:.0f} robust sigmas above its level of {_fmt(worst[2])} over the {SPIKE_WINDOW} steps "
            f"before, and fell back the next step"
            + (
                f"; {len(spikes)} such spikes in all (steps {', '.join(map(str, steps[:8]))})."
                if len(spikes) > 1
                else "."
            )
            + " Isolated spikes usually come from a few extreme samples (very long responses, outlier rewards or "
            "advantages); repeated ones mean the learning rate is at the edge of stability."
        )
        out.append(
            _finding(
                ctx,
                rule="metric-spike",
                symptom_of=CONSEQUENCE_OF,
                cls="training_instability",
                title=f"Spikes in {curve.metric}",
                severity="warning",
                layer="script",
                curve=curve,
                steps=(steps[0], steps[-1]),
                explanation=explanation,
                remediation=[
                    "Check the samples of the spike steps (dump them with trainer.rollout_data_dir) for outliers.",
                    "Keep gradient clipping on; if spikes repeat, lower the learning rate.",
                ],
                fields={"spike_steps": steps[:50], "spans": [[s, s] for s in steps[:50]], "max_z": round(worst[1], 1)},
            )
        )
    return out


def detect_grad_norm_explosion(ctx: Context) -> list[Finding]:
    """A gradient norm that stays an order of magnitude above its early level for several steps."""
    out = []
    for curve in _matching(ctx, _is_grad_norm):
        judged = _judged(curve)
        if judged is None:
            continue
        y = judged.values
        early = float(np.median(y[: max(3, len(y) // 4)]))
        if early <= 0:
            continue
        high = rolling_median(y, 3) > EXPLOSION_FACTOR * early
        runs = _runs(high)
        runs = [(a, b) for a, b in runs if b - a + 1 >= EXPLOSION_MIN_STEPS]
        if not runs:
            continue
        a, b = runs[0]
        to_end = runs[-1][1] == len(y) - 1
        peak = float(np.max(y[a : b + 1]))
        explanation = (
            f"{curve.metric} stayed above {EXPLOSION_FACTOR:.0f}x its early level of {_fmt(early)} from step "
            f"{judged.steps[a]} to step {judged.steps[b]} (peak {_fmt(peak)}, {peak / early:.0f}x)"
            + (" and was still there when the log ended." if to_end else ".")
            + " Clipping hides exploding gradients in the loss, so this is often the first sign of divergence."
        )
        out.append(
            _finding(
                ctx,
                rule="grad-norm-explosion",
                symptom_of=CONSEQUENCE_OF,
                cls="training_instability",
                title=f"{curve.metric} exploded",
                severity="error" if to_end else "warning",
                layer="script",
                curve=curve,
                steps=(int(judged.steps[a]), int(judged.steps[runs[-1][1]])),
                explanation=explanation,
                remediation=[
                    "Lower the learning rate or lengthen its warm-up; keep actor_rollout_ref.actor.grad_clip at 1.0.",
                    "Look for extreme advantages or rewards in the batches of these steps.",
                ],
                fields={"early": early, "peak": peak},
            )
        )
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
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


# --- RL-specific ---------------------------------------------------------------------------------


def detect_entropy_collapse(ctx: Context) -> list[Finding]:
    """Policy entropy that ends below a tenth of where it started: the policy stopped exploring."""
    curve = _pick(ctx, "actor/entropy", "entropy", "policy/entropy_avg")
    if curve is None:
        return []
    finite = curve.finite()
    if len(finite) < MIN_POINTS + 2:
        return []
    y = finite.values
    start_level = float(np.median(y[:3]))
    tail = max(3, len(y) // 5)
    end_level = float(np.median(y[-tail:]))
    if start_level <= 0 or end_level >= ENTROPY_COLLAPSE_FRACTION * start_level:
        return []
    smooth = rolling_median(y, 3)
    onset = int(np.flatnonzero(smooth < (start_level + end_level) / 2)[0])
    start, end = int(finite.steps[onset]), int(finite.steps[-1])
    explanation = (
        f"{curve.metric} fell from {_fmt(start_level)} to {_fmt(end_level)} ({end_level / start_level:.1%} of its "
        f"start); it crossed the half-way mark at step {start}. The policy has become (nearly) deterministic: it "
        "no longer explores, rewards stop improving, and it often precedes reward hacking or repetitive outputs."
    )
    return [
        _finding(
            ctx,
            rule="entropy-collapse",
            symptom_of=CONSEQUENCE_OF,
            cls="training_instability",
            title="Policy entropy collapsed",
            severity="warning",
            layer="script",
            curve=curve,
            steps=(start, end),
            explanation=explanation,
            remediation=[
                "Lower the learning rate; raise the rollout temperature or add an entropy bonus "
                "(actor_rollout_ref.actor.entropy_coeff).",
                "Use clip-higher (actor_rollout_ref.actor.clip_ratio_high > clip_ratio_low) to keep exploring.",
            ],
            fields={"start": start_level, "end": end_level},
        )
    ]


def detect_kl_blowup(ctx: Context) -> list[Finding]:
    """The policy moving far from the old policy (ppo_kl) or from the reference (kl_loss)."""
    out = []
    for curve in _matching(ctx, lambda m: _leaf(m) in KL_FLOOR):
        judged = _judged(curve)
        if judged is None:
            continue
        y = np.abs(judged.values)
        early = float(np.median(y[: max(3, len(y) // 4)]))
        limit = max(KL_FACTOR * early, KL_FLOOR[_leaf(curve.metric)])
        runs = [(a, b) for a, b in _runs(rolling_median(y, 3) > limit) if b - a + 1 >= KL_MIN_STEPS]
        if not runs:
            continue
        a, b = runs[0][0], runs[-1][1]
        peak = float(np.max(y[a : b + 1]))
        explanation = (
            f"|{curve.metric}| rose above {_fmt(limit)} ({KL_FACTOR:.0f}x its early level of {_fmt(early)}, or the "
            f"floor of {_fmt(KL_FLOOR[_leaf(curve.metric)])}) from step {judged.steps[a]}, peaking at {_fmt(peak)}. "
            + (
                "Each update moves the policy far from the one that generated the rollouts: the PPO ratio is "
                "clipped for most tokens and the update is no longer trustworthy."
                if _leaf(curve.metric) == "ppo_kl"
                else "The policy is drifting far from the reference model; the KL penalty no longer holds it."
            )
        )
        out.append(
            _finding(
                ctx,
                rule="kl-blowup",
                symptom_of=CONSEQUENCE_OF,
                cls="training_instability",
                title=f"KL blow-up in {curve.metric}",
                severity="warning",
                layer="script",
                curve=curve,
                steps=(int(judged.steps[a]), int(judged.steps[b])),
                explanation=explanation,
                remediation=[
                    "Lower the learning rate or ppo_epochs; use a larger ppo_mini_batch_size.",
                    "Raise actor_rollout_ref.actor.kl_loss_coef (or algorithm.kl_ctrl.kl_coef) if the reference "
                    "KL grows unchecked; check that rollout and actor use the same weights (weight sync).",
                ],
                fields={"early": early, "peak": peak, "limit": limit},
            )
        )
    return out


def _sustained_high(ctx: Context, names: tuple[str, ...], limit: float) -> tuple[Curve, Curve, float] | None:
    curve = _pick(ctx, *names)
    if curve is None:
        return None
    judged = _judged(curve)
    if judged is None:
        return None
    half = judged.after(int(judged.steps[len(judged) // 2 - 1]))
    level = float(np.median(half.values))
    return (curve, judged, level) if level > limit else None


def detect_clip_fraction(ctx: Context) -> list[Finding]:
    """More than a fifth of the tokens clipped by PPO for most of the run."""
    hit = _sustained_high(ctx, ("actor/pg_clipfrac", "policy/clipfrac_avg"), CLIPFRAC_HIGH)
    if hit is None:
        return []
    curve, judged, level = hit
    above = np.flatnonzero(judged.values > CLIPFRAC_HIGH)
    return [
        _finding(
            ctx,
            rule="clip-fraction-high",
            symptom_of=CONSEQUENCE_OF,
            cls="training_instability",
            title="PPO clip fraction too high",
            severity="warning",
            layer="script",
            curve=curve,
            steps=(int(judged.steps[above[0]]), int(judged.steps[-1])),
            explanation=(
                f"{curve.metric} has a median of {level:.2f} over the second half of the run (above "
                f"{CLIPFRAC_HIGH:.0%}): for that share of tokens the update is cut off by the PPO clip, so each "
                "step moves the policy too far from the one that generated the rollouts."
            ),
            remediation=[
                "Lower the learning rate or ppo_epochs, or raise ppo_mini_batch_size so that each update is smaller.",
                "Check that rollout log-probs match the actor's (same dtype, weights synced every step).",
            ],
            fields={"median_second_half": level},
        )
    ]


def detect_response_clipping(ctx: Context) -> list[Finding]:
    """Responses that hit max_response_length: truncated answers are scored as wrong or unparsable."""
    hit = _sustained_high(ctx, ("response_length/clip_ratio",), RESPONSE_CLIP_HIGH)
    if hit is None:
        return []
    curve, judged, level = hit
    above = np.flatnonzero(judged.values > RESPONSE_CLIP_HIGH)
    limit = ctx.config.get("data.max_response_length")
    limit_text = f" (data.max_response_length={limit})" if limit is not None else ""
    return [
        _finding(
            ctx,
            rule="responses-truncated",
            cls="training_instability",
            title="Responses hit the maximum length",
            severity="warning",
            layer="script",
            curve=curve,
            steps=(int(judged.steps[above[0]]), int(judged.steps[-1])),
            explanation=(
                f"A median of {level:.0%} of responses per step were cut at the maximum length{limit_text} over "
                "the second half of the run. Truncated answers get no final answer to score, which biases rewards "
                "and pushes length in whichever direction the reward prefers."
            ),
            remediation=[
                "Raise data.max_response_length (and the rollout's max_model_len), or penalise overlong responses "
                "(e.g. DAPO's overlong reward shaping).",
                "If lengths grow without bound, check for repetition loops in the dumped generations.",
            ],
            fields={"median_second_half": level},
        )
    ]


def detect_reward_shift(ctx: Context) -> list[Finding]:
    """A sudden reward collapse, or a sudden reward jump while response length collapses (reward hacking)."""
    reward = _pick(ctx, "critic/score/mean", "critic/rewards/mean")
    if reward is None:
        return []
    judged = _judged(reward)
    if judged is None:
        return []
    cp = change_point(judged.values)
    if cp is None or cp.strength < REWARD_SHIFT_STRENGTH or not cp.is_step(min_sudden=REWARD_SUDDEN_FRACTION):
        return []
    step = int(judged.steps[cp.index])
    length = _pick(ctx, "response_length/mean")
    length_note, length_drop = "", None
    if length is not None:
        lj = _judged(length)
        lcp = change_point(lj.values) if lj is not None else None
        near = lcp is not None and abs(int(lj.steps[lcp.index]) - step) <= LENGTH_COLLAPSE_WINDOW
        if near and lcp.shift < 0 and -lcp.relative_shift >= LENGTH_COLLAPSE_FRACTION:
            length_drop = -lcp.relative_shift
            length_note = (
                f" At the same time response_length/mean fell from {_fmt(lcp.before)} to {_fmt(lcp.after)} "
                f"(-{length_drop:.0%}) at step {lj.steps[lcp.index]}."
            )
    symptom_of: tuple[str, ...] = ()
    if cp.shift < 0:
        rule, title, symptom_of = "reward-collapse", "Reward collapsed", CONSEQUENCE_OF
        explanation = (
            f"{reward.metric} dropped from {_fmt(cp.before)} to {_fmt(cp.after)} at step {step} "
            f"({cp.strength:.0f}x its step-to-step noise) and stayed down.{length_note} A sudden collapse points to a "
            "broken policy (diverged update, corrupted weights after a bad weight sync) or a broken reward function."
        )
    elif length_drop is not None:
        rule, title = "reward-hacking", "Reward jumped while responses collapsed"
        explanation = (
            f"{reward.metric} jumped from {_fmt(cp.before)} to {_fmt(cp.after)} at step {step}.{length_note} A "
            "reward that rises suddenly while answers get much shorter usually means the policy found a shortcut "
            "in the reward function (reward hacking) rather than solving the task."
        )
    else:
        return []
    return [
        _finding(
            ctx,
            rule=rule,
            cls="training_instability",
            title=title,
            severity="warning",
            layer="script",
            curve=reward,
            steps=(step, int(judged.steps[-1])),
            explanation=explanation,
            remediation=[
                "Read the generations dumped around that step (trainer.rollout_data_dir) next to their rewards.",
                "Harden the reward function (format checks, length penalties) and resume from before the shift.",
            ],
            fields={"before": cp.before, "after": cp.after, **({"length_drop": length_drop} if length_drop else {})},
            symptom_of=symptom_of,
        )
    ]


# --- memory --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Growth:
    slope: float  # units per step (or per second)
    start: int  # index where the judged window starts
    tau: float


def _growth(x: np.ndarray, y: np.ndarray, min_rise: float) -> _Growth | None:
    """A rise that is steady (Kendall tau), large (min_rise over the window) and still going at the end."""
    if len(y) < MIN_POINTS:
        return None
    tau = kendall_tau(y)
    slope = theil_sen(x, y)
    if tau < MEMORY_MIN_TAU or slope <= 0 or slope * (x[-1] - x[0]) < min_rise:
        return None
    third = len(y) // 3
    if theil_sen(x[-third - 1 :], y[-third - 1 :]) < 0.5 * slope:  # it levelled off: a warm-up plateau
        return None
    return _Growth(slope, 0, tau)


def _gpu_peaks(ctx: Context) -> dict[int, float]:
    used = ctx.gpu.filter((pl.col("metric") == "gpu/memory_used_mib") & pl.col("rank").is_not_null())
    if used.is_empty():
        return {}
    peaks = used.group_by("rank").agg(pl.col("value").max())
    return {int(r): float(v) * GIB_PER_MIB for r, v in peaks.iter_rows()}


def _leaking_gpu(ctx: Context) -> tuple[int | None, str]:
    """The GPU whose memory stood out (nvidia-smi / dcgm), when one did."""
    peaks = _gpu_peaks(ctx)
    if len(peaks) < 2:
        return None, ""
    top = max(peaks, key=lambda g: peaks[g])
    others = max(v for g, v in peaks.items() if g != top)
    if peaks[top] < 2 * others or (ctx.capacity_gib and peaks[top] < 0.5 * ctx.capacity_gib):
        return None, ""
    return (
        top,
        f" GPU {top} peaked at {peaks[top]:.1f} GiB in nvidia-smi while the others stayed under {others:.1f} GiB.",
    )


def detect_memory_growth(ctx: Context) -> list[Finding]:
    """Memory that grows with every step (a leak), with the step at which it reaches the GPU's capacity."""
    out = []
    for names, cls, what in (
        (
            (
                "perf/max_memory_allocated_gb",
                "actor/perf/max_memory_allocated_gb",
                "perf/max_memory_reserved_gb",
                "actor/perf/max_memory_reserved_gb",
            ),
            "cuda_oom",
            "GPU",
        ),
        (("perf/cpu_memory_used_gb", "actor/perf/cpu_memory_used_gb"), "host_oom", "host"),
    ):
        curve = _pick(ctx, *names)
        if curve is None:
            continue
        finite = curve.finite()
        if len(finite) < MIN_POINTS + 1:
            continue
        skip = min(warmup_steps(len(finite)), 2)  # memory settles after the first update or two
        judged = Curve(curve.metric, finite.steps[skip:], finite.values[skip:])
        capacity = ctx.capacity_gib if what == "GPU" else None
        min_rise = max(MEMORY_MIN_RISE_GIB, MEMORY_MIN_RISE_FRACTION * capacity if capacity else 0.0)
        growth = _growth(judged.steps.astype(float), judged.values, min_rise)
        if growth is None:
            continue
        first, last = int(judged.steps[0]), int(judged.steps[-1])
        fields: dict[str, Any] = {"growth_gib_per_step": round(growth.slope, 4), "leads_to": cls}
        explanation = (
            f"{curve.metric} rose steadily by {growth.slope:.3g} GiB per step from step {first} "
            f"({_fmt(float(judged.values[0]))} GiB) to step {last} ({_fmt(float(judged.values[-1]))} GiB); "
            f"it rose in {np.mean(np.diff(judged.values) > 0):.0%} of the steps, which a warm-up plateau does not."
        )
        if capacity:
            overhead = ctx.overhead_gib if what == "GPU" else 0.0
            remaining = capacity - overhead - float(judged.values[-1])
            projected = last + max(1, math.ceil(remaining / growth.slope)) if remaining > 0 else last
            fields.update(capacity_gib=round(capacity, 2), projected_step=projected)
            beside = f" less the {overhead:.1f} GiB held outside PyTorch" if overhead >= 0.05 else ""
            explanation += (
                f" At that rate it reaches the {what}'s {capacity:.1f} GiB capacity{beside} at step {projected}: "
                f"the run was heading for an out-of-memory failure at step {projected}."
            )
        rank, gpu_note = _leaking_gpu(ctx) if what == "GPU" else (None, "")
        explanation += gpu_note
        out.append(
            _finding(
                ctx,
                rule="memory-growth",
                cls=cls,
                title=f"{what} memory grows every step (leak)",
                severity="warning",
                layer="framework",
                curve=curve,
                steps=(first, last),
                explanation=explanation,
                remediation=[
                    "Look for tensors kept across steps (lists of losses or logits not detached, caches that are "
                    "never cleared, metrics holding GPU tensors); call .item() or .detach().cpu() on what you log.",
                    "Compare torch.cuda.memory_allocated() at the start of consecutive steps to find where it grows.",
                ],
                fields=fields,
                rank=rank,
            )
        )
    return out


# --- throughput, stragglers, stalls --------------------------------------------------------------


def _throughput_curve(ctx: Context) -> tuple[Curve, bool] | None:
    """(curve, higher_is_better): tokens/s when logged, else the step time."""
    curve = _pick(ctx, "perf/throughput")
    if curve is not None:
        return curve, True
    curve = _pick(ctx, "timing_s/step", "perf/time_per_step")
    return (curve, False) if curve is not None else None


def _aligned_gpu_samples(ctx: Context, metric: str) -> tuple[list[int], np.ndarray, list[datetime]] | None:
    """(GPUs, samples x GPUs matrix, times): the k-th sample of every GPU belongs to one sampling cycle."""
    part = ctx.gpu.filter((pl.col("metric") == metric) & pl.col("rank").is_not_null() & pl.col("ts").is_not_null())
    if part.is_empty() or part["rank"].n_unique() < 2:
        return None
    part = part.sort("rank", "ts").with_columns(pl.int_range(pl.len()).over("rank").alias("k"))
    wide = part.pivot(on="rank", index="k", values="value").sort("k").drop_nulls()
    gpus = sorted(int(c) for c in wide.columns if c != "k")
    times = part.filter(pl.col("rank") == gpus[0]).sort("k")["ts"].to_list()[: wide.height]
    return gpus, wide.select([str(g) for g in gpus]).to_numpy().astype(float), times


def _straggler_gpu(ctx: Context) -> tuple[int | None, str]:
    """The GPU that kept working while its peers waited, from nvidia-smi / dcgm power draw.

    Step lines carry no time, so the moment is read from the GPU samples themselves: the change point
    where the GPUs' power draw, alike until then, drew apart. The one that still draws the most is busy
    while the others idle in collectives waiting for it: the straggler.
    """
    aligned = _aligned_gpu_samples(ctx, "gpu/power_w")
    if aligned is None:
        return None, ""
    gpus, power, times = aligned
    util = _aligned_gpu_samples(ctx, "gpu/util_pct")
    if util is not None and util[1].shape == power.shape:
        active = util[1].max(axis=1) >= 50  # only while the job runs on the GPUs
        power, times = power[active], [t for t, a in zip(times, active, strict=True) if a]
    if len(power) < 2 * MIN_POINTS:
        return None, ""
    spread = power.max(axis=1) - power.min(axis=1)
    cp = change_point(spread, min_size=max(3, len(spread) // 10))
    if cp is None or cp.shift <= 0 or not cp.is_step() or cp.strength < GPU_SHIFT_STRENGTH:
        return None, ""
    after = np.median(power[cp.index :], axis=0)
    before = np.median(power[: cp.index], axis=0)
    top = int(np.argmax(after))
    others = float(np.median(np.delete(after, top)))
    if after[top] < GPU_BUSY_RATIO * others:
        return None, ""
    gpu = gpus[top]
    return gpu, (
        f" In nvidia-smi the GPUs drew alike ({np.median(before):.0f} W) until {times[cp.index]:%H:%M:%S}; from then "
        f"on GPU {gpu} drew {after[top]:.0f} W while the others drew {others:.0f} W: GPU {gpu} kept computing "
        f"while its peers waited for it in collectives, so GPU {gpu} (local rank {gpu}) is the straggler."
    )


def detect_throughput_regression(ctx: Context) -> list[Finding]:
    """A sustained drop in throughput (or rise in step time) after warm-up, with the step it began."""
    picked = _throughput_curve(ctx)
    if picked is None:
        return []
    curve, higher_is_better = picked
    judged = _judged(curve)
    if judged is None:
        return []
    y = judged.values if higher_is_better else -judged.values
    cp = change_point(y, min_size=max(3, len(y) // 10))
    if cp is None or cp.shift >= 0 or not cp.is_step():
        return []
    drop = -cp.shift / abs(cp.before)
    if drop < THROUGHPUT_DROP:
        return []
    step = int(judged.steps[cp.index])
    before, after = (cp.before, cp.after) if higher_is_better else (-cp.before, -cp.after)
    explanation = (
        f"{curve.metric} went from {_fmt(before)} to {_fmt(after)} ({'-' if higher_is_better else '+'}"
        f"{drop:.0%}) at step {step} and stayed there through step {judged.steps[-1]} ({len(y) - cp.index} steps)."
    )
    step_time = _pick(ctx, "timing_s/step")
    if higher_is_better and step_time is not None:
        t = step_time.finite()
        pre = t.values[(t.steps < step) & (t.steps > judged.steps[0] - 1)]
        post = t.values[t.steps >= step]
        if len(pre) and len(post):
            explanation += f" timing_s/step rose from {np.median(pre):.3g} s to {np.median(post):.3g} s."
    rank, note = _straggler_gpu(ctx)
    explanation += note or " A sudden, lasting slowdown points at one slow rank (a straggler) or a degraded link."
    return [
        _finding(
            ctx,
            rule="throughput-regression",
            cls="straggler",
            title="Throughput dropped and stayed down",
            severity="warning",
            layer="infrastructure",
            curve=curve,
            steps=(step, int(judged.steps[-1])),
            explanation=explanation,
            remediation=[
                "Find the slow rank: compare per-rank step or kernel times (a profiler trace of one step, or "
                "nvidia-smi utilisation, clocks and power per GPU); check for thermal or power throttling and Xid "
                "errors on its node.",
                "If the slowdown follows a change in response length, it is the workload, not the hardware.",
            ],
            fields={"before": before, "after": after, "drop": round(drop, 3)},
            rank=rank,
        )
    ]


def detect_slow_rank(ctx: Context) -> list[Finding]:
    """One rank consistently slower than the others, where ranks log their own step times."""
    out = []
    for metric in ("timing_s/step", "perf/time_per_step", "timing_s/update_actor"):
        per_rank = ctx.rank_curves.get(metric)
        if not per_rank:
            continue
        medians = {}
        for rank, curve in per_rank.items():
            judged = _judged(curve)
            if judged is not None:
                medians[rank] = float(np.median(judged.values))
        if len(medians) < 2:
            continue
        slow = max(medians, key=lambda r: medians[r])
        others = float(np.median([v for r, v in medians.items() if r != slow]))
        if others <= 0 or medians[slow] < SLOW_RANK_RATIO * others:
            continue
        curve = per_rank[slow]
        out.append(
            _finding(
                ctx,
                rule="slow-rank",
                cls="straggler",
                title=f"Rank {slow} is slower than the others",
                severity="warning",
                layer="infrastructure",
                curve=curve,
                steps=(int(curve.steps[0]), int(curve.steps[-1])),
                explanation=(
                    f"rank {slow}'s median {metric} is {medians[slow]:.3g} s against {others:.3g} s for the other "
                    f"ranks (+{medians[slow] / others - 1:.0%}); every collective waits for it."
                ),
                remediation=[
                    f"Check rank {slow}'s GPU (clocks, power and thermal throttling, Xid errors) and its data "
                    "loading; move it to another node to see whether the slowness follows the hardware."
                ],
                fields={"rank_medians": {str(r): round(v, 4) for r, v in sorted(medians.items())}},
                rank=slow,
            )
        )
        break
    return out


def _step_seconds(ctx: Context) -> float | None:
    curve = _pick(ctx, "timing_s/step", "perf/time_per_step")
    if curve is not None and len(curve.finite()):
        return float(np.median(curve.finite().values))
    times = sorted(ctx.mark_ts.items())
    if len(times) >= 3:
        return float(np.median(np.diff([t.timestamp() for _, t in times])))
    return None


def detect_stall(ctx: Context) -> list[Finding]:
    """No new step for many times the usual step time before the log ends: the job stopped progressing."""
    if not ctx.marks:
        return []
    last = max(ctx.marks)
    file, line, _ = ctx.marks[last]
    previous = [ctx.marks[s][1] for s in ctx.marks if s < last and ctx.marks[s][0] == file]
    lower = max(previous) if previous else 0
    here = ctx.stamped.filter(pl.col("file") == file)
    before = here.filter((pl.col("line") > lower) & (pl.col("line") < line))
    after = here.filter(pl.col("line") > line)
    step_s = _step_seconds(ctx)
    if before.is_empty() or after.is_empty() or step_s is None:
        return []
    last_step_ts, end_ts = before["ts"].max(), after["ts"].max()
    gap = (end_ts - last_step_ts).total_seconds()
    if gap < max(STALL_FACTOR * step_s, STALL_MIN_S):
        return []
    return [
        _finding(
            ctx,
            rule="training-stall",
            cls="hang",
            title="Training stopped making steps",
            severity="error",
            layer="infrastructure",
            curve=None,
            steps=(last, last),
            explanation=(
                f"The last step line (step {last}) was printed around {last_step_ts:%H:%M:%S} and the log went on "
                f"until {end_ts:%H:%M:%S} — {gap:.0f} s, {gap / step_s:.0f}x the usual step time of {step_s:.3g} s — "
                f"without another step: the job hung in step {last + 1}."
            ),
            remediation=[
                "Find what the ranks were waiting for: py-spy dump of each rank, or the NCCL flight recorder "
                "(TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT=1).",
            ],
            fields={"gap_s": round(gap, 1), "step_s": round(step_s, 4)},
            symptom_of=(
                "cuda_oom",
                "host_oom",
                "process_killed",
                "nccl_timeout",
                "nccl_error",
                "collective_mismatch",
                "ray_actor_died",
                "ray_node_died",
                "cuda_error",
                "gpu_hardware",
            ),
        )
    ]


DETECTORS: tuple[Callable[[Context], list[Finding]], ...] = (
    detect_non_finite,
    detect_divergence,
    detect_loss_instability,
    detect_spikes,
    detect_grad_norm_explosion,
    detect_entropy_collapse,
    detect_kl_blowup,
    detect_clip_fraction,
    detect_response_clipping,
    detect_reward_shift,
    detect_memory_growth,
    detect_throughput_regression,
    detect_slow_rank,
    detect_stall,
)


def detect(
    series: pl.DataFrame,
    events: pl.DataFrame,
    step_marks: list[tuple[str, int, int]],
    file_order: dict[str, int],
    environment: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> list[Finding]:
    """Every detector's findings for one run; a detector that fails is skipped with a warning."""
    ctx = build_context(series, events, step_marks, file_order, environment, config)
    out = []
    for detector in DETECTORS:
        try:
            out.extend(detector(ctx))
        except (ValueError, IndexError, ArithmeticError, pl.exceptions.PolarsError) as exc:
            if warnings is not None:
                warnings.append(f"detector {detector.__name__} skipped: {type(exc).__name__}: {exc}")
    return out


def add_detector_findings(findings: list[Finding], detected: list[Finding]) -> list[Finding]:
    """Rule findings plus detector findings, in time order.

    The `non-finite-loss` rule already caught the first NaN step line; the detector's finding adds the
    first step and metric to it (and whether training recovered) instead of standing beside it.
    """
    out = list(findings)
    by_rule = [f for f in findings if f.rule == NON_FINITE_RULE]
    for finding in detected:
        if finding.rule == "non-finite-metric" and by_rule:
            target = min(by_rule, key=_sort_key)
            target.fields.update({k: v for k, v in finding.fields.items() if k != "detector"})
            target.explanation = finding.explanation
            target.step = finding.step
            continue
        out.append(finding)
    return sorted(out, key=_sort_key)
