"""Every captured run under tests/fixtures/runs/ against its expected.yaml: the one runner, with a strict schema.

An expected.yaml says what the analysis of that real run must give. Unknown keys fail (a typo must not turn a
check off), and every key is read here:

- `status`: healthy | degraded | failed, or a list of those that are acceptable. A healthy run raises nothing
  above info.
- `root_cause`: null, or the root cause's `class`, `rule` (one id or a list of acceptable ids), `rank`, `step`,
  `role`, `host`, `fields` (each must equal), `projected_step` (the step a memory leak was heading for an OOM,
  in the root cause's fields) and `evidence` (file and line that must be among its evidence lines).
- `step_tolerance`: the root cause's step may differ from `root_cause.step` by this much (a fault injected
  at a step is found within 10 %, at least 10 steps); without it the step must be exact.
- `rules`: rule id -> at least this many matches; `rules_exact: true`: exactly these and no other rule.
- `symptoms`: class -> the ranks of that symptom. `min_steps`: at least this many steps read.
- `detectors`: rule id -> fields of that finding that must equal (`rank` is the finding's rank).
- `checks`: health-check name -> status. `ray`: the Ray section's dead actors and nodes (and actors by role).
- `fault`: what was injected (`kind`, `step`), for the closing tally of the corpus.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from forensics.model import severity_rank
from forensics.pipeline import analyze
from forensics.report.json_report import to_json_dict
from tests.conftest import FIXTURES

RUNS = sorted(p.parent for p in (FIXTURES / "runs").glob("*/expected.yaml"))
STATUSES = {"healthy", "degraded", "failed", "inconclusive"}
KEYS = {
    "status",
    "reason",
    "root_cause",
    "step_tolerance",
    "rules",
    "rules_exact",
    "symptoms",
    "min_steps",
    "detectors",
    "checks",
    "ray",
    "fault",
}
ROOT_KEYS = {"class", "rule", "rank", "step", "role", "host", "fields", "projected_step", "evidence"}
RAY_KEYS = {"actors", "dead_actors", "dead_nodes"}
FAULT_KEYS = {"kind", "step"}


class SchemaError(ValueError):
    pass


def _unknown(where: str, got: dict, allowed: set[str]) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        raise SchemaError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")


def validate(expected: object, where: str) -> dict:
    """The expected.yaml mapping, or SchemaError naming the first problem."""
    if not isinstance(expected, dict):
        raise SchemaError(f"{where}: must be a mapping")
    _unknown(where, expected, KEYS)
    statuses = expected.get("status")
    statuses = [statuses] if isinstance(statuses, str) else statuses
    if not statuses or not set(statuses) <= STATUSES:
        raise SchemaError(f"{where}: status must be one of {sorted(STATUSES)} or a list of them")
    root = expected.get("root_cause")
    if root is not None:
        if not isinstance(root, dict):
            raise SchemaError(f"{where}: root_cause must be a mapping or null")
        _unknown(f"{where}: root_cause", root, ROOT_KEYS)
        for e in root.get("evidence", []):
            _unknown(f"{where}: root_cause.evidence", e, {"file", "line"})
    if "step_tolerance" in expected and (root is None or "step" not in root):
        raise SchemaError(f"{where}: step_tolerance needs root_cause.step")
    for key in ("rules", "symptoms", "detectors", "checks"):
        if not isinstance(expected.get(key) or {}, dict):
            raise SchemaError(f"{where}: {key} must be a mapping")
    if "ray" in expected:
        _unknown(f"{where}: ray", expected["ray"], RAY_KEYS)
    if "fault" in expected:
        _unknown(f"{where}: fault", expected["fault"], FAULT_KEYS)
    return expected


def load_expected(path: Path) -> dict:
    text = (path / "expected.yaml").read_text(encoding="utf-8")
    return validate(yaml.safe_load(text), f"{path.name}/expected.yaml")


@pytest.fixture(scope="module", params=RUNS, ids=[p.name for p in RUNS])
def run(request) -> tuple[dict, dict]:
    path: Path = request.param
    return load_expected(path), to_json_dict(analyze([path]))


def _statuses(expected: dict) -> list[str]:
    status = expected["status"]
    return [status] if isinstance(status, str) else status


def test_status(run):
    expected, doc = run
    assert doc["verdict"]["status"] in _statuses(expected)
    reason = doc["verdict"]["reason"]
    assert (reason["code"] if reason else None) == expected.get("reason"), "why there is no verdict"


def test_healthy_runs_raise_nothing_above_info(run):
    expected, doc = run
    if _statuses(expected) != ["healthy"]:
        return
    alarms = {f["rule"]: f["severity"] for f in doc["findings"] if severity_rank(f["severity"]) > 0}
    assert not alarms, f"a healthy run raised {alarms}"
    assert doc["verdict"]["root_cause"] is None


def test_root_cause(run):
    expected, doc = run
    want = expected.get("root_cause")
    got = doc["verdict"]["root_cause"]
    if want is None:
        assert got is None or _statuses(expected) != ["healthy"]
        return
    assert got is not None, "no root cause"
    rules = [want["rule"]] if isinstance(want.get("rule"), str) else want.get("rule")
    if rules:
        assert got["rule"] in rules, (got["rule"], rules)
    for key in ("class", "rank", "role", "host"):
        if key in want:
            assert got[key] == want[key], key
    if "step" in want:
        tolerance = expected.get("step_tolerance", 0)
        assert got["step"] is not None and abs(got["step"] - want["step"]) <= tolerance, (got["step"], want["step"])
    for key, value in (want.get("fields") or {}).items():
        assert got["fields"].get(key) == value, key
    if "projected_step" in want:
        assert got["fields"].get("projected_step") == want["projected_step"]
    where = [(e["file"], e["line"]) for e in got["evidence"]]
    for e in want.get("evidence", []):
        assert (e["file"], e["line"]) in where


def test_rules_fired(run):
    expected, doc = run
    fired = Counter()
    for finding in doc["findings"]:
        fired[finding["rule"]] += finding["count"]
    want = expected.get("rules") or {}
    if expected.get("rules_exact"):
        assert dict(fired) == want
    for rule, count in want.items():
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


def test_detector_findings(run):
    expected, doc = run
    by_rule = {f["rule"]: f for f in doc["findings"]}
    for rule, fields in (expected.get("detectors") or {}).items():
        finding = by_rule[rule]
        assert finding["explanation"], rule
        for key, value in fields.items():
            actual = finding["rank"] if key == "rank" else finding["fields"].get(key)
            assert actual == value, (rule, key)


def test_checks(run):
    expected, doc = run
    checks = {c["name"]: c["status"] for c in doc["checks"]}
    for name, status in (expected.get("checks") or {}).items():
        assert checks[name] == status, name


def test_ray_section(run):
    expected, doc = run
    want = expected.get("ray")
    if want is None:
        return
    ray = doc["ray"]
    dead = sorted((a for a in ray["actors"] if a["state"] == "dead"), key=lambda a: a["rank"])
    assert len(dead) == len(want.get("dead_actors", []))
    for wanted, got in zip(sorted(want.get("dead_actors", []), key=lambda a: a["rank"]), dead, strict=True):
        assert {k: got.get(k) for k in wanted} == wanted
        assert got["when"] and got["evidence"]["line"] > 0
    dead_nodes = [n for n in ray["nodes"] if n["state"] == "dead"]
    assert [n["ip"] for n in dead_nodes] == [n["ip"] for n in want.get("dead_nodes", [])]
    for wanted, got in zip(want.get("dead_nodes", []), dead_nodes, strict=True):
        assert ("raylet was terminated" in got["why"]) == wanted["raylet_terminated"]
    if "actors" in want:
        roles: dict[str, list] = {}
        for a in ray["actors"]:
            roles.setdefault(a["role"], []).append(a["rank"])
        assert {k: sorted(v, key=str) for k, v in roles.items()} == want["actors"]


def test_every_expected_file_follows_the_schema():
    for path in RUNS:
        load_expected(path)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"status": "healthy", "rule": {}}, "unknown key(s) ['rule']"),
        ({"status": "fine"}, "status must be one of"),
        ({"status": "failed", "root_cause": {"class": "x", "projected": 3}}, "unknown key(s) ['projected']"),
        ({"status": "failed", "step_tolerance": 10}, "step_tolerance needs root_cause.step"),
    ],
)
def test_schema_rejects_unknown_keys_and_values(doc, problem):
    with pytest.raises(SchemaError, match=re.escape(problem)):
        validate(doc, "x/expected.yaml")
