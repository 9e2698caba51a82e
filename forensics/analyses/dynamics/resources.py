"""Resource and progress detectors: memory growing to an OOM, throughput that falls, stragglers, stalls.

Memory and step time are read per step from verl's `perf/*` and `timing_s/*` metrics; which GPU leaks
or lags is read from nvidia-smi / dcgm-exporter samples over time, since step lines carry no rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from forensics.analyses.dynamics.context import (
    GIB_PER_MIB,
    MIN_POINTS,
    Context,
    Curve,
    after_warmup,
    detection,
    fmt,
    pick,
    warmup_steps,
)
from forensics.analyses.dynamics.robust import change_point, kendall_tau, theil_sen
from forensics.catalogue import Detection

MEMORY_MIN_TAU = 0.7  # memory rises almost every step
MEMORY_MIN_RISE_GIB = 1.0
MEMORY_MIN_RISE_FRACTION = 0.05  # of the GPU's capacity
LENGTH_GROWTH_TAU = 0.5  # sequence lengths that rise this steadily explain memory that rises with them...
LENGTH_MEMORY_RATIO = 3.0  # ...by up to three times their relative rise
HINGE_CANDIDATES = 200  # break points tried when a leak may have begun mid-run
HINGE_GAIN = 0.5  # the hinge must halve the squared error of a straight line to say the rise began later
THROUGHPUT_DROP = 0.15  # a sustained drop of 15% or more...
THROUGHPUT_STRENGTH = 8.0  # ...far outside the step-to-step noise (a shared or busy host moves it by less)
THROUGHPUT_SEPARATION = 0.9  # ...with the steps before and after barely overlapping
GPU_SHIFT_STRENGTH = 5.0  # noise units of the power spread between GPUs
GPU_BUSY_RATIO = 1.5  # the straggler draws this much more power than the GPUs waiting for it
SLOW_RANK_RATIO = 1.15
STALL_FACTOR = 10.0  # no new step for 10x the usual step time...
STALL_MIN_S = 120.0  # ...and at least two minutes


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


def growth_onset(x: np.ndarray, y: np.ndarray) -> int:
    """Index where a flat-then-rising curve starts to rise: the break of the best hinge fit
    y = a + b * max(0, x - x[c]) (a leak that begins mid-run, after a plateau), 0 when it rose throughout."""
    n = len(y)
    if n < 2 * MIN_POINTS:
        return 0
    candidates = np.unique(np.linspace(0, n - MIN_POINTS, min(n - MIN_POINTS, HINGE_CANDIDATES)).astype(int))
    best, best_sse = 0, np.inf
    for c in candidates:
        h = np.maximum(0.0, x - x[c])
        design = np.c_[np.ones(n), h]
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        sse = float(np.sum((design @ coef - y) ** 2))
        if sse < best_sse and coef[1] > 0:
            best, best_sse = int(c), sse
    line = np.polyfit(x, y, 1)
    if best_sse >= HINGE_GAIN * float(np.sum((np.polyval(line, x) - y) ** 2)):
        return 0  # a straight rise fits as well: it grew from the start
    return best


def _relative_rise(y: np.ndarray) -> float:
    head, tail = float(np.median(y[:3])), float(np.median(y[-3:]))
    return tail / head - 1 if head > 0 else float("inf")


def _lengths_grow(ctx: Context, memory: Curve) -> bool:
    """Whether the sequences grew steadily over these steps (response length rising as an RL policy learns to
    think longer) and as much as the memory did: memory that follows them is the workload, not a leak.

    Activation memory grows with length, attention's up to its square: memory that rose by more than
    LENGTH_MEMORY_RATIO times the length's relative rise is not explained by it."""
    steps = memory.steps
    for metric in sorted(ctx.curves):
        if ctx.kind_of(metric) != "length" or "max" in metric or "min" in metric:
            continue
        finite = ctx.curves[metric].finite()
        window = finite.values[(finite.steps >= steps[0]) & (finite.steps <= steps[-1])]
        if len(window) < MIN_POINTS or kendall_tau(window) < LENGTH_GROWTH_TAU:
            continue
        if _relative_rise(memory.values) <= LENGTH_MEMORY_RATIO * max(_relative_rise(window), 0.0):
            return True
    return False


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


def detect_memory_growth(ctx: Context) -> list[Detection]:
    """Memory that grows with every step (a leak), with the step at which it reaches the GPU's capacity."""
    out = []
    for kind, cls, what in (("gpu_memory", "cuda_oom", "GPU"), ("host_memory", "host_oom", "host")):
        curve = ctx.first("memory-growth", (kind,))
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
        onset = growth_onset(judged.steps.astype(float), judged.values)
        if onset:
            judged = Curve(curve.metric, judged.steps[onset:], judged.values[onset:])
            growth = _growth(judged.steps.astype(float), judged.values, min_rise) or growth
        if _lengths_grow(ctx, judged):
            continue  # longer sequences need more memory: the workload grew, not a leak
        first, last = int(judged.steps[0]), int(judged.steps[-1])
        fields: dict[str, Any] = {"growth_gib_per_step": round(growth.slope, 4), "leads_to": cls}
        explanation = (
            f"{curve.metric} rose steadily by {growth.slope:.3g} GiB per step from step {first} "
            f"({fmt(float(judged.values[0]))} GiB) to step {last} ({fmt(float(judged.values[-1]))} GiB); "
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
            detection(
                ctx,
                "memory-growth" if what == "GPU" else "host-memory-growth",
                curve=curve,
                steps=(first, last),
                explanation=explanation,
                fields=fields,
                rank=rank,
            )
        )
    return out


# --- throughput, stragglers, stalls --------------------------------------------------------------


def _throughput_curve(ctx: Context) -> tuple[Curve, bool] | None:
    """(curve, higher_is_better): tokens/s when logged, else the step time."""
    curve = ctx.first("throughput-regression", ("throughput",))
    if curve is not None:
        return curve, True
    curve = ctx.first("throughput-regression", ("time",))
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


def detect_throughput_regression(ctx: Context) -> list[Detection]:
    """A sustained drop in throughput (or rise in step time) after warm-up, with the step it began."""
    picked = _throughput_curve(ctx)
    if picked is None:
        return []
    curve, higher_is_better = picked
    judged = after_warmup(curve)
    if judged is None:
        return []
    y = judged.values if higher_is_better else -judged.values
    cp = change_point(y, min_size=max(3, len(y) // 10))
    if cp is None or cp.shift >= 0 or not cp.is_step(min_separation=THROUGHPUT_SEPARATION):
        return []
    if cp.strength < THROUGHPUT_STRENGTH:
        return []
    drop = -cp.shift / abs(cp.before)
    if drop < THROUGHPUT_DROP:
        return []
    step = int(judged.steps[cp.index])
    before, after = (cp.before, cp.after) if higher_is_better else (-cp.before, -cp.after)
    explanation = (
        f"{curve.metric} went from {fmt(before)} to {fmt(after)} ({'-' if higher_is_better else '+'}"
        f"{drop:.0%}) at step {step} and stayed there through step {judged.steps[-1]} ({len(y) - cp.index} steps)."
    )
    step_time = pick(ctx, "timing_s/step")
    if higher_is_better and step_time is not None:
        t = step_time.finite()
        pre = t.values[(t.steps < step) & (t.steps > judged.steps[0] - 1)]
        post = t.values[t.steps >= step]
        if len(pre) and len(post):
            explanation += f" timing_s/step rose from {np.median(pre):.3g} s to {np.median(post):.3g} s."
    rank, note = _straggler_gpu(ctx)
    explanation += note or " A sudden, lasting slowdown points at one slow rank (a straggler) or a degraded link."
    return [
        detection(
            ctx,
            "throughput-regression",
            curve=curve,
            steps=(step, int(judged.steps[-1])),
            explanation=explanation,
            fields={"before": before, "after": after, "drop": round(drop, 3)},
            rank=rank,
        )
    ]


def detect_slow_rank(ctx: Context) -> list[Detection]:
    """One rank consistently slower than the others, where ranks log their own step times."""
    out = []
    for metric in ("timing_s/step", "perf/time_per_step", "timing_s/update_actor"):
        per_rank = ctx.rank_curves.get(metric)
        if not per_rank:
            continue
        medians = {}
        for rank, curve in per_rank.items():
            judged = after_warmup(curve)
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
            detection(
                ctx,
                "slow-rank",
                curve=curve,
                steps=(int(curve.steps[0]), int(curve.steps[-1])),
                explanation=(
                    f"rank {slow}'s median {metric} is {medians[slow]:.3g} s against {others:.3g} s for the other "
                    f"ranks (+{medians[slow] / others - 1:.0%}); every collective waits for it."
                ),
                fields={"rank_medians": {str(r): round(v, 4) for r, v in sorted(medians.items())}},
                rank=slow,
            )
        )
        break
    return out


def _step_seconds(ctx: Context) -> float | None:
    curve = pick(ctx, "timing_s/step", "perf/time_per_step")
    if curve is not None and len(curve.finite()):
        return float(np.median(curve.finite().values))
    times = sorted(ctx.mark_ts.items())
    if len(times) >= 3:
        return float(np.median(np.diff([t.timestamp() for _, t in times])))
    return None


def detect_stall(ctx: Context) -> list[Detection]:
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
        detection(
            ctx,
            "training-stall",
            curve=None,
            steps=(last, last),
            explanation=(
                f"The last step line (step {last}) was printed around {last_step_ts:%H:%M:%S} and the log went on "
                f"until {end_ts:%H:%M:%S} — {gap:.0f} s, {gap / step_s:.0f}x the usual step time of {step_s:.3g} s — "
                f"without another step: the job hung in step {last + 1}."
            ),
            fields={"gap_s": round(gap, 1), "step_s": round(step_s, 4)},
        )
    ]
