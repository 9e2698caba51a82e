"""Every captured run under tests/fixtures/runs/ against its expected.yaml (Sigma-style regression).

A failing run must fire at least the listed rules with at least the listed counts and name the listed root
cause, rank and evidence line; a healthy run must fire no rule at all.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from forensics.pipeline import analyze
from forensics.report.json_report import to_json_dict
from tests.conftest import FIXTURES

RUNS = sorted(p.parent for p in (FIXTURES / "runs").glob("*/expected.yaml"))


@pytest.fixture(scope="module", params=RUNS, ids=[p.name for p in RUNS])
def run(request) -> tuple[dict, dict]:
    path: Path = request.param
    expected = yaml.safe_load((path / "expected.yaml").read_text(encoding="utf-8"))
    return expected, to_json_dict(analyze([path]))


def test_status(run):
    expected, doc = run
    assert doc["verdict"]["status"] == expected["status"]
    reason = doc["verdict"]["reason"]
    assert (reason["code"] if reason else None) == expected.get("reason"), "why there is no verdict"


def test_root_cause_class_rank_and_evidence(run):
    expected, doc = run
    want = expected.get("root_cause")
    got = doc["verdict"]["root_cause"]
    if want is None:
        assert got is None
        return
    assert got is not None
    for key in ("class", "rule", "rank", "step"):
        if key in want:
            assert got[key] == want[key], key
    where = [(e["file"], e["line"]) for e in got["evidence"]]
    for e in want.get("evidence", []):
        assert (e["file"], e["line"]) in where


def test_rules_fired(run):
    expected, doc = run
    fired = Counter()
    for finding in doc["findings"]:
        fired[finding["rule"]] += finding["count"]
    if expected["status"] == "healthy":
        assert not fired, f"a healthy run fired {dict(fired)}"
    for rule, count in (expected.get("rules") or {}).items():
        assert fired[rule] >= count, f"{rule}: fired {fired[rule]}, expected at least {count}"


def test_symptoms(run):
    expected, doc = run
    got = {s["class"]: s["ranks"] for s in doc["verdict"]["symptoms"]}
    for cls, ranks in (expected.get("symptoms") or {}).items():
        assert got.get(cls) == ranks, cls


def test_steps(run):
    expected, doc = run
    if "min_steps" in expected:
        assert doc["run"]["steps"] >= expected["min_steps"]
