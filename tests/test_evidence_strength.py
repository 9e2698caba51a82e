"""Root-cause selection by evidence strength: crash evidence (an exception, a kill, a watchdog) outranks a
finding read from the curves unless the logs link the two; a statistical finding alone gives `degraded`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from forensics.analyses.diagnosis import diagnose
from forensics.catalogue import Detection
from forensics.model import Evidence, empty_events
from forensics.pipeline import load_catalogue

CATALOGUE = load_catalogue([])
T0 = datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)
STATISTICAL = sorted(
    e.id for e in CATALOGUE.entries.values() if e.evidence == "statistical" and e.severity != "info"
)  # information (a spike) is no alarm at all
CRASHES = sorted(e.id for e in CATALOGUE.entries.values() if e.evidence == "direct" and e.severity == "critical")


def _finding(entry: str, step: int, line: int, *, text: str = "", rank: int | None = 0, minutes: int | None = None):
    ts = T0 + timedelta(minutes=minutes) if minutes is not None else None
    evidence = [Evidence("driver.log", line, text or f"line {line}")]
    found = Detection(id=entry, rank=rank, step=step, order=(0, line, 0), evidence=evidence, ts=ts)
    finding = CATALOGUE.describe(found)
    finding.fields.setdefault("metric", "actor/pg_loss")
    return finding


def _verdict(*findings):
    return diagnose(empty_events(), list(findings), [])


def test_the_catalogue_has_both_kinds():
    assert "loss-divergence" in STATISTICAL and "cuda-oom" in CRASHES and len(CRASHES) >= 5


@pytest.mark.parametrize("soft", STATISTICAL)
@pytest.mark.parametrize("crash", CRASHES)
def test_a_critical_crash_is_never_outranked_by_an_earlier_soft_finding_without_a_causal_link(soft, crash):
    soft_finding = _finding(soft, step=5, line=100)
    crash_finding = _finding(crash, step=40, line=900)
    verdict = _verdict(soft_finding, crash_finding)
    linked = soft_finding.cls in crash_finding.symptom_of
    if linked:
        assert verdict.root_cause is soft_finding
        assert "leads to it" in verdict.ranking
    else:
        assert verdict.root_cause is crash_finding, (soft, crash)
        assert verdict.status == "failed"
        assert f"It outranks {soft_finding.title} at step 5" in verdict.ranking
        assert verdict.ranking in verdict.summary


def test_a_cuda_oom_outranks_an_earlier_policy_loss_divergence():
    """The issue's case: a critical CUDA OOM with explicit evidence, and a soft `pg_loss diverged` before it."""
    diverged = _finding("loss-divergence", step=3, line=40)
    oom = _finding("cuda-oom", step=11, line=189, text="torch.OutOfMemoryError: CUDA out of memory.", rank=1)
    verdict = _verdict(diverged, oom)
    assert (verdict.root_cause.rule, verdict.status) == ("cuda-oom", "failed")
    assert "crash evidence outranks a finding read from the curves" in verdict.ranking


def test_a_nan_that_the_crash_names_is_the_cause():
    """NaN loss -> a later error about NaN: the link is shown, so the NaN stays the root cause."""
    nan = _finding("non-finite-metric", step=100, line=110)
    crash = _finding(
        "unknown-crash", step=101, line=123, text="RuntimeError: probability tensor contains either `inf`, `nan`"
    )
    verdict = _verdict(nan, crash)
    assert verdict.root_cause is nan
    assert "leads to it" in verdict.ranking


def test_a_nan_with_an_unrelated_crash_is_outranked():
    nan = _finding("non-finite-metric", step=100, line=110)
    crash = _finding("process-sigkill", step=140, line=300, text="exitcode: -9")
    assert _verdict(nan, crash).root_cause is crash


def test_a_soft_finding_alone_is_degraded_never_failed():
    verdict = _verdict(_finding("loss-divergence", step=6, line=178))
    assert CATALOGUE.entries["loss-divergence"].severity == "error"
    assert (verdict.status, verdict.root_cause.rule) == ("degraded", "loss-divergence")
    assert verdict.confidence < 0.7


def test_confidence_grows_when_other_detectors_saw_the_same_trouble_at_the_same_step():
    alone = _verdict(_finding("kl-blowup", step=100, line=200)).confidence
    together = _verdict(
        _finding("kl-blowup", step=100, line=200),
        _finding("entropy-collapse", step=104, line=208),
        _finding("reward-collapse", step=101, line=202),
    )
    assert together.root_cause.rule == "kl-blowup"
    assert together.confidence > alone
    far = _verdict(_finding("kl-blowup", step=100, line=200), _finding("entropy-collapse", step=300, line=600))
    assert far.confidence == alone


def test_a_later_reading_of_the_curves_does_not_explain_an_earlier_one():
    """reward-collapse lists training_instability in symptom_of; a truncation that began later is not its cause."""
    collapse = _finding("reward-collapse", step=100, line=200)
    truncated = _finding("responses-truncated", step=126, line=252)
    assert _verdict(collapse, truncated).root_cause is collapse


def test_information_alone_is_healthy():
    verdict = _verdict(_finding("metric-spike", step=50, line=120))
    assert (verdict.status, verdict.root_cause) == ("healthy", None)
    assert "1 informational finding" in verdict.summary
