"""Every engine gives the same fleet table: one process, the process pool, and Ray tasks on a real local Ray."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from forensics.batch import RunSpec, find_runs, run_batch
from forensics.fleet import FLEET_FILE

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diff"


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> list[RunSpec]:
    root = tmp_path_factory.mktemp("engines") / "fleet"
    shutil.copytree(FIXTURES / "ray_memory_monitor", root / "oom")
    shutil.copytree(FIXTURES / "ray_healthy", root / "ok")
    (root / "gone").mkdir()  # listed, then removed: an error row in every engine
    found = find_runs([str(root)])
    (root / "gone").rmdir()
    return found


@pytest.fixture(scope="module")
def baseline(specs: list[RunSpec], tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    return _comparable(run_batch(specs, tmp_path_factory.mktemp("one"), jobs=1).fleet)


def _comparable(fleet: pl.DataFrame) -> pl.DataFrame:
    return fleet.drop("analysis_s")  # wall time of each analysis, the only column allowed to differ


def test_baseline_has_every_kind_of_row(baseline: pl.DataFrame):
    assert baseline.get_column("status").to_list() == ["error", "healthy", "failed"]


def test_process_pool_gives_the_same_table(specs, baseline, tmp_path: Path):
    assert_frame_equal(_comparable(run_batch(specs, tmp_path, jobs=2).fleet), baseline)


def test_ray_tasks_give_the_same_table(specs, baseline, tmp_path: Path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'forensics[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        result = run_batch(specs, tmp_path, engine="ray", jobs=2)
    finally:
        ray.shutdown()
    assert_frame_equal(_comparable(pl.read_parquet(tmp_path / FLEET_FILE)), baseline)
    assert result.analysed == 3
    for row in result.fleet.filter(pl.col("status") != "error").iter_rows(named=True):
        assert (tmp_path / row["report_html"]).is_file() and (tmp_path / row["report_json"]).is_file()
