"""One exit-status convention for every command: 0 done, 1 a --fail-on gate or --floors, 2 bad usage, invalid
rules or unreadable input, 130 interrupted; and the output rules every command shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import forensics.pipeline
from forensics.cli import main
from tests.conftest import REPO
from tests.schemas import validate

EXAMPLE = REPO / "examples" / "oom_then_timeout"
HEALTHY = REPO / "tests" / "fixtures" / "runs" / "healthy"
BAD_RULE = "id: Not-Kebab\ntitle: x\nclass: oops\nseverity: error\nlayer: script\nmatch:\n  - regex: '(unclosed'\n"


def _run(*args: str) -> CliRunner:
    return CliRunner().invoke(main, list(args))


def _every_command(run: Path, out: Path) -> list[list[str]]:
    return [
        ["analyze", str(run), "--no-html", "-q"],
        ["check", str(run)],
        ["batch", str(run), "--out", str(out), "-q", "--jobs", "1"],
        ["diff", str(run), str(run), "--no-html", "-q"],
    ]


@pytest.mark.parametrize(
    "command", ["analyze", "check", "batch", "diff", "eval", "patterns list", "patterns lint", "patterns test"]
)
def test_every_command_has_help(command: str):
    result = CliRunner().invoke(main, [*command.split(), "--help"], prog_name="forensics")
    assert result.exit_code == 0 and result.output.startswith(f"Usage: forensics {command} "), result.output


def test_bad_usage_exits_2_for_every_command(tmp_path: Path):
    for args in _every_command(EXAMPLE, tmp_path / "out"):
        result = _run(*args, "--no-such-option")
        assert result.exit_code == 2, (args, result.output)
        missing = _run(args[0], str(tmp_path / "missing"), *args[2:])
        assert missing.exit_code == 2, (args, missing.output)
    assert _run("eval", str(tmp_path)).exit_code == 2, "a corpus folder without manifest.csv"
    assert _run("patterns", "show", "no-such-rule").exit_code == 2


def test_invalid_rules_exit_2_for_every_command(tmp_path: Path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "not-kebab.yaml").write_text(BAD_RULE)
    for args in _every_command(EXAMPLE, tmp_path / "out"):
        result = _run(*args, "--patterns", str(rules))
        assert result.exit_code == 2, (args, result.output)
        assert "invalid rules" in result.output and "Traceback" not in result.output
    assert _run("patterns", "lint", str(rules)).exit_code == 2


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(forensics.pipeline, "_analyse", interrupted)
    analyze, check, _batch, diff = _every_command(EXAMPLE, tmp_path / "out")  # batch: tests/test_batch_interrupt.py
    for args in (analyze, check, diff):
        result = _run(*args)
        assert result.exit_code == 130, (args, result.output)
        assert result.stderr.strip() == "interrupted" and "Traceback" not in result.output


def test_fail_on_gates(tmp_path: Path):
    analyze = ["analyze", str(EXAMPLE), "--no-html", "-q", "--fail-on"]
    assert _run(*analyze, "critical").exit_code == 1
    assert _run(*analyze, "inconclusive").exit_code == 0, "the example has a verdict"
    assert _run(*analyze, "error", "--fail-on", "inconclusive").exit_code == 1, "repeated"
    assert _run(*analyze, "error,inconclusive").exit_code == 1, "comma-separated"
    wrong = _run(*analyze, "fatal")
    assert wrong.exit_code == 2 and "use one of info, warning, error, critical, inconclusive" in wrong.output
    healthy = ["analyze", str(HEALTHY), "--no-html", "-q", "--fail-on"]
    assert _run(*healthy, "warning").exit_code == 0


def test_check_json_is_shaped_like_the_rest_and_gates(tmp_path: Path):
    result = _run("check", str(EXAMPLE), "--json", "-")
    assert result.exit_code == 0
    doc = validate(json.loads(result.stdout))
    assert doc["schema"] == "forensics.check/v1" and doc["run"]["name"] == "oom_then_timeout"
    assert doc["status"] == "failed" and doc["reason"] is None
    statuses = {c["status"] for c in doc["checks"]}
    assert "fail" in statuses and "unknown" in statuses
    assert all(c["value"] is None for c in doc["checks"] if c["status"] == "unknown")
    assert _run("check", str(EXAMPLE), "--fail-on", "fail").exit_code == 1
    assert _run("check", str(EXAMPLE), "--fail-on", "inconclusive").exit_code == 0
    (tmp_path / "empty").mkdir()
    assert _run("check", str(tmp_path / "empty"), "--fail-on", "inconclusive").exit_code == 1
    assert _run("check", str(EXAMPLE), "--fail-on", "error").exit_code == 2, "check's levels are warn and fail"
    written = tmp_path / "checks.json"
    assert _run("check", str(EXAMPLE), "--json", str(written)).exit_code == 0
    assert json.loads(written.read_text(encoding="utf-8")) == doc


def test_two_outputs_to_stdout_are_refused_before_any_work(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(forensics.pipeline, "_analyse", lambda *a: pytest.fail("analysed anyway"))
    result = _run("analyze", str(EXAMPLE), "--no-html", "--json", "-", "--md", "-")
    assert result.exit_code == 2
    assert "--json and --md both write to stdout (-)" in result.output


def test_an_output_that_cannot_be_written_is_a_clean_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _run("analyze", str(EXAMPLE), "--no-html", "-q", "--json", str(blocker / "r.json"))
    assert result.exit_code == 2 and f"cannot write {blocker / 'r.json'}" in result.output
    assert "Traceback" not in result.output
