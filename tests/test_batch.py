"""`forensics batch`: what a run is, the fleet table, per-run reports, the cache, error rows, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from forensics.batch import BatchError, find_runs, run_batch
from forensics.cli import main
from forensics.fleet import FLEET_FILE, INDEX_FILE
from forensics.pipeline import analyze

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diff"
OOM = FIXTURES / "ray_memory_monitor"
HEALTHY = FIXTURES / "ray_healthy"


def _variant(source: Path, target: Path, replacements: dict[str, str]) -> Path:
    """A copy of a captured run as another job would have logged it (other pid, other address)."""
    shutil.copytree(source, target)
    log = target / "driver.log"
    text = log.read_text(encoding="utf-8")
    for old, new in replacements.items():
        text = text.replace(old, new)
    log.write_text(text, encoding="utf-8")
    return target


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A folder of runs: the OOM capture, the same OOM in another job, and the healthy capture."""
    root = tmp_path / "fleet"
    root.mkdir()
    shutil.copytree(OOM, root / "job-oom-1")
    _variant(OOM, root / "job-oom-2", {"pid=900": "pid=4242", "192.0.2.2": "192.0.2.77"})
    shutil.copytree(HEALTHY, root / "job-ok")
    return root


def test_what_a_run_is(tmp_path: Path):
    fleet = tmp_path / "fleet"
    (fleet / "flat").mkdir(parents=True)
    (fleet / "flat" / "driver.log").write_text("x\n")
    (fleet / "torchrun-only" / "torchrun_logs" / "attempt_0" / "0").mkdir(parents=True)
    (fleet / "torchrun-only" / "torchrun_logs" / "attempt_0" / "0" / "stdout.log").write_text("x\n")
    (fleet / ".trash").mkdir()
    (fleet / "README.md").write_text("weekly runs\n")
    single = tmp_path / "single.log"
    single.write_text("x\n")

    runs = {s.run for s in find_runs([str(fleet)])}
    assert runs == {"flat", "torchrun-only"}, "a folder of folders (and a README) holds runs, hidden ones skipped"
    assert [s.run for s in find_runs([str(fleet / "flat")])] == ["flat"], "a folder with files is one run"
    assert [s.run for s in find_runs([str(fleet)], paths_are_runs=True)] == ["fleet"]
    assert [Path(s.path).name for s in find_runs([str(tmp_path / "*.log")])] == ["single.log"]
    specs = find_runs([str(fleet), str(fleet / "flat")])
    assert len(specs) == 2 and len({s.slug for s in specs}) == 2, "the same run given twice is one run"
    assert {s.run for s in find_runs([str(fleet)], out=fleet / "report")} == runs, "--out inside the fleet is no run"


def test_bad_paths_and_an_output_inside_a_run_are_refused(tmp_path: Path, fleet: Path):
    with pytest.raises(BatchError, match="no such file"):
        find_runs([str(tmp_path / "missing")])
    with pytest.raises(BatchError, match="no file or folder matches"):
        find_runs([str(tmp_path / "nothing-*")])
    with pytest.raises(BatchError, match="never modifies"):
        find_runs([str(fleet)], out=fleet / "job-ok" / "report")


def test_fleet_table_matches_single_run_analysis_and_groups_the_same_bug(tmp_path: Path, fleet: Path):
    out = tmp_path / "out"
    result = run_batch(find_runs([str(fleet)]), out, jobs=1)

    table = pl.scan_parquet(out / FLEET_FILE).sort("run").collect()
    assert table.get_column("run").to_list() == ["job-ok", "job-oom-1", "job-oom-2"]
    for row in table.iter_rows(named=True):
        single = analyze([Path(row["path"])])
        root = single.verdict.root_cause
        assert row["status"] == single.verdict.status
        assert row["class"] == (root.cls if root else None)
        assert row["rule"] == (root.rule if root else None)
        assert row["step"] == (root.step if root else None)
        report = json.loads((out / row["report_json"]).read_text(encoding="utf-8"))
        assert report["verdict"]["status"] == row["status"]
        assert (out / row["report_html"]).read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

    ok, oom1, oom2 = table.iter_rows(named=True)
    assert oom1["status"] == "failed" and "OutOfMemoryError" in oom1["signature"]
    assert oom1["fingerprint"] == oom2["fingerprint"], "the same OOM with another pid and IP is the same bug"
    assert ok["status"] == "healthy" and ok["fingerprint"] is None
    assert oom1["files"] == 3 and oom1["bytes"] == sum(p.stat().st_size for p in OOM.rglob("*") if p.is_file())

    index = (out / INDEX_FILE).read_text(encoding="utf-8")
    for row in table.iter_rows(named=True):
        assert f'href="{row["report_html"]}"' in index
    assert oom1["fingerprint"] in index
    assert (oom1["host"], oom2["host"]) == ("192.0.2.2", "192.0.2.77"), "Ray names the node the trainer died on"
    assert '"192.0.2.2 (1 root)"' in index and '"192.0.2.77 (1 root)"' in index, "each host's row in the heatmap"
    assert result.analysed == 3 and result.cached == 0


def test_second_batch_only_analyses_what_changed(tmp_path: Path, fleet: Path):
    out = tmp_path / "out"
    first = run_batch(find_runs([str(fleet)]), out, jobs=1)
    again = run_batch(find_runs([str(fleet)]), out, jobs=1)
    assert (again.analysed, again.cached) == (0, 3)
    assert_frame_equal(again.fleet, first.fleet)

    log = fleet / "job-ok" / "driver.log"
    os.utime(log, ns=(log.stat().st_atime_ns, log.stat().st_mtime_ns + 10**9))
    _variant(OOM, fleet / "job-oom-3", {"pid=900": "pid=77"})
    third = run_batch(find_runs([str(fleet)]), out, jobs=1)
    assert (third.analysed, third.cached) == (2, 2), "the touched run and the new run, nothing else"
    assert third.new_fingerprints == set(), "a third copy of a known OOM is no new bug"

    forced = run_batch(find_runs([str(fleet)]), out, jobs=1, force=True)
    assert forced.analysed == 4


def test_a_new_bug_stands_out(tmp_path: Path):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    shutil.copytree(HEALTHY, fleet / "ok")
    out = tmp_path / "out"
    run_batch(find_runs([str(fleet)]), out, jobs=1)
    shutil.copytree(OOM, fleet / "oom")
    result = run_batch(find_runs([str(fleet)]), out, jobs=1)
    oom = result.fleet.filter(pl.col("run") == "oom").row(0, named=True)
    assert result.new_fingerprints == {oom["fingerprint"]}
    assert 'class="badge new">new</span>' in (out / INDEX_FILE).read_text(encoding="utf-8")


def test_a_run_that_cannot_be_analysed_is_an_error_row(tmp_path: Path, fleet: Path):
    specs = find_runs([str(fleet)])
    shutil.rmtree(fleet / "job-ok")  # deleted by a cleanup job between listing and analysis
    out = tmp_path / "out"
    result = run_batch(specs, out, jobs=1)
    row = result.fleet.filter(pl.col("run") == "job-ok").row(0, named=True)
    assert row["status"] == "error" and "no such file or folder" in row["error"]
    assert row["report_html"] is None
    assert result.fleet.filter(pl.col("status") == "failed").height == 2
    assert row["error"] in (out / INDEX_FILE).read_text(encoding="utf-8")
    assert run_batch(specs, out, jobs=1).analysed == 1, "errors are tried again on the next batch"


def test_ray_engine_without_ray_says_how_to_install_it(tmp_path: Path, fleet: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BatchError, match=r"pip install 'forensics\[ray\]'"):
        run_batch(find_runs([str(fleet)]), tmp_path / "out", engine="ray")


def test_cli_batch(tmp_path: Path, fleet: Path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["batch", str(fleet / "job-*"), "--out", str(out), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "3 runs: 2 failed, 1 healthy" in result.output
    assert "2 ×" in result.output, "the recurring OOM is listed with its count"
    assert (out / FLEET_FILE).is_file() and (out / INDEX_FILE).is_file()

    again = CliRunner().invoke(main, ["batch", str(fleet), "--out", str(out), "--jobs", "1"])
    assert "0 analysed, 3 unchanged" in again.output

    missing = CliRunner().invoke(main, ["batch", str(tmp_path / "nope"), "--out", str(out)])
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    inside = CliRunner().invoke(main, ["batch", str(fleet / "job-ok"), "--out", str(fleet / "job-ok" / "r")])
    assert inside.exit_code == 2 and "never modifies" in inside.output
    assert not (fleet / "job-ok" / "r").exists()
