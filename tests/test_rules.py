from __future__ import annotations

from pathlib import Path

import pytest

from forensics.package_data import patterns_dir
from forensics.rules import TAXONOMY, RuleLoadError, load_rules


def _write(tmp_path: Path, name: str, text: str) -> Path:
    area = tmp_path / "custom"
    area.mkdir(exist_ok=True)
    path = area / name
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """\
id: my-rule
title: My rule
class: unknown_crash
severity: error
layer: script
description: test
match:
  - regex: 'boom (?P<what>\\w+)'
examples:
  match: ['boom here']
  no_match: ['calm']
"""


def test_bundled_rules_load_and_only_use_taxonomy_classes():
    rules, errors = load_rules([patterns_dir()], collect=True)
    assert errors == []
    assert rules
    assert {r.cls for r in rules} <= set(TAXONOMY)


def test_overlay_replaces_a_bundled_rule_by_id(tmp_path):
    _write(tmp_path, "cuda-oom.yaml", GOOD.replace("my-rule", "cuda-oom"))
    rules, _ = load_rules([patterns_dir(), tmp_path])
    by_id = {r.id: r for r in rules}
    assert by_id["cuda-oom"].title == "My rule"


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (("severity: error", "severity: fatal"), "severity", "not one of"),
        (("class: unknown_crash", "class: gremlins"), "class", "not in the taxonomy"),
        (("layer: script\n", "layer: script\nlayer: script\n"), "yaml", "duplicate key"),
        (("description: test", "description: test\ncolour: red"), "colour", "unknown key"),
        (("'boom (?P<what>\\w+)'", "'boom (?<=x)y'"), "match", "vectorised engine"),
        (("'boom (?P<what>\\w+)'", "'boom ('"), "match", "bad regex"),
        (("no_match: ['calm']", "no_match: ['boom calm']"), "examples", "no_match example matches"),
    ],
)
def test_invalid_rules_name_file_line_and_key(tmp_path, change, key, message):
    path = _write(tmp_path, "my-rule.yaml", GOOD.replace(*change))
    _, errors = load_rules([tmp_path], collect=True)
    assert errors, "the broken rule was accepted"
    error = errors[0]
    assert error.path.endswith("my-rule.yaml") and error.key == key and message in error.message
    assert error.line >= 1
    with pytest.raises(RuleLoadError):
        load_rules([tmp_path])
    assert path.exists()


def test_lint_collects_every_problem(tmp_path):
    _write(
        tmp_path, "my-rule.yaml", GOOD.replace("severity: error", "severity: bad").replace("layer: script", "layer: x")
    )
    _, errors = load_rules([tmp_path], collect=True)
    assert {e.key for e in errors} == {"severity", "layer"}


def test_file_must_be_named_after_the_id(tmp_path):
    _write(tmp_path, "other.yaml", GOOD)
    _, errors = load_rules([tmp_path], collect=True)
    assert [e.key for e in errors] == ["id"]
