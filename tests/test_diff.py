"""`forensics diff`: a failing Ray capture against the run where the failure is gone."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from forensics.cli import main
from forensics.diff import compare, flatten
from forensics.pipeline import analyze

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diff"
GPU_HEALTHY = FIXTURES.parent / "runs" / "healthy"


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """The failing capture (Ray killed the trainer for memory at step 4) and the capture that ran 20 steps."""
    failing = shutil.copytree(FIXTURES / "ray_memory_monitor", tmp_path / "before")
    fixed = shutil.copytree(FIXTURES / "ray_healthy", tmp_path / "after")
    return failing, fixed


def _jsonl_peak(run: Path) -> float:
    """The largest `perf/max_memory_allocated_gb` in the run's verl file-logger JSONL, read with json alone."""
    lines = next(run.glob("forensics_capture/*.jsonl")).read_text(encoding="utf-8").splitlines()
    return max(json.loads(line)["data"]["perf/max_memory_allocated_gb"] for line in lines if line.strip())


def test_gpu_run_whose_leak_was_fixed(tmp_path: Path):
    """2 x H200: rank 1 leaked memory until CUDA OOM at step 24; the fixed job ran its 80 steps."""
    leaking = shutil.copytree(FIXTURES / "leak_oom", tmp_path / "leak_oom")
    fixed = shutil.copytree(GPU_HEALTHY, tmp_path / "fixed")
    doc = compare(analyze([leaking]), analyze([fixed]))

    expected = (_jsonl_peak(fixed) - _jsonl_peak(leaking)) / _jsonl_peak(leaking) * 100
    assert expected < -90
    assert doc["verdict"].startswith(f"peak memory {expected:+.0f}%, throughput +")
    assert doc["verdict"].endswith("the OOM is gone")
    assert doc["a"]["root_cause"]["class"] == "cuda_oom" and doc["a"]["root_cause"]["rank"] == 1
    assert doc["b"]["status"] == "healthy" and doc["b"]["steps"] == 80
    peak = next(n for n in doc["numbers"] if n["name"] == "peak_memory_gb")
    assert peak["improved"] is True and peak["source"] == "perf/max_memory_allocated_gb"


def _logged(run: Path, metric: str) -> list[float]:
    """Every value of a metric in the run's step lines, read with a plain regex."""
    text = (run / "driver.log").read_text(encoding="utf-8")
    return [float(v) for v in re.findall(rf"{re.escape(metric)}:(-?[\d.e+-]+)", text)]


def test_diff_names_the_effect_of_the_fix(runs):
    failing, fixed = runs
    doc = compare(analyze([failing]), analyze([fixed]))

    peak_a = max(_logged(failing, "perf/max_memory_allocated_gb"))
    peak_b = max(_logged(fixed, "perf/max_memory_allocated_gb"))
    expected = (peak_b - peak_a) / peak_a * 100
    assert f"peak memory {expected:+.1f}%" in doc["verdict"]
    assert "OOM is gone" in doc["verdict"]
    assert doc["verdict"].index("peak memory") < doc["verdict"].index("OOM is gone")
    assert "B reached step 20 (A: 3)" in doc["verdict"]

    peak = next(n for n in doc["numbers"] if n["name"] == "peak_memory_gb")
    assert (peak["a"], peak["b"]) == (pytest.approx(peak_a, rel=1e-5), pytest.approx(peak_b, rel=1e-5))
    assert peak["improved"] is (peak_b < peak_a)
    assert doc["a"]["status"] == "failed" and doc["b"]["status"] == "healthy"
    assert doc["a"]["root_cause"]["rule"] in {f["rule"] for f in doc["findings"]["only_a"]}
    assert doc["findings"]["only_b"] == []


def test_metrics_are_compared_at_matching_steps(runs):
    failing, fixed = runs
    doc = compare(analyze([failing]), analyze([fixed]))
    pg_loss = next(s for s in doc["series"] if s["metric"] == "actor/pg_loss")
    assert (pg_loss["first_step"], pg_loss["last_step"], pg_loss["steps"]) == (1, 3, 3)
    assert pg_loss["a_last"] == pytest.approx(_logged(failing, "actor/pg_loss")[2], rel=1e-5)
    assert pg_loss["b_last"] == pytest.approx(_logged(fixed, "actor/pg_loss")[2], rel=1e-5)


def test_the_other_way_round_is_a_regression(runs):
    failing, fixed = runs
    doc = compare(analyze([fixed]), analyze([failing]))
    assert re.search(r"B fails with the \w* ?OOM", doc["verdict"])
    assert doc["findings"]["only_b"] and not doc["findings"]["only_a"]


def test_the_same_failure_twice_is_not_fixed(runs, tmp_path: Path):
    failing, _ = runs
    again = shutil.copytree(failing, tmp_path / "retry")
    log = again / "driver.log"
    log.write_text(log.read_text(encoding="utf-8").replace("pid=900", "pid=31337"), encoding="utf-8")
    doc = compare(analyze([failing]), analyze([again]))
    assert re.search(r"still fails with the \w* ?OOM \(same fingerprint\)", doc["verdict"])


def test_config_keys_that_differ_are_flattened(runs):
    failing, fixed = runs
    a, b = analyze([failing]), analyze([fixed])
    assert {c["key"]: (c["a"], c["b"]) for c in compare(a, b)["config"]["changed"]} == {
        "ray_kwargs.ray_init._temp_dir": ("/tmp/rc/oom", "/tmp/rc/h")
    }, "the two captures' printed configs differ in Ray's temp dir only"

    # nested (as the runs' hydra config.yaml) or already flat: the diff flattens both the same way
    a.config = yaml.safe_load((failing / ".hydra" / "config.yaml").read_text(encoding="utf-8"))
    b.config = yaml.safe_load((fixed / ".hydra" / "config.yaml").read_text(encoding="utf-8"))
    b.config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] = 1
    changed = {c["key"]: (c["a"], c["b"]) for c in compare(a, b)["config"]["changed"]}
    assert changed == {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (2, 1),
        "ray_kwargs.ray_init._temp_dir": ("/tmp/rc/oom", "/tmp/rc/h"),
    }


def test_no_config_on_either_side_is_said_so(runs):
    failing, fixed = runs
    a, b = analyze([failing]), analyze([fixed])
    a.config, b.config = {}, {}
    assert compare(a, b)["config"] == {"read": [False, False], "changed": [], "only_a": [], "only_b": []}
    a.config = {"trainer": {"total_training_steps": 20}}
    assert compare(a, b)["config"]["read"] == [True, False]
    assert flatten({"a": {"b": {"c": 1}, "d": [1, 2]}}) == {"a.b.c": 1, "a.d": [1, 2]}


def test_cli_diff_writes_json_and_html_but_never_inside_a_run(runs, tmp_path: Path):
    failing, fixed = runs
    html = tmp_path / "diff.html"
    result = CliRunner().invoke(main, ["diff", str(failing), str(fixed), "--json", "-", "-o", str(html), "-q"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "forensics.diff/v1" and "OOM is gone" in doc["verdict"]
    page = html.read_text(encoding="utf-8")
    assert doc["verdict"] in page and 'id="plot-perf-max_memory_allocated_gb"' in page

    inside = CliRunner().invoke(main, ["diff", str(failing), str(fixed), "-o", str(failing / "d.html")])
    assert inside.exit_code == 2 and "never modifies" in inside.output
    assert not (failing / "d.html").exists()
