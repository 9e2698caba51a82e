"""The run folder is never modified: same files, bytes, mtimes and modes after an analysis, and no new entry.

Permissions alone prove nothing when the tests run as root (CI does), so every test compares the whole
tree's state before and after, on a writable and on a read-only copy.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import main
from tests.conftest import REPO
from tests.hostile import tree_state

FIXTURE_RUNS = sorted(p for p in (REPO / "tests" / "fixtures" / "runs").iterdir() if p.is_dir())
RUNS = [*FIXTURE_RUNS, REPO / "examples" / "oom_then_timeout"]


def _read_only(folder: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    folder.chmod(folder.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(folder: Path) -> None:
    folder.chmod(folder.stat().st_mode | stat.S_IWUSR)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.mark.parametrize("source", RUNS, ids=[p.name for p in RUNS])
def test_analysis_leaves_a_read_only_run_folder_exactly_as_it_was(source, tmp_path):
    run = tmp_path / source.name
    shutil.copytree(source, run, symlinks=True)
    _read_only(run)
    before = tree_state(run)
    out = tmp_path / "out"
    # every output for the bundled example; JSON alone for the fixtures (the HTML is rendered from the same result)
    html = ["-o", str(out / "r.html"), "--md", str(out / "r.md")] if source.parent.name == "examples" else ["--no-html"]
    try:
        result = CliRunner().invoke(main, ["analyze", str(run), "--json", str(out / "r.json"), *html])
        assert result.exit_code == 0, result.output
        assert tree_state(run) == before
    finally:
        _writable(run)
    assert sorted(p.name for p in out.iterdir()) == sorted(["r.json"] + [Path(a).name for a in html[1::2]])


def test_default_report_path_inside_the_run_folder_is_refused(tmp_path, monkeypatch):
    run = tmp_path / "oom_then_timeout"
    shutil.copytree(REPO / "examples" / "oom_then_timeout", run)
    before = tree_state(run)
    monkeypatch.chdir(run)
    for args in (["."], [str(run)], [".", "--json", "result.json", "-o", "../outside.html"], [".", "--md", "x/s.md"]):
        result = CliRunner().invoke(main, ["analyze", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "inside the run folder, which forensics never modifies" in result.output
        assert tree_state(run) == before
    assert not (tmp_path / "outside.html").exists()  # refused before any work, not after
    result = CliRunner().invoke(main, ["analyze", ".", "-o", "../outside.html", "--json", "-", "-q"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "outside.html").is_file()
    assert tree_state(run) == before
