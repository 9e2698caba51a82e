"""The terminal summary: whole lines when piped, wrapped lines that keep their indentation in a terminal, and the
README's transcript, which is what the bundled example really prints."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from forensics.cli import main
from forensics.report.markdown import render_markdown
from forensics.report.terminal import make_console, print_summary
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "oom_then_timeout"
ELIDED = " [...]"


@pytest.fixture(scope="module")
def doc() -> dict:
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLE), "--no-html", "-q", "--json", "-"])
    return json.loads(result.stdout)


def test_piped_output_is_never_hard_wrapped(doc: dict):
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLE), "--no-html"])  # stdout is not a terminal here
    lines = result.stdout.splitlines()
    explanation = doc["verdict"]["root_cause"]["explanation"]
    assert len(explanation) > 300
    assert f"Why: {explanation}" in lines, "the explanation is one line, whole"
    for remedy in doc["verdict"]["root_cause"]["remediation"][:3]:
        assert f"  • {remedy}" in lines
    assert not make_console().is_terminal and make_console().soft_wrap


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=width, highlight=False, color_system=None), buffer


def test_wrapped_lines_keep_their_indentation_in_a_terminal(doc: dict):
    console, buffer = _terminal(72)
    print_summary(doc, console)
    lines = buffer.getvalue().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 72
    bullets = [i for i, line in enumerate(lines) if line.startswith("  • ")]
    assert len(bullets) == 3
    for i in bullets:
        continuation = lines[i + 1]
        assert continuation.startswith("    ") and continuation[4] != " ", "a bullet's text wraps under its text"
    why = next(i for i, line in enumerate(lines) if line.startswith("Why: "))
    assert lines[why + 1].startswith("     ") and lines[why + 1][5] != " ", "under the text after 'Why: '"
    evidence = next(i for i, line in enumerate(lines) if line.startswith("  driver.log:189"))
    assert lines[evidence + 1].startswith("  ") and lines[evidence + 1][2] != " "


def _transcript() -> tuple[str, list[str]]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ (forensics analyze [^\n]+)\n(.*?)```", readme, re.S)
    assert block, "the README opens with a transcript"
    return block[1], block[2].splitlines()


def test_the_readme_transcript_is_what_the_example_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run the README's command as written, from a folder where `examples/` is the bundled one; each README line is
    the real line, or its beginning when the README cuts it with ` [...]`."""
    command, shown = _transcript()
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, command.split()[1:])
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    hint = "refresh the transcript at the top of README.md from: " + command
    assert len(shown) == len(printed), hint
    for want, got in zip(shown, printed, strict=True):
        if want.endswith(ELIDED):
            assert got.startswith(want.removesuffix(ELIDED)) and len(got) > len(want) - len(ELIDED), (want, hint)
        else:
            assert got == want, hint
    assert (tmp_path / "oom_then_timeout.forensics.html").is_file()


def test_symptoms_on_many_ranks_read_as_ranges(doc: dict):
    """A consequence on 511 of 512 ranks is one short phrase, not 511 numbers."""
    many = json.loads(json.dumps(doc))
    many["verdict"]["symptoms"] = [
        {"class": "nccl_timeout", "ranks": [r for r in range(512) if r != 145], "count": 6164},
        {"class": "cuda_oom", "ranks": [], "count": 1},
    ]
    console, buffer = _terminal(200)
    print_summary(many, console)
    lines = buffer.getvalue().splitlines()
    assert "  then nccl_timeout on ranks 0–511 except 145 (6164 lines)" in lines
    assert "  then cuda_oom (1 line)" in lines


def test_markdown_consequences_read_as_ranges_too(doc: dict):
    many = json.loads(json.dumps(doc))
    many["verdict"]["symptoms"] = [
        {"class": "nccl_timeout", "ranks": [r for r in range(512) if r != 145], "count": 6164},
        {"class": "cuda_oom", "ranks": [], "count": 1},
    ]
    text = render_markdown(many)
    assert "**Consequences:** `nccl_timeout` on ranks 0–511 except 145; `cuda_oom`\n" in text
