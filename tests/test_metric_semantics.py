"""Metric semantics as data: patterns/metrics/*.yaml say what each metric is; the detectors, the report's
figures and `forensics diff` read them; `--patterns DIR` extends them; invalid files fail with file and line."""

from __future__ import annotations

import ast
import shutil

import pytest
from click.testing import CliRunner

from forensics.cli import main
from forensics.metric_semantics import MetricFileError, bundled, load_file, load_vocabulary, panel
from forensics.pipeline import Options, analyze
from tests.conftest import FIXTURES, REPO

RUNS = FIXTURES / "runs"


@pytest.mark.parametrize(
    ("metric", "kind", "judged_by"),
    [
        ("actor/pg_loss", "policy_loss", "policy-loss"),  # centred on zero: not a loss to minimise
        ("actor/kl_loss", "kl", "kl-blowup"),
        ("critic/score/mean", "reward", "reward-collapse"),
        ("critic/score/max", "reward_stat", None),
        ("response_length/clip_ratio", "length_clip_ratio", "response-truncation"),
        ("train/loss", "loss", "divergence"),
        ("lm loss", "loss", "oscillation"),  # Megatron
        ("eval_loss", "val_loss", None),  # judged for NaN only, never for a trend
        ("val-core/openai/gsm8k/reward/mean@1", "val_score", None),
        ("some/new_loss", "loss", "divergence"),  # the catch-all glob
        ("timing_s/reshard", "time", None),
    ],
)
def test_bundled_vocabulary(metric, kind, judged_by):
    vocabulary = bundled()
    assert vocabulary.kind(metric) == kind
    if judged_by:
        assert vocabulary.judged_by(metric, judged_by)
    else:
        assert not set(vocabulary.spec(metric).detectors) - {"non-finite"}


def test_the_report_and_diff_read_the_vocabulary_not_each_other():
    assert panel("training")[:3] == ("actor/pg_loss", "actor/loss", "critic/vf_loss")
    assert "perf/throughput" in panel("throughput") and "perf/max_memory_allocated_gb" in panel("memory")
    tree = ast.parse((REPO / "forensics" / "diff.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("forensics.report")}
    assert "forensics.metric_semantics" in imported


def _write(tmp_path, text: str):
    folder = tmp_path / "extra" / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mine.yaml"
    path.write_text(text, encoding="utf-8")
    return tmp_path / "extra"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("metrics:\n  - {name: a, kind: loss, goal: minimise, noise: low, colour: red}\n", "3: unknown key(s) colour"),
        ("metrics:\n  - {name: a, kind: lossy, goal: minimise, noise: low}\n", "kind: 'lossy' is not one of"),
        ("metrics:\n  - {name: a, kind: loss, goal: up, noise: low}\n", "goal: 'up' is not one of"),
        ("metrics:\n  - {name: a, kind: loss, goal: minimise, noise: low, detectors: [divergenz]}\n", "not known"),
        ("metric:\n  - {name: a}\n", "unknown key(s) metric"),
        ("metrics: []\n", "a non-empty list"),
    ],
)
def test_invalid_metric_files_name_file_line_and_key(tmp_path, text, problem):
    extra = _write(tmp_path, "# a user file\n" + text)
    with pytest.raises(MetricFileError, match=r"mine\.yaml") as info:
        load_file(extra / "metrics" / "mine.yaml")
    assert problem in str(info.value)


def test_examples_must_resolve_to_the_kind_they_name(tmp_path):
    extra = _write(
        tmp_path,
        "metrics:\n  - {name: 'my/*', kind: reward, goal: maximise, noise: high, detectors: [reward-collapse]}\n"
        "examples:\n  my/score: loss\n",
    )
    with pytest.raises(MetricFileError, match="example 'my/score' resolves to 'reward', not 'loss'"):
        load_vocabulary([extra])


def test_patterns_overlay_changes_what_the_detectors_judge(tmp_path):
    """The lr-too-high run's loss regression is found; a user file that says train/loss is not judged stops it,
    and a file that names a new reward makes the reward detector read it."""
    run = RUNS / "cpu_lm_lr_high"
    assert "loss-regression" in {f.rule for f in analyze([run]).findings}
    extra = _write(tmp_path, "metrics:\n  - {name: train/loss, kind: other, goal: none, noise: high, detectors: []}\n")
    a = analyze([run], Options(patterns=[extra]))
    assert "loss-regression" not in {f.rule for f in a.findings}
    assert load_vocabulary([extra]).kind("train/loss") == "other"
    assert load_vocabulary().kind("train/loss") == "loss"  # the bundled files are untouched


def test_analyze_and_lint_refuse_an_invalid_metrics_file(tmp_path):
    extra = _write(tmp_path, "metrics:\n  - {name: a, kind: nope, goal: none, noise: low}\n")
    run = tmp_path / "run"
    shutil.copytree(RUNS / "cpu_lm_short", run)
    result = CliRunner().invoke(main, ["analyze", str(run), "--patterns", str(extra), "--no-html"])
    assert result.exit_code == 2 and "invalid metrics file" in result.output and "mine.yaml:2" in result.output
    lint = CliRunner().invoke(main, ["patterns", "lint", str(extra)])
    assert lint.exit_code == 2 and "kind: 'nope'" in lint.output


def test_metric_files_are_not_read_as_rules():
    """`patterns lint` times regexes (a busy machine may report one as slow): what it must not do is read the
    files of metrics/ as rules."""
    result = CliRunner().invoke(main, ["patterns", "lint"])
    assert result.exit_code in (0, 2) and "metrics/" not in result.output, result.output
    listed = CliRunner().invoke(main, ["patterns", "list"]).output
    assert "10-verl" not in listed
