"""Training dynamics: detectors over the metric series (loss, RL signals, memory, throughput, progress).

Each detector is a pure function of a `Context` (the run's curves, built once) that returns `Detection`s;
the catalogue (`patterns/dynamics/`) describes them as findings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from forensics.analyses.dynamics.context import Context, build_context
from forensics.analyses.dynamics.resources import (
    detect_memory_growth,
    detect_slow_rank,
    detect_stall,
    detect_throughput_regression,
)
from forensics.analyses.dynamics.training import (
    detect_clip_fraction,
    detect_divergence,
    detect_entropy_collapse,
    detect_extreme_grad_norm,
    detect_grad_norm_explosion,
    detect_kl_blowup,
    detect_loss_instability,
    detect_non_finite,
    detect_response_clipping,
    detect_reward_collapse,
    detect_reward_hacking,
    detect_spikes,
)
from forensics.catalogue import Catalogue, Detection
from forensics.metric_semantics import Vocabulary
from forensics.model import Finding

NON_FINITE_RULE = "non-finite-loss"  # the text rule that catches the first non-finite step line
NON_FINITE_DETECTIONS = ("non-finite-metric", "non-finite-grad-norm-recovered")

DETECTORS: tuple[Callable[[Context], list[Detection]], ...] = (
    detect_non_finite,
    detect_divergence,
    detect_loss_instability,
    detect_spikes,
    detect_grad_norm_explosion,
    detect_extreme_grad_norm,
    detect_entropy_collapse,
    detect_kl_blowup,
    detect_clip_fraction,
    detect_response_clipping,
    detect_reward_collapse,
    detect_reward_hacking,
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
    vocabulary: Vocabulary | None = None,
) -> tuple[list[Detection], list[str]]:
    """Every detector's detections for one run, and a warning for each detector that failed (it is skipped).

    Which metric each detector judges, and as what, is read from the metric files (`vocabulary`)."""
    ctx = build_context(series, events, step_marks, file_order, environment, config, vocabulary)
    found: list[Detection] = []
    warnings: list[str] = []
    for detector in DETECTORS:
        try:
            found.extend(detector(ctx))
        except (ValueError, IndexError, ArithmeticError, pl.exceptions.PolarsError) as exc:
            warnings.append(f"detector {detector.__name__} skipped: {type(exc).__name__}: {exc}")
    return found, warnings


def dynamics_findings(rule_findings: list[Finding], detections: list[Detection], catalogue: Catalogue) -> list[Finding]:
    """The detectors' findings, described by the catalogue; those the text rules already made are merged into them.

    The `non-finite-loss` rule already caught the first NaN step line; the detector's finding adds the first
    step and metric to it (and whether training recovered) instead of standing beside it. A NaN that follows
    a divergence is where the divergence ended, so it becomes its symptom.
    """
    by_rule = [f for f in rule_findings if f.rule == NON_FINITE_RULE]
    added = []
    for finding in catalogue.describe_all(detections):
        if finding.rule in NON_FINITE_DETECTIONS and by_rule:
            target = min(by_rule, key=Finding.sort_key)
            target.fields.update({k: v for k, v in finding.fields.items() if k != "detector"})
            target.explanation = finding.explanation
            target.step = finding.step
            continue
        added.append(finding)
    _nan_after_divergence([*rule_findings, *added])
    return added


def _nan_after_divergence(findings: list[Finding]) -> None:
    diverged = [f for f in findings if f.rule == "loss-divergence" and f.step is not None]
    nans = (f for f in findings if f.rule in (NON_FINITE_RULE, *NON_FINITE_DETECTIONS) and f.step is not None)
    for nan in nans:
        earlier = [d for d in diverged if d.step < nan.step]
        if earlier:
            first = min(earlier, key=lambda d: d.step)
            nan.symptom_of = (*nan.symptom_of, "training_instability")
            nan.explanation += (
                f" It ends the divergence of {first.fields.get('metric')} that began at step {first.step}."
            )
