"""Captured 2-GPU runs (scripts/capture/train.py under torchrun on H200s): what their reports say beyond the
verdict (tests/test_fixture_runs.py checks every run against its expected.yaml)."""

from __future__ import annotations

import json
from functools import cache

import yaml

from forensics.model import Analysis
from forensics.pipeline import analyze
from forensics.report.figures import figures
from forensics.report.html import render_html
from tests.conftest import FIXTURES

RUNS = FIXTURES / "runs"


@cache
def _analysis(name: str) -> Analysis:
    return analyze([RUNS / name])


def _expected(name: str) -> dict:
    return yaml.safe_load((RUNS / name / "expected.yaml").read_text(encoding="utf-8"))


def test_healthy_run_raises_no_alarm_and_passes_the_checklist():
    a = _analysis("healthy")
    assert a.verdict.status == "healthy"
    assert a.findings == []
    checks = {c["name"]: c["status"] for c in a.checks}
    assert {k: checks[k] for k in ("GPU memory headroom", "Throughput stability", "Batch sizes")} == {
        "GPU memory headroom": "pass",
        "Throughput stability": "pass",
        "Batch sizes": "pass",
    }
    assert a.environment["driver_version"] == "580.159.04"
    assert a.environment["torch_version"] == "2.11.0+cu130"
    assert a.config["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 8
    assert a.series.filter(a.series["metric"] == "actor/pg_loss")["step"].n_unique() == 80
    # rank 0's own stdout (torchrun --log-dir) holds the same step lines as the tee'd console, with the rank
    samples = {f.path: f.samples for f in a.files}
    assert samples["torchrun_logs/none_zhvhbcke/attempt_0/0/stdout.log"] == samples["driver.log"] > 1000
    # ...and the file logger holds them at full precision: one sample per step and metric, from the JSONL
    pg_loss = a.series.filter(a.series["metric"] == "actor/pg_loss")
    assert pg_loss.height == 80 and pg_loss["source"].unique().to_list() == ["verl_file_logger"]


def test_check_command_prints_the_checklist():
    from click.testing import CliRunner

    from forensics.cli import main

    result = CliRunner().invoke(main, ["check", str(RUNS / "slow_rank"), "--json", "-"])
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
    assert checks["Throughput stability"]["status"] == "warn"
    assert checks["NVIDIA driver"]["value"] == "580.159.04"
    table = CliRunner().invoke(main, ["check", str(RUNS / "healthy")])
    assert table.exit_code == 0 and "Batch sizes" in table.output and "pass" in table.output


def test_leak_report_names_the_step_the_oom_was_heading_for():
    a = _analysis("leak_oom")
    rc = a.verdict.root_cause
    assert rc.fields["projected_step"] == rc.step == _expected("leak_oom")["root_cause"]["projected_step"]
    assert rc.fields["precursor"] == "memory-growth"
    assert "6 GiB per step" in rc.explanation and "out-of-memory failure at step 24" in rc.explanation
    assert "GPU 1 peaked" in rc.explanation
    assert rc.remediation[0].startswith("Look for tensors kept across steps")
    html = render_html(a)
    assert "heading for an out-of-memory failure at step 24" in html


def test_slow_rank_is_degraded_with_the_step_where_throughput_fell_and_the_busy_gpu():
    a = _analysis("slow_rank")
    rc = a.verdict.root_cause
    assert (a.verdict.status, rc.step, rc.rank) == ("degraded", 40, 1)
    assert "at step 40" in rc.explanation and "GPU 1 kept computing" in rc.explanation
    assert {c["name"]: c["status"] for c in a.checks}["Throughput stability"] == "warn"


def test_detector_steps_are_shaded_on_the_step_plots():
    figs = dict(figures(_analysis("slow_rank")))
    rects = [s for s in figs["throughput"].layout.shapes if s.type == "rect"]
    assert [(r.x0, r.x1) for r in rects] == [(39.5, 80.5)]
    oscillation = dict(figures(_analysis("lr_oscillation")))["training"]
    assert len([s for s in oscillation.layout.shapes if s.type == "rect"]) == 3  # one per episode


def test_report_explains_each_detector_finding():
    html = render_html(_analysis("lr_divergence"))
    assert 'id="dynamics"' in html and "climbed far above it" in html
    assert 'id="checks"' in html and "Batch sizes" in html
