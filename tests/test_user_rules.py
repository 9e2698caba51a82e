"""User rules (`--patterns DIR`) are untrusted too: a bad one is a clean `Error:` (exit 2), a slow one a warning."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from forensics.cli import main
from tests.hostile import OOM_LINE

RULE = """\
id: {id}
title: Our job reported a failed step
class: unknown_crash
severity: error
layer: script
description: A step of our own pipeline failed.
match:
  - regex: '{regex}'
examples:
  match: ['{match}']
  no_match: ['all good']
"""


def _rules(tmp_path, text: str, name: str = "job-step-failed.yaml"):
    folder = tmp_path / "rules" / "ours"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return folder.parent


def _run(tmp_path, lines: list[str]):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "driver.log").write_text("\n".join(lines) + "\n")
    return run


def _analyze(run, rules):
    return CliRunner().invoke(main, ["analyze", str(run), "--patterns", str(rules), "--no-html", "--json", "-", "-q"])


def test_invalid_rules_are_a_clean_error_naming_file_line_key_and_rule(tmp_path):
    bad = RULE.format(id="job-step-failed", regex="(unclosed", match="x").replace("unknown_crash", "oops")
    result = _analyze(_run(tmp_path, ["x"]), _rules(tmp_path, bad))
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)  # no traceback: click printed the message and exited
    assert result.output.startswith("Error: invalid rules:\n")
    assert "ours/job-step-failed.yaml:3: class: 'oops' is not in the taxonomy" in result.output
    assert "ours/job-step-failed.yaml:7: match: bad regex '(unclosed'" in result.output
    assert "(rule job-step-failed)" in result.output


def test_unparsable_and_undecodable_rule_files_are_clean_errors(tmp_path):
    cases = [("id: [unclosed\n", "ours/job-step-failed.yaml:2: yaml: "), (b"\xff\xfe\x00", "cannot read")]
    for text, expected in cases:
        result = _analyze(_run(tmp_path, ["x"]), _rules(tmp_path, text))
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        assert expected in result.output


def test_an_example_that_backtracks_forever_is_a_load_error_not_a_hang(tmp_path):
    rule = RULE.format(id="job-step-failed", regex="(a|aa)+$", match="a" * 60 + "!")
    result = _analyze(_run(tmp_path, ["x"]), _rules(tmp_path, rule))
    assert result.exit_code == 2
    assert "the regex backtracks catastrophically" in result.output and "(rule job-step-failed)" in result.output


def test_a_catastrophic_regex_on_a_long_line_is_switched_off_with_a_warning(tmp_path):
    """Rust's engine (the prefilter) is linear; Python's `regex`, which confirms hits, is not.

    `(a+)+$` itself is defused by `regex`'s own guards, so the rule uses `(a|aa)+$`, which is not: on
    60 a's it would take minutes. Its alternative `job step failed` makes the long line a hit in Rust.
    """
    rule = RULE.format(id="job-step-failed", regex="(a|aa)+$|job step failed", match="job step failed at 3")
    lines = ["start", "a" * 60 + "! job step failed", OOM_LINE, "a" * 80 + "! job step failed again"]
    result = _analyze(_run(tmp_path, lines), _rules(tmp_path, rule))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["warnings"] == [
        "rule job-step-failed (ours/job-step-failed.yaml): its regex timed out (over 1 s) on driver.log:2; "
        "it was switched off for the rest of this analysis"
    ]
    assert [(f["rule"], f["evidence"][0]["line"]) for f in doc["findings"]] == [("cuda-oom", 3)]


def test_the_same_rule_without_the_long_line_fires(tmp_path):
    rule = RULE.format(id="job-step-failed", regex="(a|aa)+$|job step failed", match="job step failed at 3")
    result = _analyze(_run(tmp_path, ["start", "job step failed at step 3"]), _rules(tmp_path, rule))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["warnings"] == []
    assert [(f["rule"], f["evidence"][0]["line"]) for f in doc["findings"]] == [("job-step-failed", 2)]


def test_patterns_commands_give_the_same_clean_error(tmp_path):
    rules = _rules(tmp_path, textwrap.dedent("id: x\nunknown: 1\n"), name="x.yaml")
    for args in (["patterns", "list", "--patterns", str(rules)], ["patterns", "test", "--patterns", str(rules)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), args
        assert "ours/x.yaml:2: unknown: unknown key" in result.output
