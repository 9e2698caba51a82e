"""The catalogue describes every finding code can emit, and `--patterns` can change any of them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.catalogue import Catalogue, Detection, MissingEntryError, fill
from forensics.cli import main
from forensics.pipeline import load_catalogue
from forensics.rules import RuleLoadError, load_rules

PACKAGE = Path(__file__).resolve().parents[1] / "forensics"
FIXTURES = Path(__file__).parent / "fixtures" / "runs"


def _emitted_ids() -> set[str]:
    """Every finding id written in the code: the entry given to `detection(ctx, ID, …)` or `Detection(id=ID)`,
    and both arms of `A if … else B`."""
    found: set[str] = set()

    def literals(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return literals(node.body) + literals(node.orelse)
        return []

    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("detection", "_detection"):
                found.update(literals(node.args[1] if node.func.id == "detection" else node.args[0]))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Detection":
                for kw in node.keywords:
                    if kw.arg == "id":
                        found.update(literals(kw.value))
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("entry", "RULE_ID") for t in node.targets):
                found.update(literals(node.value))
    return found


def test_every_finding_code_emits_has_a_catalogue_entry_and_every_detector_entry_is_emitted():
    catalogue = load_catalogue([])
    emitted = _emitted_ids()
    detector_entries = {e.id for e in catalogue.entries.values() if e.is_detector}
    assert emitted - set(catalogue.entries) == set()
    assert detector_entries - emitted == set(), "catalogue entries no code emits"
    assert len(detector_entries) >= 20


def test_patterns_list_shows_detector_findings():
    result = CliRunner().invoke(main, ["patterns", "list"])
    assert result.exit_code == 0
    rows = {line.split()[0]: line for line in result.output.splitlines()}
    assert "detector:loss-divergence" in rows["loss-divergence"]
    assert "detector:trace-straggler" in rows["trace-straggler"]
    assert "detector:fr-rank-never-joined" in rows["fr-rank-never-joined"]
    assert " match " in rows["cuda-oom"]


def test_a_detection_is_described_by_its_entry_with_its_fields_filled_in():
    catalogue = load_catalogue([])
    finding = catalogue.describe(Detection("loss-divergence", fields={"metric": "train/loss", "steps": [17, 60]}))
    assert (finding.title, finding.cls, finding.severity) == ("train/loss diverged", "training_instability", "error")
    assert any("before step 17" in r for r in finding.remediation)
    with pytest.raises(MissingEntryError, match="no catalogue entry for finding 'no-such-finding'"):
        catalogue.describe(Detection("no-such-finding"))


def test_fill_leaves_unknown_placeholders_as_written():
    assert fill("{metric} diverged at {steps[0]}", {"metric": "loss", "steps": [3]}) == "loss diverged at 3"
    assert fill("{metric} diverged at {step}", {"metric": "loss"}) == "loss diverged at {step}"
    assert fill("{steps[4]}", {"steps": [1]}) == "{steps[4]}"


OVERRIDE = """\
id: loss-divergence
title: 'Our loss {metric} ran away'
class: training_instability
severity: warning
layer: script
description: Our team treats a divergence as a warning.
detector: loss-divergence
remediation: ['Page the on-call trainer before step {steps[0]}.']
"""


def test_patterns_overlay_changes_a_detector_finding(tmp_path):
    folder = tmp_path / "ours" / "dynamics"
    folder.mkdir(parents=True)
    (folder / "loss-divergence.yaml").write_text(OVERRIDE)
    args = ["analyze", str(FIXTURES / "lr_divergence"), "--no-html", "--json", "-", "-q"]
    result = CliRunner().invoke(main, [*args, "--patterns", str(tmp_path / "ours")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    root = doc["verdict"]["root_cause"]
    assert (root["rule"], root["title"], doc["verdict"]["status"]) == (
        "loss-divergence",
        "Our loss actor/pg_loss ran away",
        "degraded",
    )
    assert root["remediation"] == ["Page the on-call trainer before step 6."]


def test_a_detector_entry_may_not_carry_match_or_examples(tmp_path):
    (tmp_path / "loss-divergence.yaml").write_text(OVERRIDE + "match:\n  - regex: 'x'\n")
    _, errors = load_rules([tmp_path], collect=True)
    assert [(e.key, e.message) for e in errors] == [
        ("detector", "an entry is one of match, detector, exception; this one has match and detector")
    ]
    (tmp_path / "loss-divergence.yaml").write_text(OVERRIDE + "examples: {match: [x]}\nextract: {a: '(?P<a>x)'}\n")
    _, errors = load_rules([tmp_path], collect=True)
    assert {e.key for e in errors} == {"examples", "extract"}
    assert all("`detector:` replaces `match:`" in e.message for e in errors)


def test_a_bad_placeholder_is_a_load_error(tmp_path):
    (tmp_path / "loss-divergence.yaml").write_text(OVERRIDE.replace("{metric}", "{metric"))
    with pytest.raises(RuleLoadError, match="title: bad placeholder"):
        load_rules([tmp_path])


def test_detectors_only_loading_skips_text_rules():
    entries, _ = load_rules([PACKAGE.parent / "patterns"], detectors_only=True)
    assert entries and all(e.is_detector for e in entries)
    assert Catalogue(entries).rules == []
