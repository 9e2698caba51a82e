"""`forensics batch` under Ctrl-C and a stuck analysis: the finished work is kept, nothing stalls the batch."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import forensics.batch
from forensics.batch import FLEET_FILE, INDEX_FILE, find_runs, run_batch
from forensics.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diff"
STUCK_HOOK = """
import os, time
if os.environ.get("FORENSICS_TEST_STUCK_RUN"):
    import forensics.pipeline as pipeline
    real = pipeline.analyze
    def analyze(paths, options=None):
        if any(os.path.basename(str(p)) == os.environ["FORENSICS_TEST_STUCK_RUN"] for p in paths):
            while True:  # an analysis that never ends, as a parser caught in a loop would
                time.sleep(1)
        return real(paths, options)
    pipeline.analyze = analyze
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    root.mkdir()
    for name, source in (("a-oom", "ray_memory_monitor"), ("b-ok", "ray_healthy"), ("c-leak", "leak_oom")):
        shutil.copytree(FIXTURES / source, root / name)
    return root


def _interrupt_after(n: int):
    """A progress callback that presses Ctrl-C once `n` runs are settled (KeyboardInterrupt in the main thread)."""
    settled = []

    def progress(spec) -> None:
        settled.append(spec.run)
        if len(settled) == n:
            raise KeyboardInterrupt

    return progress, settled


def test_ctrl_c_keeps_the_finished_runs_and_the_next_batch_finishes(tmp_path: Path, fleet: Path):
    out = tmp_path / "out"
    progress, settled = _interrupt_after(1)
    result = run_batch(find_runs([str(fleet)]), out, jobs=1, progress=progress)
    assert result.interrupted and result.fleet.get_column("run").to_list() == settled == ["a-oom"]
    assert pl.read_parquet(out / FLEET_FILE).height == 1
    index = (out / INDEX_FILE).read_text(encoding="utf-8")
    assert result.fleet.row(0, named=True)["report_html"] in index, "the index lists what was finished"
    again = run_batch(find_runs([str(fleet)]), out, jobs=1)
    assert (again.interrupted, again.cached, again.analysed) == (False, 1, 2)


def test_ctrl_c_in_the_process_pool_stops_the_workers(tmp_path: Path, fleet: Path):
    out = tmp_path / "out"
    run_batch(find_runs([str(fleet)]), out, jobs=2)  # a complete batch first: its rows must survive
    progress, _ = _interrupt_after(1)
    forced = run_batch(find_runs([str(fleet)]), out, jobs=2, force=True, progress=progress)
    assert forced.interrupted
    assert forced.fleet.height == 3, "runs not reached keep the previous batch's rows"
    assert multiprocessing.active_children() == [], "no worker is left running"


def test_cli_ctrl_c_exits_130_with_the_partial_table(tmp_path: Path, fleet: Path, monkeypatch: pytest.MonkeyPatch):
    real = forensics.batch.analyse_run
    calls = []

    def analyse_then_interrupt(spec, settings):
        calls.append(spec.run)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second run is being analysed
        return real(spec, settings)

    monkeypatch.setattr(forensics.batch, "analyse_run", analyse_then_interrupt)
    out = tmp_path / "out"
    args = ["batch", str(fleet), "--out", str(out), "--jobs", "1", "--timeout", "0", "--json", str(tmp_path / "b.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output
    assert "1 runs" in result.stdout and "interrupted: 1 of 3 runs" in result.stderr
    doc = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert doc["interrupted"] and [r["run"] for r in doc["rows"]] == ["a-oom"]


def test_a_stuck_analysis_is_stopped_and_the_batch_goes_on(tmp_path: Path, fleet: Path, monkeypatch):
    """A real stuck worker process: `sitecustomize` in the spawned workers makes one run's analysis loop forever."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STUCK_HOOK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), *sys.path]))
    monkeypatch.setenv("FORENSICS_TEST_STUCK_RUN", "b-ok")
    began: list[str] = []
    specs = find_runs([str(fleet)])
    result = run_batch(specs, tmp_path / "out", jobs=2, timeout=30, began=lambda s: began.append(s.run))
    rows = {r["run"]: r for r in result.fleet.iter_rows(named=True)}
    assert rows["b-ok"]["status"] == "error"
    assert rows["b-ok"]["error"] == "the analysis ran past the per-run timeout of 30 s and was stopped"
    assert (rows["a-oom"]["status"], rows["c-leak"]["status"]) == ("failed", "failed"), rows["c-leak"]["error"]
    assert set(began) == {"a-oom", "b-ok", "c-leak"}, "each run is announced as it begins"
    assert multiprocessing.active_children() == []


def test_began_comes_before_settled_for_every_run(tmp_path: Path, fleet: Path):
    events: list[tuple[str, str]] = []
    run_batch(
        find_runs([str(fleet)]),
        tmp_path / "out",
        jobs=1,
        began=lambda s: events.append(("began", s.run)),
        progress=lambda s: events.append(("settled", s.run)),
    )
    for run in ("a-oom", "b-ok", "c-leak"):
        assert events.index(("began", run)) < events.index(("settled", run))
