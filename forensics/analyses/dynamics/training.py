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

from forensics.analyses.dynamics.context import (
    MIN_POINTS,
    Context,
    Curve,
    after_warmup,
    detection,
    fmt,
    is_grad_norm,
    is_loss,
    is_value_loss,
    is_watched_for_non_finite,
    matching,
    metric_leaf,
    pick,
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

DIVERGENCE_NOISE_K = 10.0  # a divergence stands this many noise units above where the loss started...
DIVERGENCE_START_FRACTION = 0.25  # ...and a quarter above it...
DIVERGENCE_MIN_STEPS = 5  # ...for this many steps in a row;
DIVERGENCE_EXPLOSION_FACTOR = 2.0  # (a positive loss at three times its start is far above it, whatever its noise)
DIVERGENCE_PROGRESS_FRACTION = 0.5  # or it climbs back, giving back half the progress, to the end
EPISODE_SKIP = 2  # the first steps of a run are not judged (initial loss, first updates)
EPISODE_HORIZON = 30  # steps over which the best level is remembered
EPISODE_NOISE_MARGIN = 1.0  # an episode stands this many noise units above noise's own maximum...
EPISODE_RELATIVE = 0.08  # ...and 8% above the best level so far
OSCILLATION_MIN_EPISODES = 3  # bouncing back up three times or more is an oscillation
REGRESSION_MIN_STEPS = 5  # one long climb back up is a regression
SPIKE_Z = 10.0  # robust z-score of a spike against the preceding window
SPIKE_RATIO = 2.0  # and at least twice the local level
SPIKE_WINDOW = 30  # a shorter window makes the MAD too unsteady for heavy-tailed grad norms
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


# --- numerical failure -------------------------------------------------------------------------


def detect_non_finite(ctx: Context) -> list[Detection]:
    """The first step where a loss, grad norm, KL or entropy became NaN or inf, and whether it recovered."""
    watched = matching(ctx, is_watched_for_non_finite)
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
    primary = next((m for m in at_start if is_loss(m)), at_start[0])
    curve = ctx.curves[primary]
    before = curve.finite()
    before = Curve(primary, before.steps[before.steps < start], before.values[before.steps < start])
    last_step = int(max(int(c.steps[-1]) for c in watched))
    later = last_step - start + 1
    persisted = max(bad_steps) == last_step
    only_grad_norm = all(is_grad_norm(m) for m in first_bad)
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
    """(onset index, last index, how) of a divergence: far above the start, or back up to the end."""
    y = finite.values
    smooth = rolling_median(y, 5)
    start = min(float(np.median(y[:3])), float(y[0]))  # a loss that explodes at once started at y[0]
    noise_margin = DIVERGENCE_NOISE_K * _calm_noise(y)
    if start > 0 and np.mean(y > 0) >= 0.9:  # a positive loss that explodes at once has no calm stretch:
        noise_margin = min(noise_margin, DIVERGENCE_EXPLOSION_FACTOR * start)  # tripling it is enough
    margin = max(noise_margin, DIVERGENCE_START_FRACTION * abs(start))
    runs = [(a, b) for a, b in runs_of(smooth > start + margin) if b - a + 1 >= DIVERGENCE_MIN_STEPS]
    if runs:
        b = runs[-1][1]
        a = int(np.flatnonzero(y[: runs[0][0] + 1] <= start + margin)[-1]) + 1 if y[0] <= start + margin else 0
        a = min(a, runs[0][0])
        peak = int(a + np.argmax(y[a : b + 1]))
        how = (
            f"{finite.metric} started at {fmt(start)} and from step {finite.steps[a]} climbed far above it, to "
            f"{fmt(float(y[peak]))} at step {finite.steps[peak]}"
        )
        if b == len(y) - 1 and finite.steps[-1] < last_logged:
            how += f", until it was no longer a number after step {finite.steps[-1]}."
        elif b == len(y) - 1:
            how += ", and was still there when the log ended."
        else:
            tail = float(np.median(y[b + 1 :]))
            how += f"; after step {finite.steps[b]} it came back down, to {fmt(tail)}"
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
        f"{finite.metric} fell to {fmt(level)} by step {finite.steps[best]}, then from step {finite.steps[onset]} "
        f"climbed back to {fmt(final)} (median of the last {tail} steps)"
    )
    if progress > 0:
        how += f", giving back {rise / progress:.0%} of what it had learnt"
    return onset, len(y) - 1, how + ", and did not come back down."


def detect_divergence(ctx: Context) -> list[Detection]:
    """A loss far above where it started for several steps, or one that climbs back up and stays there."""
    out = []
    for curve in matching(ctx, is_loss):
        finite = curve.finite()
        if len(finite) < MIN_POINTS + 2:
            continue
        found = _divergence(finite, int(curve.steps[-1]))
        if found is None:
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


def _episodes(y: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Stretches where a loss stands well above the best level it had lately reached, and that level.

    The level is the lowest trailing 9-step median of the last EPISODE_HORIZON steps (trailing, so that a
    falling loss does not see its own future; a horizon, so that a long noisy run does not drift to its
    luckiest dip). An episode stands above it by EPISODE_RELATIVE of the level and by more than noise alone
    reaches over the run, (EPISODE_NOISE_MARGIN + sqrt(2 ln n)) sigmas, where sigma is how far the loss
    dips *below* its trend: upward bounces, the mark of overshooting updates, do not inflate it.
    """
    trail = trailing_median(y, 9)
    windows = np.lib.stride_tricks.sliding_window_view(
        np.r_[np.full(EPISODE_HORIZON - 1, np.inf), trail], EPISODE_HORIZON
    )
    best = windows.min(axis=1)
    below = -float(np.percentile(y - rolling_median(y, 9), 15.87))  # one sigma below the trend
    k = EPISODE_NOISE_MARGIN + math.sqrt(2 * math.log(max(len(y), 2)))
    threshold = np.maximum(k * max(below, 0.0), EPISODE_RELATIVE * np.abs(best))
    return runs_of(y - best > threshold), best


def detect_loss_instability(ctx: Context) -> list[Detection]:
    """A positive loss that keeps bouncing back above its best level (oscillation), or climbs back for a while."""
    diverged = {f.fields["metric"] for f in detect_divergence(ctx)}
    out = []
    for curve in matching(ctx, is_loss):
        finite = curve.finite()
        if curve.metric in diverged or is_value_loss(curve.metric) or len(finite) < MIN_POINTS + EPISODE_SKIP:
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


def detect_spikes(ctx: Context) -> list[Detection]:
    """Single-step jumps of a loss or grad norm far above its recent level (robust z-score)."""
    out = []
    for curve in matching(ctx, lambda m: is_loss(m) or is_grad_norm(m)):
        judged = after_warmup(curve)
        if judged is None:
            continue
        spikes = _spike_indices(judged.values)
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
    for curve in matching(ctx, is_grad_norm):
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


# --- RL-specific ---------------------------------------------------------------------------------


def detect_entropy_collapse(ctx: Context) -> list[Detection]:
    """Policy entropy that ends below a tenth of where it started: the policy stopped exploring."""
    curve = pick(ctx, "actor/entropy", "entropy", "policy/entropy_avg")
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
        f"{curve.metric} fell from {fmt(start_level)} to {fmt(end_level)} ({end_level / start_level:.1%} of its "
        f"start); it crossed the half-way mark at step {start}. The policy has become (nearly) deterministic: it "
        "no longer explores, rewards stop improving, and it often precedes reward hacking or repetitive outputs."
    )
    return [
        detection(
            ctx,
            "entropy-collapse",
            curve=curve,
            steps=(start, end),
            explanation=explanation,
            fields={"start": start_level, "end": end_level},
        )
    ]


def detect_kl_blowup(ctx: Context) -> list[Detection]:
    """The policy moving far from the old policy (ppo_kl) or from the reference (kl_loss)."""
    out = []
    for curve in matching(ctx, lambda m: metric_leaf(m) in KL_FLOOR):
        judged = after_warmup(curve)
        if judged is None:
            continue
        y = np.abs(judged.values)
        early = float(np.median(y[: max(3, len(y) // 4)]))
        limit = max(KL_FACTOR * early, KL_FLOOR[metric_leaf(curve.metric)])
        runs = [(a, b) for a, b in runs_of(rolling_median(y, 3) > limit) if b - a + 1 >= KL_MIN_STEPS]
        if not runs:
            continue
        a, b = runs[0][0], runs[-1][1]
        peak = float(np.max(y[a : b + 1]))
        explanation = (
            f"|{curve.metric}| rose above {fmt(limit)} ({KL_FACTOR:.0f}x its early level of {fmt(early)}, or the "
            f"floor of {fmt(KL_FLOOR[metric_leaf(curve.metric)])}) from step {judged.steps[a]}, "
            f"peaking at {fmt(peak)}. "
            + (
                "Each update moves the policy far from the one that generated the rollouts: the PPO ratio is "
                "clipped for most tokens and the update is no longer trustworthy."
                if metric_leaf(curve.metric) == "ppo_kl"
                else "The policy is drifting far from the reference model; the KL penalty no longer holds it."
            )
        )
        out.append(
            detection(
                ctx,
                "kl-blowup",
                curve=curve,
                steps=(int(judged.steps[a]), int(judged.steps[b])),
                explanation=explanation,
                fields={"early": early, "peak": peak, "limit": limit},
            )
        )
    return out


def _sustained_high(ctx: Context, names: tuple[str, ...], limit: float) -> tuple[Curve, Curve, float] | None:
    curve = pick(ctx, *names)
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
    hit = _sustained_high(ctx, ("actor/pg_clipfrac", "policy/clipfrac_avg"), CLIPFRAC_HIGH)
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
    hit = _sustained_high(ctx, ("response_length/clip_ratio",), RESPONSE_CLIP_HIGH)
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


def detect_reward_shift(ctx: Context) -> list[Detection]:
    """A sudden reward collapse, or a sudden reward jump while response length collapses (reward hacking)."""
    reward = pick(ctx, "critic/score/mean", "critic/rewards/mean")
    if reward is None:
        return []
    judged = after_warmup(reward)
    if judged is None:
        return []
    cp = change_point(judged.values)
    if cp is None or cp.strength < REWARD_SHIFT_STRENGTH or not cp.is_step(min_sudden=REWARD_SUDDEN_FRACTION):
        return []
    step = int(judged.steps[cp.index])
    length = pick(ctx, "response_length/mean")
    length_note, length_drop = "", None
    if length is not None:
        lj = after_warmup(length)
        lcp = change_point(lj.values) if lj is not None else None
        near = lcp is not None and abs(int(lj.steps[lcp.index]) - step) <= LENGTH_COLLAPSE_WINDOW
        if near and lcp.shift < 0 and -lcp.relative_shift >= LENGTH_COLLAPSE_FRACTION:
            length_drop = -lcp.relative_shift
            length_note = (
                f" At the same time response_length/mean fell from {fmt(lcp.before)} to {fmt(lcp.after)} "
                f"(-{length_drop:.0%}) at step {lj.steps[lcp.index]}."
            )
    if cp.shift < 0:
        entry = "reward-collapse"
        explanation = (
            f"{reward.metric} dropped from {fmt(cp.before)} to {fmt(cp.after)} at step {step} "
            f"({cp.strength:.0f}x its step-to-step noise) and stayed down.{length_note} A sudden collapse points to a "
            "broken policy (diverged update, corrupted weights after a bad weight sync) or a broken reward function."
        )
    elif length_drop is not None:
        entry = "reward-hacking"
        explanation = (
            f"{reward.metric} jumped from {fmt(cp.before)} to {fmt(cp.after)} at step {step}.{length_note} A "
            "reward that rises suddenly while answers get much shorter usually means the policy found a shortcut "
            "in the reward function (reward hacking) rather than solving the task."
        )
    else:
        return []
    return [
        detection(
            ctx,
            entry,
            curve=reward,
            steps=(step, int(judged.steps[-1])),
            explanation=explanation,
            fields={"before": cp.before, "after": cp.after, **({"length_drop": length_drop} if length_drop else {})},
        )
    ]
