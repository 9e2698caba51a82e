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

import math

import numpy as np
import polars as pl

from forensics.analyses.dynamics.context import (
    MIN_POINTS,
    Context,
    Curve,
    after_warmup,
    detection,
    fmt,
    runs_of,
    value_at,
)
from forensics.analyses.dynamics.robust import (
    MAD_TO_SIGMA,
    change_point,
    noise_scale,
    rolling_median,
    rolling_noise,
    trailing_median,
)
from forensics.catalogue import Detection

NON_FINITE_RULE = "non-finite-loss"  # the YAML rule that catches the first non-finite step line
LOSS_KINDS = ("loss", "value_loss")  # minimised: a loss that climbs back up is going the wrong way
POSITIVE_LOSS_FLOOR = 0.1  # a policy loss above this at every step is a cross-entropy under that name

DIVERGENCE_NOISE_K = 10.0  # a divergence stands this many noise units above where the loss started...
DIVERGENCE_START_FRACTION = 0.25  # ...and a quarter above it...
DIVERGENCE_MIN_STEPS = 5  # ...for this many steps in a row;
DIVERGENCE_EXPLOSION_FACTOR = 2.0  # (a positive loss at three times its start is far above it, whatever its noise)
DIVERGENCE_PROGRESS_FRACTION = 0.5  # or it climbs back, giving back half the progress, to the end
EPISODE_SKIP = 2  # the first steps of a run are not judged (initial loss, first updates)
EPISODE_HORIZON = 30  # steps over which the best level is remembered
EPISODE_NOISE_MARGIN = 1.0  # an episode stands this many noise units above noise's own maximum...
EPISODE_RELATIVE = 0.08  # ...and 8% above the best level so far...
EPISODE_MIN_STEPS = 2  # ...for two steps or more (one high step is a batch of long or odd samples)...
EPISODE_SINGLE_STEP_RISE = 0.25  # ...unless that one step stands a quarter above the best level
OSCILLATION_MIN_EPISODES = 3  # bouncing back up three times or more is an oscillation
REGRESSION_MIN_STEPS = 5  # one long climb back up is a regression
SPIKE_Z = {"low": 8.0, "medium": 10.0, "high": 12.0}  # robust z-score against the preceding window, by noise
SPIKE_RATIO = 2.0  # and at least twice the local level
SPIKE_WINDOW = 30  # a shorter window makes the MAD too unsteady for heavy-tailed grad norms
EARLY_EXPLOSION_FACTOR = 2.0  # a positive loss at twice its start in the first fifth of the run...
EXPLOSION_POINTS = 3  # ...at three steps or more
EXPLOSION_FACTOR = 10.0  # grad norm 10x its early level, for EXPLOSION_MIN_STEPS steps in a row
EXPLOSION_MIN_STEPS = 3
EXTREME_GRAD_NORM = 1e5  # a pre-clip grad norm no stable LLM run logs as its typical level (healthy ones: < 1e4)
EXTREME_MIN_SAMPLES = 2
ENTROPY_COLLAPSE_FRACTION = 0.1  # entropy ends below 10% of where it started...
ENTROPY_SUDDEN_FACTOR = 0.5  # (a change point that halves it at once is a sudden fall)
ENTROPY_REWARD_WINDOW = 10  # ...and the reward at the end is no better than over these steps before the fall
ENTROPY_REWARD_GAIN_NOISE = 3.0  # (by more than this many noise units)
KL_FACTOR = 10.0  # a KL this many times its recent history...
KL_HISTORY_MIN = 10  # (the median of the 10 steps before, or a tenth of the run)
KL_FLOOR = {"ppo_kl": 0.05, "kl": 0.5}  # ...and above this floor
KL_MIN_STEPS = 3
CLIPFRAC_HIGH = 0.2
RESPONSE_CLIP_HIGH = 0.2
REWARD_SHIFT_STRENGTH = 6.0  # noise units
REWARD_HORIZON = 30  # a reward collapse falls from the best level of the last 30 steps...
REWARD_MIN_HISTORY = 10  # (judged from the 10th step on)
REWARD_AFTER = 5  # ...and the next 5 steps stand below it (and most of the next 10)...
REWARD_LASTING = 10
REWARD_DROP_NOISE = 6.0  # ...by 6 noise units...
REWARD_DROP_FRACTION = 0.5  # ...and by half the range the reward had covered (or half its level)
REWARD_SUDDEN_FRACTION = 0.5  # half the shift happens within three steps of the change point
LENGTH_COLLAPSE_FRACTION = 0.3
LENGTH_COLLAPSE_WINDOW = 3  # steps between the reward jump and the length drop


# --- numerical failure -------------------------------------------------------------------------


def detect_non_finite(ctx: Context) -> list[Detection]:
    """The first step where a loss, grad norm, KL or entropy became NaN or inf, and whether it recovered."""
    watched = ctx.judged("non-finite")
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
    primary = next((m for m in at_start if ctx.kind_of(m) in (*LOSS_KINDS, "policy_loss")), at_start[0])
    curve = ctx.curves[primary]
    before = curve.finite()
    before = Curve(primary, before.steps[before.steps < start], before.values[before.steps < start])
    last_step = int(max(int(c.steps[-1]) for c in watched))
    later = last_step - start + 1
    persisted = max(bad_steps) == last_step
    only_grad_norm = all(ctx.kind_of(m) == "grad_norm" for m in first_bad)
    entry = "non-finite-grad-norm-recovered" if only_grad_norm and not persisted else "non-finite-metric"
    prior = f" (last finite value {fmt(before.values[-1])} at step {before.steps[-1]})" if len(before) else ""
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
    explanation = f"{primary} was {fmt(value_at(curve, start))} at step {start}{prior}{also}. {outcome}"
    return [
        detection(
            ctx,
            entry,
            curve=curve,
            steps=(start, max(bad_steps)),
            explanation=explanation,
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


def _divergence(finite: Curve, last_logged: int) -> tuple[int, int, str] | None:
    """(onset index, last index, how) of a divergence: far above the start to the end of the log, or back up
    for good, giving back much of what had been learnt.

    An excursion above the start that comes back down (a warm-up bump, a bad stretch the run recovered
    from) is not a divergence: the run went on learning; the episode detector judges it.
    """
    y = finite.values
    smooth = rolling_median(y, 5)
    start = min(float(np.median(y[:3])), float(y[0]))  # a loss that explodes at once started at y[0]
    noise_margin = DIVERGENCE_NOISE_K * _calm_noise(y)
    if start > 0 and np.mean(y > 0) >= 0.9:  # a positive loss that explodes at once has no calm stretch:
        noise_margin = min(noise_margin, DIVERGENCE_EXPLOSION_FACTOR * start)  # tripling it is enough
    margin = max(noise_margin, DIVERGENCE_START_FRACTION * abs(start))
    runs = [(a, b) for a, b in runs_of(smooth > start + margin) if b - a + 1 >= DIVERGENCE_MIN_STEPS]
    if runs and runs[-1][1] == len(y) - 1:  # still far above its start when the log ends
        first, b = runs[-1]
        below = np.flatnonzero(y[: first + 1] <= start + margin)
        a = min(int(below[-1]) + 1 if len(below) else 0, first)
        peak = int(a + np.argmax(y[a : b + 1]))
        how = (
            f"{finite.metric} started at {fmt(start)} and from step {finite.steps[a]} climbed far above it, to "
            f"{fmt(float(y[peak]))} at step {finite.steps[peak]}"
        )
        if finite.steps[-1] < last_logged:
            how += f", until it was no longer a number after step {finite.steps[-1]}."
        else:
            how += ", and was still there when the log ended."
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
    onset = _left_edge(y, onset, level, half)
    how = (
        f"{finite.metric} fell to {fmt(level)} by step {finite.steps[best]}, then from step {finite.steps[onset]} "
        f"climbed back to {fmt(final)} (median of the last {tail} steps)"
    )
    if progress > 0:
        how += f", giving back {rise / progress:.0%} of what it had learnt"
    return onset, len(y) - 1, how + ", and did not come back down."


def _left_edge(y: np.ndarray, onset: int, level: float, half: float) -> int:
    """The first step of the climb that crossed `half` at `onset`: the smoothed curve lags a sudden jump."""
    quarter = level + (half - level) / 2
    i = onset
    while i > 0 and y[i - 1] > quarter:
        i -= 1
    return i


def _loss_like(ctx: Context, curve: Curve) -> bool:
    """A loss judged for divergence and oscillation: minimised losses, and a policy loss that is one in disguise.

    A PPO/GRPO policy loss is a surrogate that crosses zero (advantages are centred) and is not minimised in
    that sense, even when it is mostly positive (longer answers weigh more in a token mean). A cross-entropy
    never reaches zero: a "policy loss" that stays above POSITIVE_LOSS_FLOOR at every step is an SFT or LM
    loss logged under that name, and is judged as one.
    """
    kind = ctx.kind_of(curve.metric)
    if kind == "policy_loss":
        finite = curve.finite().values
        return len(finite) > 0 and float(np.min(finite)) > POSITIVE_LOSS_FLOOR
    return kind in LOSS_KINDS


def _early_explosion(finite: Curve) -> tuple[int, int, float] | None:
    """(first, last index, peak) of a positive loss that doubled its start in the first steps, then recovered.

    A warm-up bump moves a loss by tens of percent; a loss at twice where it started (for at least
    EXPLOSION_POINTS steps of the first stretch) is a learning rate too high from the start.
    """
    y = finite.values
    if len(y) < MIN_POINTS + 2 or np.mean(y > 0) < 0.9:
        return None
    start = float(np.median(y[:3]))
    head = y[: max(MIN_POINTS, len(y) // 5)]
    high = np.flatnonzero(head >= EARLY_EXPLOSION_FACTOR * start)
    if start <= 0 or len(high) < EXPLOSION_POINTS:
        return None
    return int(high[0]), int(high[-1]), float(np.max(head))


def detect_divergence(ctx: Context) -> list[Detection]:
    """A loss far above where it started to the end of the log, or one that climbs back up and stays there;
    a positive loss that doubled in its first steps and recovered is a regression, not a divergence."""
    out = []
    for curve in [*ctx.judged("divergence"), *ctx.judged("policy-loss")]:
        if not _loss_like(ctx, curve):
            continue
        finite = curve.finite()
        if len(finite) < MIN_POINTS + 2:
            continue
        found = _divergence(finite, int(curve.steps[-1]))
        if found is None:
            early = _early_explosion(finite) if ctx.kind_of(curve.metric) != "value_loss" else None
            if early is not None:
                out.append(_explosion_detection(ctx, curve, finite, *early))
            continue
        onset, last, how = found
        start = int(finite.steps[onset])
        out.append(
            detection(
                ctx,
                "loss-divergence",
                curve=curve,
                steps=(start, int(finite.steps[last])),
                explanation=how,
            )
        )
    return out


def _explosion_detection(ctx: Context, curve: Curve, finite: Curve, first: int, last: int, peak: float) -> Detection:
    start = float(np.median(finite.values[:3]))
    return detection(
        ctx,
        "loss-regression",
        curve=curve,
        steps=(int(finite.steps[first]), int(finite.steps[last])),
        explanation=(
            f"{curve.metric} started at {fmt(start)} and rose to {fmt(peak)} ({peak / start:.1f}x) by step "
            f"{finite.steps[first]}, within the first steps, before it came back down: the first updates "
            "overshot, as with a learning rate too high from the start (or too short a warm-up)."
        ),
        fields={"length": last - first + 1, "max_rise": round(peak / start - 1, 3)},
    )


def _episodes(y: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Stretches where a loss stands well above the best level it had lately reached, and that level.

    The level is the lowest trailing 9-step median of the last EPISODE_HORIZON steps (trailing, so that a
    falling loss does not see its own future; a horizon, so that a long noisy run does not drift to its
    luckiest dip). An episode stands above it by EPISODE_RELATIVE of the level and by more than noise alone
    reaches over the run, (EPISODE_NOISE_MARGIN + sqrt(2 ln n)) sigmas, where sigma is how far the loss
    dips *below* its trend: upward bounces, the mark of overshooting updates, do not inflate it. A single
    high step is an episode only when it stands EPISODE_SINGLE_STEP_RISE above the level: variable lengths and
    odd batches make smaller ones in healthy runs. Nothing counts before the loss has first fallen below its
    start: a warm-up bump loses no progress.
    """
    trail = trailing_median(y, 9)
    windows = np.lib.stride_tricks.sliding_window_view(
        np.r_[np.full(EPISODE_HORIZON - 1, np.inf), trail], EPISODE_HORIZON
    )
    best = windows.min(axis=1)
    below = -float(np.percentile(y - rolling_median(y, 9), 15.87))  # one sigma below the trend
    k = EPISODE_NOISE_MARGIN + math.sqrt(2 * math.log(max(len(y), 2)))
    threshold = np.maximum(k * max(below, 0.0), EPISODE_RELATIVE * np.abs(best))
    rise = (y - best) / np.maximum(np.abs(best), 1e-12)
    start = float(np.median(y[:3]))
    learnt = best < start - EPISODE_RELATIVE * abs(start)  # before it has learnt anything there is nothing to lose
    runs = runs_of((y - best > threshold) & learnt)
    kept = [(a, b) for a, b in runs if b - a + 1 >= EPISODE_MIN_STEPS or rise[a] >= EPISODE_SINGLE_STEP_RISE]
    return kept, best


def detect_loss_instability(ctx: Context) -> list[Detection]:
    """A positive loss that keeps bouncing back above its best level (oscillation), or climbs back for a while."""
    diverged = {f.fields["metric"] for f in detect_divergence(ctx)}
    out = []
    loss_like_policy = [c for c in ctx.judged("policy-loss") if _loss_like(ctx, c)]
    for curve in [*ctx.judged("oscillation"), *loss_like_policy]:
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
        inside = [i for a, b in episodes for i in range(a, b + 1)]
        worst = max(inside, key=lambda i: (y[i] - best[i]) / abs(best[i]) if best[i] else 0.0)
        rise = (y[worst] - best[worst]) / abs(best[worst]) if best[worst] else float("inf")
        first, last = int(judged.steps[episodes[0][0]]), int(judged.steps[episodes[-1][1]])
        spans = [[int(judged.steps[a]), int(judged.steps[b])] for a, b in episodes]
        if len(episodes) >= OSCILLATION_MIN_EPISODES:
            entry = "loss-oscillation"
            explanation = (
                f"{curve.metric} jumped back above the best level it had reached {len(episodes)} times between "
                f"steps {first} and {last}, by up to {rise:.0%} (step {judged.steps[worst]}), instead of settling: "
                "the updates overshoot, typically a learning rate at the edge of stability."
            )
        else:
            entry = "loss-regression"
            explanation = (
                f"{curve.metric} climbed back above the best level it had reached ({fmt(float(best[episodes[0][0]]))})"
                f" from step {first} to step {last}, by up to {rise:.0%} at step {judged.steps[worst]}: an update "
                "overshot and training spent those steps recovering."
            )
        out.append(
            detection(
                ctx,
                entry,
                curve=curve,
                steps=(first, last),
                explanation=explanation,
                fields={"episodes": len(episodes), "length": length, "spans": spans[:50], "max_rise": round(rise, 3)},
            )
        )
    return out


def _spike_indices(y: np.ndarray, z: float) -> list[tuple[int, float, float]]:
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
    hits = (excursion / scale >= z) & (excursion >= (SPIKE_RATIO - 1) * np.abs(level))
    hits &= following < level + excursion / 2
    return [(int(j + SPIKE_WINDOW), float(excursion[j] / scale[j]), float(level[j])) for j in np.flatnonzero(hits)]


def detect_spikes(ctx: Context) -> list[Detection]:
    """Single-step jumps of a loss or grad norm far above its recent level (robust z-score)."""
    out = []
    for curve in ctx.judged("spike"):
        judged = after_warmup(curve)
        if judged is None:
            continue
        spikes = _spike_indices(judged.values, SPIKE_Z[ctx.vocabulary.spec(curve.metric).noise])
        if not spikes:
            continue
        steps = [int(judged.steps[i]) for i, _, _ in spikes]
        worst = max(spikes, key=lambda s: s[1])
        worst_step = int(judged.steps[worst[0]])
        explanation = (
            f"{curve.metric} jumped to {fmt(float(judged.values[worst[0]]))} at step {worst_step}, "
            f"{worst[1]:.0f} robust sigmas above its level of {fmt(worst[2])} over the {SPIKE_WINDOW} steps "
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
            detection(
                ctx,
                "metric-spike",
                curve=curve,
                steps=(steps[0], steps[-1]),
                explanation=explanation,
                fields={"spike_steps": steps[:50], "spans": [[s, s] for s in steps[:50]], "max_z": round(worst[1], 1)},
            )
        )
    return out


def detect_grad_norm_explosion(ctx: Context) -> list[Detection]:
    """A gradient norm that stays an order of magnitude above its early level for several steps."""
    out = []
    for curve in ctx.judged("grad-explosion"):
        judged = after_warmup(curve)
        if judged is None:
            continue
        y = judged.values
        early = float(np.median(y[: max(3, len(y) // 4)]))
        if early <= 0:
            continue
        high = rolling_median(y, 3) > EXPLOSION_FACTOR * early
        runs = runs_of(high)
        runs = [(a, b) for a, b in runs if b - a + 1 >= EXPLOSION_MIN_STEPS]
        if not runs:
            continue
        a, b = runs[0]
        to_end = runs[-1][1] == len(y) - 1
        peak = float(np.max(y[a : b + 1]))
        explanation = (
            f"{curve.metric} stayed above {EXPLOSION_FACTOR:.0f}x its early level of {fmt(early)} from step "
            f"{judged.steps[a]} to step {judged.steps[b]} (peak {fmt(peak)}, {peak / early:.0f}x)"
            + (" and was still there when the log ended." if to_end else ".")
            + " Clipping hides exploding gradients in the loss, so this is often the first sign of divergence."
        )
        out.append(
            detection(
                ctx,
                "grad-norm-explosion" if to_end else "grad-norm-surge",
                curve=curve,
                steps=(int(judged.steps[a]), int(judged.steps[runs[-1][1]])),
                explanation=explanation,
                fields={"early": early, "peak": peak},
            )
        )
    return out


def detect_extreme_grad_norm(ctx: Context) -> list[Detection]:
    """A gradient norm whose typical (median) level is itself extreme, however few steps were logged: a run
    that diverged before its log began or from its first steps, which a comparison with the early level misses."""
    out = []
    for curve in ctx.judged("grad-explosion"):
        finite = curve.finite()
        if len(finite) < EXTREME_MIN_SAMPLES:
            continue
        level = float(np.sort(finite.values)[(len(finite) - 1) // 2])  # the lower median: one spike is not a level
        if level < EXTREME_GRAD_NORM:
            continue
        peak = float(np.max(finite.values))
        explanation = (
            f"{curve.metric} was {fmt(level)} at the median of its {len(finite)} logged steps "
            f"(steps {finite.steps[0]} to {finite.steps[-1]}, peak {fmt(peak)}): stable runs log gradient norms "
            f"below about 1e4 before clipping. The updates are dominated by a few huge gradients (a learning rate "
            f"far too high, fp16 overflow, or extreme advantages/rewards), even where the loss still looks normal."
        )
        out.append(
            detection(
                ctx,
                "grad-norm-extreme",
                curve=curve,
                steps=(int(finite.steps[0]), int(finite.steps[-1])),
                explanation=explanation,
                fields={"median": level, "peak": peak},
            )
        )
    return out


# --- RL-specific ---------------------------------------------------------------------------------


def _entropy_drop(finite: Curve) -> tuple[int, str] | None:
    """(onset index, how) of a collapse of entropy: a sudden fall (a change point of log-entropy that is a
    step), or else the half-way point of the fall in log space."""
    log_y = np.log(np.maximum(finite.values, 1e-9))
    cp = change_point(log_y, min_size=max(3, len(log_y) // 20))
    if cp is not None and cp.shift < 0 and cp.is_step() and math.exp(cp.shift) <= ENTROPY_SUDDEN_FACTOR:
        onset = _drop_start(log_y, cp.index)
        return onset, f"it fell {math.exp(-cp.shift):.0f}x within a few steps from step {finite.steps[onset]}"
    start, end = float(np.median(log_y[:3])), float(np.median(log_y[-max(3, len(log_y) // 5) :]))
    crossed = np.flatnonzero(rolling_median(log_y, 3) < (start + end) / 2)
    if not len(crossed):
        return None
    return int(crossed[0]), f"it crossed the half-way mark (in log scale) at step {finite.steps[crossed[0]]}"


def _drop_start(log_y: np.ndarray, index: int) -> int:
    """The first point of the fall that a change point put at `index` (the split lies mid-fall): back from
    it while the curve is already clearly below the level of the ENTROPY_REWARD_WINDOW points before."""
    level = float(np.median(log_y[max(0, index - ENTROPY_REWARD_WINDOW) : index]))
    below = level - 3 * max(noise_scale(log_y[max(0, index - ENTROPY_REWARD_WINDOW) : index]), 0.05)
    i = index
    while i > 0 and log_y[i - 1] < below:
        i -= 1
    return i


def _reward_after(ctx: Context, step: int) -> tuple[str, float, float, float] | None:
    """(metric, level just before `step`, level at the end, noise) of the run's reward, when it logged one."""
    reward = ctx.first("reward-collapse", ("reward",))
    if reward is None:
        return None
    r = reward.finite()
    before = r.values[(r.steps < step) & (r.steps >= step - ENTROPY_REWARD_WINDOW)]
    after = r.values[r.steps >= step]
    if len(before) < 3 or len(after) < 3:
        return None
    end = float(np.median(after[-max(3, len(after) // 3) :]))
    return reward.metric, float(np.median(before)), end, max(noise_scale(r.values), 1e-12)


def detect_entropy_collapse(ctx: Context) -> list[Detection]:
    """Policy entropy gone (below a tenth of where it started) while the reward stalls or falls.

    Entropy falling while the reward rises is learning: the policy grows sure of what works. A collapse is
    exploration gone without the reward to show for it: after the fall the reward does not improve on the
    level it had when entropy fell (GRPO's advantages vanish once every sample of a group is the same).
    """
    curve = ctx.first("entropy-collapse", ("entropy",))
    if curve is None:
        return []
    finite = curve.finite()
    if len(finite) < MIN_POINTS + 2:
        return []
    y = finite.values
    start_level = float(np.median(y[:3]))
    end_level = float(np.median(y[-max(3, len(y) // 5) :]))
    if start_level <= 0 or end_level >= ENTROPY_COLLAPSE_FRACTION * start_level:
        return []
    drop = _entropy_drop(finite)
    if drop is None:
        return []
    onset, how = drop
    start = int(finite.steps[onset])
    reward = _reward_after(ctx, start)
    if reward is not None:
        name, before, end, noise = reward
        if end > before + ENTROPY_REWARD_GAIN_NOISE * noise:
            return []  # the reward kept improving after entropy fell: learning, not collapse
        reward_note = (
            f" {name} did not improve after it: {fmt(before)} over the {ENTROPY_REWARD_WINDOW} steps before, "
            f"{fmt(end)} at the end."
        )
    else:
        reward_note = " No reward was logged to tell whether the policy was still learning."
    explanation = (
        f"{curve.metric} fell from {fmt(start_level)} to {fmt(end_level)} ({end_level / start_level:.1%} of its "
        f"start); {how}.{reward_note} The policy has become (nearly) deterministic: it no longer explores, and "
        "GRPO/PPO advantages vanish once every sample of a group is the same."
    )
    return [
        detection(
            ctx,
            "entropy-collapse",
            curve=curve,
            steps=(start, int(finite.steps[-1])),
            explanation=explanation,
            fields={"start": start_level, "end": end_level},
        )
    ]


def _history_level(y: np.ndarray, window: int) -> np.ndarray:
    """For each point, the median of the `window` points before it (its recent history); inf before 3 points."""
    level = np.full(len(y), np.inf)
    if len(y) > 1:  # point i's history is the trailing window that ends at point i - 1
        trailing = pl.Series(y[:-1]).rolling_median(window_size=window, min_samples=3)
        level[1:] = trailing.fill_null(np.inf).to_numpy()
    return level


def detect_kl_blowup(ctx: Context) -> list[Detection]:
    """A KL that jumps an order of magnitude above its own recent history and stays there.

    KL to the reference grows as the policy learns (normal up to a bound), so it is judged against its own
    recent past, not its first steps; when the KL coefficient changed at that step, the finding says so.
    """
    out = []
    for curve in ctx.judged("kl-blowup", ("kl", "ppo_kl")):
        judged = after_warmup(curve)
        if judged is None:
            continue
        y = np.abs(judged.values)
        window = max(KL_HISTORY_MIN, len(y) // 10)
        history = _history_level(y, window)
        floor = KL_FLOOR[ctx.kind_of(curve.metric)]
        limit = np.maximum(KL_FACTOR * history, floor)
        high = rolling_median(y, 3) > limit
        runs = [(a, b) for a, b in runs_of(high) if b - a + 1 >= KL_MIN_STEPS]
        if not runs:
            continue
        a, b = runs[0]
        peak = float(np.max(y[a : b + 1]))
        step = int(judged.steps[a])
        explanation = (
            f"|{curve.metric}| jumped from a recent level of {fmt(float(history[a]))} to {fmt(float(y[a]))} at step "
            f"{step} ({float(y[a]) / max(float(history[a]), 1e-12):.0f}x; the limit is {KL_FACTOR:.0f}x its recent "
            f"level and at least {fmt(floor)}) for {b - a + 1} steps, peaking at {fmt(peak)}. "
            + (
                "Each update moves the policy far from the one that generated the rollouts: the PPO ratio is "
                "clipped for most tokens and the update is no longer trustworthy."
                if ctx.kind_of(curve.metric) == "ppo_kl"
                else "The policy is drifting far from the reference model; the KL penalty no longer holds it."
            )
            + _coefficient_change(ctx, step)
        )
        out.append(
            detection(
                ctx,
                "kl-blowup",
                curve=curve,
                steps=(step, int(judged.steps[b])),
                explanation=explanation,
                fields={"history": float(history[a]), "peak": peak, "limit": float(limit[a])},
            )
        )
    return out


def _coefficient_change(ctx: Context, step: int) -> str:
    """A note when the KL coefficient changed near `step` (a resumed run with another config, a schedule)."""
    for curve in (ctx.curves[m] for m in sorted(ctx.curves) if ctx.kind_of(m) == "kl_coef"):
        before = curve.values[curve.steps < step - 1]
        after = curve.values[curve.steps >= step - 1]
        if len(before) and len(after) and float(before[-1]) != float(after[0]):
            return f" {curve.metric} changed from {fmt(float(before[-1]))} to {fmt(float(after[0]))} at that step."
    return ""


def _sustained_high(ctx: Context, detector: str, limit: float) -> tuple[Curve, Curve, float] | None:
    curve = ctx.first(detector)
    if curve is None:
        return None
    judged = after_warmup(curve)
    if judged is None:
        return None
    half = judged.after(int(judged.steps[len(judged) // 2 - 1]))
    level = float(np.median(half.values))
    return (curve, judged, level) if level > limit else None


def detect_clip_fraction(ctx: Context) -> list[Detection]:
    """More than a fifth of the tokens clipped by PPO for most of the run."""
    hit = _sustained_high(ctx, "clip-fraction", CLIPFRAC_HIGH)
    if hit is None:
        return []
    curve, judged, level = hit
    above = np.flatnonzero(judged.values > CLIPFRAC_HIGH)
    return [
        detection(
            ctx,
            "clip-fraction-high",
            curve=curve,
            steps=(int(judged.steps[above[0]]), int(judged.steps[-1])),
            explanation=(
                f"{curve.metric} has a median of {level:.2f} over the second half of the run (above "
                f"{CLIPFRAC_HIGH:.0%}): for that share of tokens the update is cut off by the PPO clip, so each "
                "step moves the policy too far from the one that generated the rollouts."
            ),
            fields={"median_second_half": level},
        )
    ]


def detect_response_clipping(ctx: Context) -> list[Detection]:
    """Responses that hit max_response_length: truncated answers are scored as wrong or unparsable."""
    hit = _sustained_high(ctx, "response-truncation", RESPONSE_CLIP_HIGH)
    if hit is None:
        return []
    curve, judged, level = hit
    above = np.flatnonzero(judged.values > RESPONSE_CLIP_HIGH)
    limit = ctx.config.get("data.max_response_length")
    limit_text = f" (data.max_response_length={limit})" if limit is not None else ""
    return [
        detection(
            ctx,
            "responses-truncated",
            curve=curve,
            steps=(int(judged.steps[above[0]]), int(judged.steps[-1])),
            explanation=(
                f"A median of {level:.0%} of responses per step were cut at the maximum length{limit_text} over "
                "the second half of the run. Truncated answers get no final answer to score, which biases rewards "
                "and pushes length in whichever direction the reward prefers."
            ),
            fields={"median_second_half": level},
        )
    ]


def _reward_drop(y: np.ndarray) -> tuple[int, float, float, float] | None:
    """(onset index, level before, level after, noise) of a sudden, lasting fall of a reward.

    The level before is the best trailing 9-step median of the last REWARD_HORIZON steps (a reward that
    rises sets a new level); after a drop the next REWARD_AFTER steps must stay below it by
    REWARD_DROP_NOISE noise units and by REWARD_DROP_FRACTION of the range the reward had covered, and
    most of the REWARD_LASTING steps after it too (a policy may later learn to game a broken reward).
    """
    ahead = REWARD_AFTER
    starts = np.arange(REWARD_MIN_HISTORY, len(y) - ahead + 1)
    if not len(starts):
        return None
    noise = max(noise_scale(y), 1e-12)
    trail = trailing_median(y, 9)
    best = pl.Series(trail).rolling_max(window_size=REWARD_HORIZON, min_samples=1).to_numpy()[starts - 1]
    seen = (np.maximum.accumulate(trail) - np.minimum.accumulate(trail))[starts - 1]
    drop = best - np.median(np.lib.stride_tricks.sliding_window_view(y, ahead), axis=1)[starts]
    sharp = (drop >= REWARD_DROP_NOISE * noise) & (drop >= REWARD_DROP_FRACTION * np.maximum(seen, np.abs(best)))
    for k in np.flatnonzero(sharp):
        i, halfway = int(starts[k]), float(best[k] - drop[k] / 2)
        if float(np.median(y[i : i + REWARD_LASTING])) > halfway:  # it came back at once: a dip
            continue
        onset = i + int(np.flatnonzero(y[i : i + ahead] < halfway)[0])
        return onset, float(best[k]), float(np.median(y[onset:])), noise
    return None


def detect_reward_collapse(ctx: Context) -> list[Detection]:
    """A sudden, lasting fall of the reward from the level it had reached."""
    reward = ctx.first("reward-collapse", ("reward",))
    if reward is None:
        return []
    finite = reward.finite()
    if len(finite) < REWARD_MIN_HISTORY + REWARD_AFTER:
        return []
    found = _reward_drop(finite.values)
    if found is None:
        return []
    onset, before, after, noise = found
    step = int(finite.steps[onset])
    explanation = (
        f"{reward.metric} fell from the {fmt(before)} it had reached to {fmt(after)} (median from then on) at "
        f"step {step}, {(before - after) / noise:.0f}x its step-to-step noise. A sudden "
        "collapse points to a broken policy (a diverged update, corrupted weights after a bad weight sync) or "
        "a broken reward function (a parser or format change)."
    )
    return [
        detection(
            ctx,
            "reward-collapse",
            curve=reward,
            steps=(step, int(finite.steps[-1])),
            explanation=explanation,
            fields={"before": before, "after": after},
        )
    ]


def detect_reward_hacking(ctx: Context) -> list[Detection]:
    """A sudden reward jump while response length collapses: a shortcut in the reward."""
    reward = ctx.first("reward-collapse", ("reward",))
    if reward is None:
        return []
    judged = after_warmup(reward)
    if judged is None:
        return []
    cp = change_point(judged.values)
    if cp is None or cp.shift <= 0 or cp.strength < REWARD_SHIFT_STRENGTH:
        return []
    if not cp.is_step(min_sudden=REWARD_SUDDEN_FRACTION):
        return []
    step = int(judged.steps[cp.index])
    length = ctx.first("length-collapse", ("length",))
    lj = after_warmup(length) if length is not None else None
    lcp = change_point(lj.values) if lj is not None else None
    if lcp is None or abs(int(lj.steps[lcp.index]) - step) > LENGTH_COLLAPSE_WINDOW:
        return []
    if lcp.shift >= 0 or -lcp.relative_shift < LENGTH_COLLAPSE_FRACTION:
        return []
    length_drop = -lcp.relative_shift
    explanation = (
        f"{reward.metric} jumped from {fmt(cp.before)} to {fmt(cp.after)} at step {step}. At the same time "
        f"{length.metric} fell from {fmt(lcp.before)} to {fmt(lcp.after)} (-{length_drop:.0%}) at step "
        f"{lj.steps[lcp.index]}. A reward that rises suddenly while answers get much shorter usually means the "
        "policy found a shortcut in the reward function (reward hacking) rather than solving the task."
    )
    return [
        detection(
            ctx,
            "reward-hacking",
            curve=reward,
            steps=(step, int(judged.steps[-1])),
            explanation=explanation,
            fields={"before": cp.before, "after": cp.after, "length_drop": length_drop},
        )
    ]
