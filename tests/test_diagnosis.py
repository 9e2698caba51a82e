"""Root-cause selection on synthetic findings: the first domino that nothing explains, and what it explains."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from forensics.analyses.diagnosis import diagnose
from forensics.catalogue import Detection
from forensics.model import Evidence, Finding, empty_events
from forensics.pipeline import load_catalogue

CATALOGUE = load_catalogue([])
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _finding(entry: str, second: int | None, rank: int | None = None, line: int = 1) -> Finding:
    """The finding the catalogue makes of entry `entry`, seen at T0 + `second` (None: no time) on `rank`."""
    ts = T0 + timedelta(seconds=second) if second is not None else None
    return CATALOGUE.describe(
        Detection(
            entry,
            rank=rank,
            ts=ts,
            order=(0, line, 0),
            evidence=[Evidence("driver.log", line, f"a line of {entry}")],
        )
    )


def _verdict(*findings: Finding):
    return diagnose(empty_events(), list(findings), [])


def test_no_finding_is_healthy():
    verdict = _verdict()
    assert (verdict.status, verdict.root_cause) == ("healthy", None)


def test_the_oom_explains_the_timeouts_that_follow_it_on_other_ranks():
    oom = _finding("cuda-oom", 10, rank=1)
    timeouts = [_finding("nccl-watchdog-timeout", 600, rank=r, line=50 + r) for r in (0, 2, 3)]
    verdict = _verdict(*timeouts, oom)
    assert verdict.root_cause is oom and verdict.status == "failed"
    assert [(s.cls, s.ranks) for s in verdict.symptoms] == [("nccl_timeout", [0, 2, 3])]
    assert "other finding(s) are its consequences" in verdict.summary


def test_a_cause_is_found_even_when_its_consequence_was_logged_first():
    # the dead actor is printed by the driver before the worker's own OOM line reaches the log
    died = _finding("ray-actor-died", 5)
    oom = _finding("cuda-oom", 9, rank=0)
    verdict = _verdict(died, oom)
    assert verdict.root_cause is oom
    assert [s.cls for s in verdict.symptoms] == ["ray_actor_died"]


def test_an_earlier_independent_failure_wins_over_a_later_one():
    first = _finding("python-import-error", 3, rank=2)
    later = _finding("cuda-oom", 30, rank=0)
    verdict = _verdict(later, first)
    assert verdict.root_cause is first
    assert [c.cls for c in verdict.candidates] == ["cuda_oom"]  # neither explains the other
    assert verdict.confidence < 0.9  # a rival cause lowers it


def test_an_unrecognised_crash_cannot_explain_what_happened_before_it():
    died = _finding("ray-actor-died", 1)
    crash = _finding("unknown-crash", 20)
    verdict = _verdict(died, crash)
    assert verdict.root_cause is died
    assert verdict.symptoms == []


def test_an_unrecognised_crash_before_the_deaths_is_their_cause_with_low_confidence():
    crash = _finding("unknown-crash", 1, rank=0)
    died = _finding("ray-actor-died", 20)
    verdict = _verdict(died, crash)
    assert verdict.root_cause is crash and verdict.confidence == 0.4


def test_a_warning_alone_is_degraded_not_failed():
    bouncing = _finding("loss-oscillation", None)
    verdict = _verdict(bouncing)
    assert (verdict.status, verdict.root_cause.rule) == ("degraded", "loss-oscillation")


def test_an_info_finding_alone_is_healthy():
    verdict = _verdict(_finding("metric-spike", None))
    assert (verdict.status, verdict.root_cause) == ("healthy", None)
    assert "1 informational finding" in verdict.summary


def test_an_error_outranks_an_earlier_warning():
    spikes = _finding("loss-oscillation", 1)
    oom = _finding("cuda-oom", 50, rank=1)
    verdict = _verdict(spikes, oom)
    assert verdict.root_cause is oom and verdict.status == "failed"


def test_findings_without_time_are_ordered_by_their_place_in_the_log():
    a = _finding("nccl-error", None, rank=0, line=40)
    b = _finding("cuda-oom", None, rank=1, line=12)
    assert _verdict(a, b).root_cause is b


def test_a_rankless_root_takes_the_rank_its_class_names_elsewhere():
    summary = _finding("cuda-oom", 5)  # torchrun's re-print, no rank
    ranked = _finding("cuda-oom", 6, rank=3)
    verdict = _verdict(summary, ranked)
    assert verdict.root_cause is summary and verdict.root_cause.rank == 3


def test_a_consequence_standing_alone_is_named_with_less_confidence_than_a_cause():
    """A dead Ray worker or a watchdog timeout is what many failures end in: alone, the root is a stand-in."""
    alone = _verdict(_finding("ray-worker-died", 10, rank=2))
    assert alone.root_cause.rule == "ray-worker-died" and alone.confidence <= 0.6
    timeout = _verdict(_finding("nccl-watchdog-timeout", 10, rank=2))
    assert timeout.confidence <= 0.6
    assert _verdict(_finding("cuda-oom", 10, rank=2)).confidence == 0.9
