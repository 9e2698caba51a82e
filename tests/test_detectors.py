"""Detectors on small synthetic curves: each failure shape fires once, at the right step; healthy
shapes (warm-up bumps, RL noise, slow trends) fire nothing. Real captured runs are in test_dynamics_runs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl
import pytest

from forensics.analyses.dynamics import detect, dynamics_findings
from forensics.catalogue import Detection
from forensics.model import SERIES_SCHEMA, Evidence, Finding, empty_events
from forensics.pipeline import load_catalogue

CATALOGUE = load_catalogue([])

STEPS = 80


def _series(curves: dict[str, np.ndarray], rank: int | None = None) -> pl.DataFrame:
    rows = {k: [] for k in SERIES_SCHEMA}
    for metric, values in curves.items():
        for step, value in enumerate(values, start=1):
            rows["ts"].append(None)
            rows["step"].append(step)
            rows["rank"].append(rank)
            rows["source"].append("verl_console")
            rows["metric"].append(metric)
            rows["value"].append(float(value))
    return pl.DataFrame(rows, schema=SERIES_SCHEMA)


def _marks(n: int = STEPS) -> list[tuple[str, int, int]]:
    return [("driver.log", 10 + 2 * step, step) for step in range(1, n + 1)]


def _detections(curves, **kwargs) -> list[Detection]:
    found, warnings = detect(_series(curves), empty_events(), _marks(), {"driver.log": 0}, **kwargs)
    assert warnings == []
    return found


def _run(curves, **kwargs) -> list[Finding]:
    return CATALOGUE.describe_all(_detections(curves, **kwargs))


def _describe(series: pl.DataFrame, events: pl.DataFrame, marks: list[tuple[str, int, int]]) -> list[Finding]:
    found, warnings = detect(series, events, marks, {"driver.log": 0})
    assert warnings == []
    return CATALOGUE.describe_all(found)


def _healthy_rl(seed: int) -> dict[str, np.ndarray]:
    """A healthy GRPO-like run: noisy zero-centred pg_loss, heavy-tailed grad norm, slow trends, warm-up."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, STEPS + 1)
    throughput = 3000 + rng.normal(0, 120, STEPS)
    throughput[:2] = [1200, 2400]  # compile and cache warm-up
    return {
        "actor/pg_loss": rng.normal(0, 0.01, STEPS),
        "actor/grad_norm": 0.3 * rng.lognormal(0, 0.35, STEPS),
        "actor/entropy": 0.9 - 0.4 * t / STEPS + rng.normal(0, 0.02, STEPS),
        "actor/ppo_kl": np.abs(rng.normal(2e-4, 1e-4, STEPS)),
        "actor/kl_loss": 0.001 + 0.02 * t / STEPS + np.abs(rng.normal(0, 0.002, STEPS)),
        "actor/pg_clipfrac": np.abs(rng.normal(0.003, 0.002, STEPS)),
        "critic/score/mean": np.clip(0.1 + 0.5 * t / STEPS + rng.normal(0, 0.05, STEPS), 0, 1),
        "response_length/mean": 600 + 3 * t + rng.normal(0, 40, STEPS),
        "response_length/clip_ratio": np.abs(rng.normal(0.02, 0.01, STEPS)),
        "perf/throughput": throughput,
        "timing_s/step": 48 * 3000 / throughput,
        "perf/max_memory_allocated_gb": np.r_[18.0, 24.0, 24.5 + np.abs(rng.normal(0, 0.2, STEPS - 2))],
    }


def _healthy_lm(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)
    return {
        "actor/pg_loss": 1.8 + 5.1 * np.exp(-t / 8) + rng.normal(0, 0.03, STEPS),
        "actor/grad_norm": 0.5 + 2.0 * np.exp(-t / 5) + np.abs(rng.normal(0, 0.05, STEPS)),
        "actor/entropy": 1.5 + 5.4 * np.exp(-t / 8) + rng.normal(0, 0.03, STEPS),
    }


@pytest.mark.parametrize("seed", range(8))
def test_healthy_runs_raise_nothing(seed):
    assert _run(_healthy_rl(seed)) == []
    assert _run(_healthy_lm(seed)) == []


def test_nan_gives_first_step_metric_and_that_it_never_recovered():
    curves = _healthy_lm(0)
    curves["actor/pg_loss"][29:] = np.nan
    curves["actor/grad_norm"][29:] = np.nan
    (finding,) = _run(curves)
    assert (finding.rule, finding.severity, finding.step) == ("non-finite-metric", "error", 30)
    assert finding.fields["metric"] == "actor/pg_loss"
    assert finding.fields["metrics"] == ["actor/grad_norm", "actor/pg_loss"]
    assert finding.fields["steps"] == [30, 80] and finding.fields["recovered"] is False
    assert finding.evidence[0] == Evidence("driver.log", 70, "step:30 - … - actor/pg_loss:nan - …")
    assert "stayed non-finite" in finding.explanation


def test_one_skipped_inf_grad_norm_that_recovers_is_only_a_warning():
    curves = _healthy_lm(1)
    curves["actor/grad_norm"][40] = np.inf
    (finding,) = _run(curves)
    assert (finding.severity, finding.step, finding.fields["recovered"]) == ("warning", 41, True)


def test_detector_nan_folds_into_the_rule_finding():
    curves = _healthy_lm(0)
    curves["actor/pg_loss"][29:] = np.nan
    rule = Finding(
        "non-finite-loss",
        "training_instability",
        "NaN",
        "error",
        "framework",
        0,
        None,
        None,
        None,
        False,
        (0, 70, 5),
        3,
        [Evidence("driver.log", 70, "step:30 - actor/pg_loss:nan")],
    )
    assert dynamics_findings([rule], _detections(curves), CATALOGUE) == []
    assert rule.fields["metric"] == "actor/pg_loss" and rule.step == 30 and "step 30" in rule.explanation


def test_divergence_names_the_step_the_loss_turned():
    curves = _healthy_lm(2)
    t = np.arange(STEPS)
    rise = np.clip((t - 34) / 6, 0, 1) * 5.5  # from step 35 the loss climbs back to ~7.3
    curves["actor/pg_loss"] = curves["actor/pg_loss"] + rise
    found = [f for f in _run(curves) if f.rule == "loss-divergence"]
    assert len(found) == 1
    assert 36 <= found[0].step <= 40 and found[0].fields["steps"][1] == 80
    assert found[0].severity == "error" and found[0].cls == "training_instability"


def test_single_spike_is_information_at_its_step():
    """Healthy runs have isolated spikes (a batch of outliers): the finding is there, but it is no alarm."""
    curves = _healthy_rl(3)
    curves["actor/grad_norm"][49] = 12.0
    found = [f for f in _run(curves) if f.rule == "metric-spike"]
    assert [(f.fields["metric"], f.step, f.severity) for f in found] == [("actor/grad_norm", 50, "info")]
    assert found[0].fields["spans"] == [[50, 50]]


def test_grad_norm_explosion_to_the_end_is_an_error():
    curves = _healthy_rl(4)
    curves["actor/grad_norm"][60:] *= 40
    found = [f for f in _run(curves) if f.rule == "grad-norm-explosion"]
    assert [(f.step, f.severity) for f in found] == [(61, "error")]


def test_a_grad_norm_extreme_from_the_first_logged_step_is_an_error():
    """No early level to compare with: the run's typical grad norm is itself far beyond any stable run's."""
    curves = _healthy_rl(4)
    curves["actor/grad_norm"] = curves["actor/grad_norm"] * 1e6
    found = [f for f in _run(curves) if f.rule == "grad-norm-extreme"]
    assert [(f.fields["metric"], f.step, f.severity) for f in found] == [("actor/grad_norm", 1, "error")]
    assert not [f for f in _run(curves) if f.rule == "grad-norm-explosion"]


def test_a_grad_norm_that_explodes_half_way_is_an_explosion_not_an_extreme_level():
    curves = _healthy_rl(4)
    curves["actor/grad_norm"][40:] *= 1e6  # the lower median is still the healthy level of the first half
    found = _run(curves)
    assert not [f for f in found if f.rule == "grad-norm-extreme"]
    assert [f.step for f in found if f.rule == "grad-norm-explosion"] == [41]


def test_entropy_collapse_while_the_reward_stalls():
    curves = _healthy_rl(5)
    curves["actor/entropy"][45:] = 0.01
    curves["critic/score/mean"][45:] = curves["critic/score/mean"][40:45].mean()  # no more exploration to learn from
    found = [f for f in _run(curves) if f.rule == "entropy-collapse"]
    assert [(f.step, f.fields["steps"]) for f in found] == [(46, [46, 80])]
    assert "did not improve after it" in found[0].explanation


def test_entropy_falling_while_the_reward_rises_is_learning():
    """GRPO-style RL whose reward rose 15x while entropy fell steadily to 5% of its start: no finding."""
    curves = _healthy_rl(5)
    t = np.arange(1, STEPS + 1)
    curves["actor/entropy"] = 2.0 * np.exp(-3 * t / STEPS)
    curves["critic/score/mean"] = 0.04 + 0.56 * t / STEPS + np.random.default_rng(5).normal(0, 0.02, STEPS)
    assert [f for f in _run(curves) if f.rule == "entropy-collapse"] == []


def test_kl_blowup_names_the_metric_and_step():
    curves = _healthy_rl(6)
    curves["actor/ppo_kl"][55:] = 0.3
    found = [f for f in _run(curves) if f.rule == "kl-blowup"]
    assert [(f.fields["metric"], f.step) for f in found] == [("actor/ppo_kl", 56)]


def test_clip_fraction_and_truncated_responses():
    curves = _healthy_rl(7)
    curves["actor/pg_clipfrac"] = np.full(STEPS, 0.35)
    curves["response_length/clip_ratio"] = np.full(STEPS, 0.5)
    rules = {f.rule for f in _run(curves, config={"data.max_response_length": 1024})}
    assert rules == {"clip-fraction-high", "responses-truncated"}


def test_reward_collapse_and_reward_hacking():
    curves = _healthy_rl(8)
    curves["critic/score/mean"][50:] = 0.0
    (collapse,) = [f for f in _run(curves) if f.cls == "training_instability"]
    assert (collapse.rule, collapse.step) == ("reward-collapse", 51)

    curves = _healthy_rl(8)
    curves["critic/score/mean"][50:] += 0.35
    curves["response_length/mean"][50:] *= 0.3
    (hack,) = _run(curves)
    assert (hack.rule, hack.step) == ("reward-hacking", 51)
    assert hack.fields["length_drop"] > 0.5


def test_gradual_reward_growth_is_not_a_jump():
    curves = _healthy_rl(9)
    curves["critic/score/mean"] = np.linspace(0.05, 0.9, STEPS)
    curves["response_length/mean"] = np.linspace(900, 300, STEPS)
    assert _run(curves) == []


def test_memory_leak_projects_the_oom_step():
    curves = _healthy_rl(10)
    curves["perf/max_memory_allocated_gb"] = 10.0 + 6.0 * np.arange(STEPS) / 4  # 1.5 GiB per step
    (leak,) = _run(curves, environment={"gpu_memory_total_mib": 143771})
    capacity = 143771 / 1024
    assert (leak.rule, leak.cls, leak.severity) == ("memory-growth", "cuda_oom", "warning")
    assert leak.fields["growth_gib_per_step"] == pytest.approx(1.5)
    assert leak.fields["projected_step"] == 80 + int(
        np.ceil((capacity - curves["perf/max_memory_allocated_gb"][-1]) / 1.5)
    )
    assert f"step {leak.fields['projected_step']}" in leak.explanation


def test_warm_up_memory_plateau_is_not_a_leak():
    curves = _healthy_rl(11)
    curves["perf/max_memory_allocated_gb"] = np.minimum(10 + 4 * np.arange(STEPS), 30.0)
    assert _run(curves, environment={"gpu_memory_total_mib": 81920}) == []


def test_throughput_regression_with_its_step():
    curves = _healthy_rl(12)
    curves["perf/throughput"][39:] *= 0.5
    curves["timing_s/step"][39:] *= 2
    (drop,) = _run(curves)
    assert (drop.rule, drop.cls, drop.step, drop.severity) == ("throughput-regression", "straggler", 40, "warning")
    assert drop.fields["drop"] == pytest.approx(0.5, abs=0.05)


def test_slow_rank_from_per_rank_step_times():
    rng = np.random.default_rng(13)
    frames = []
    for rank in range(4):
        base = 1.3 if rank == 2 else 1.0
        frames.append(_series({"timing_s/step": base + rng.normal(0, 0.02, STEPS)}, rank=rank))
    found = _describe(pl.concat(frames), empty_events(), _marks())
    assert [(f.rule, f.rank) for f in found] == [("slow-rank", 2)]


def _stamped(rows: list[tuple[str, int, datetime]]) -> pl.DataFrame:
    """Events that carry their own timestamp, with nothing else filled in."""
    frame = pl.DataFrame({"file": [r[0] for r in rows], "line": [r[1] for r in rows], "ts": [r[2] for r in rows]})
    return frame.with_columns(pl.lit(False).alias("ts_inferred")).select(
        pl.col(c).cast(t) if c in frame.columns or c == "ts_inferred" else pl.lit(None, dtype=t).alias(c)
        for c, t in empty_events().schema.items()
    )


def test_stall_when_the_log_goes_on_without_steps():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [("driver.log", 9 + 2 * step, start + timedelta(seconds=30 * step)) for step in range(1, 21)]
    rows.append(("driver.log", 500, start + timedelta(seconds=30 * 20 + 1800)))
    found = _describe(_series({"timing_s/step": np.full(20, 30.0)}), _stamped(rows), _marks(20))
    (stall,) = [f for f in found if f.rule == "training-stall"]
    assert (stall.cls, stall.step, stall.fields["gap_s"]) == ("hang", 20, 1800.0)
    assert "step 21" in stall.explanation


def test_no_stall_when_steps_run_to_the_end_of_the_log():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [("driver.log", 9 + 2 * step, start + timedelta(seconds=30 * step)) for step in range(1, 21)]
    rows.append(("driver.log", 500, start + timedelta(seconds=30 * 21)))
    found = _describe(_series({"timing_s/step": np.full(20, 30.0)}), _stamped(rows), _marks(20))
    assert found == []


def test_loss_that_keeps_jumping_back_up_oscillates():
    curves = _healthy_lm(14)
    for step in range(30, 55, 5):  # the loss shoots up by ~40% every 5 steps, then comes back
        curves["actor/pg_loss"][step - 1] *= 1.4
    (osc,) = _run(curves)
    assert (osc.rule, osc.severity, osc.step, osc.fields["episodes"]) == ("loss-oscillation", "warning", 30, 5)
    assert osc.fields["spans"] == [[s, s] for s in range(30, 55, 5)]


def test_loss_that_climbs_back_for_a_while_is_a_regression():
    curves = _healthy_lm(15)
    curves["actor/pg_loss"][39:49] += 1.2  # ten steps about 80% above the level it had reached
    (reg,) = _run(curves)
    assert (reg.rule, reg.step, reg.fields["steps"]) == ("loss-regression", 40, [40, 49])


@pytest.mark.parametrize("seed", range(3))
def test_noisy_but_healthy_losses_do_not_oscillate(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    steps = np.arange(n)
    curves = {
        "train/loss": 1.5 + 3 * np.exp(-steps / 500) + rng.normal(0, 0.15, n),  # small-batch SFT: 5-10% noise
        "critic/vf_loss": 0.5 * rng.lognormal(0, 0.3, n),  # a critic's loss: multiplicative noise
    }
    series = _series(curves)
    assert _describe(series, empty_events(), _marks(n)) == []


def test_a_warm_up_bump_that_ends_below_the_start_raises_nothing():
    """The issue's shape: 11.1 -> 16 -> 9.4 over the first 60 steps of warm-up, then learning as usual."""
    rng = np.random.default_rng(21)
    n = 300
    t = np.arange(n)
    warm = np.interp(t, [0, 25, 60], [11.1, 16.0, 9.4])
    loss = np.where(t < 60, warm, 9.4 * np.exp(-(t - 60) / 200) + 2.0 * (1 - np.exp(-(t - 60) / 200)))
    loss = loss + rng.normal(0, 0.05, n)
    found = _describe(
        _series({"train/loss": loss, "train/lr": np.minimum(1.0, (t + 1) / 60) * 3e-4}), empty_events(), _marks(n)
    )
    assert found == []


def test_a_critic_loss_that_grows_with_the_returns_is_not_judged():
    """PPO's value loss follows the scale of the returns: as the reward grows, so does it."""
    curves = _healthy_rl(22)
    curves["critic/vf_loss"] = (
        0.05 * (1 + 9 * np.arange(STEPS) / STEPS) * np.random.default_rng(22).lognormal(0, 0.2, STEPS)
    )
    assert _run(curves) == []


def test_memory_that_grows_with_the_response_length_is_the_workload_not_a_leak():
    curves = _healthy_rl(23)
    t = np.arange(STEPS)
    curves["response_length/mean"] = 600 + 20 * t + np.random.default_rng(23).normal(0, 30, STEPS)
    curves["perf/max_memory_allocated_gb"] = 20 + 0.01 * curves["response_length/mean"]
    assert _run(curves, environment={"gpu_memory_total_mib": 81920}) == []
    curves["response_length/mean"] = np.full(STEPS, 900.0)  # the same growth at a constant length is a leak
    assert [f.rule for f in _run(curves, environment={"gpu_memory_total_mib": 81920})] == ["memory-growth"]
