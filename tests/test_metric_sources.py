"""Metrics from where users keep them, read from real output: other trainers' step lines (lines of public
threads in the corpus), flat and verl JSONL, CSV, TensorBoard event files and MLflow's file store (CPU runs
captured with scripts/capture/cpu_corpus.py). One sample per (metric, step, rank), the most precise winning."""

from __future__ import annotations

import json
import lzma
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.model import Analysis
from forensics.pipeline import analyze
from forensics.sources import base
from forensics.sources.base import SERIES_SCHEMA, Sink, one_sample_per_step
from forensics.sources.trainer_lines import parse_plain
from tests.conftest import FIXTURES, REPO

RUNS = FIXTURES / "runs"
CASES = REPO / "corpus" / "cases" / "open"


@cache
def _analysis(path: Path) -> Analysis:
    return analyze([path])


def _values(a: Analysis, metric: str) -> pl.DataFrame:
    return a.series.filter(pl.col("metric") == metric).sort("step")


def _flat_jsonl(run: str, name: str = "metrics.jsonl.xz") -> list[dict]:
    with lzma.open(RUNS / run / name, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize(
    ("case", "step", "metric", "value", "source"),
    [
        ("0004.log", 71, "lm loss", 1.818812, "megatron"),  # Megatron-LM iteration lines
        ("0004.log", 71, "learning rate", 1.42e-05, "megatron"),
        ("0063.log", 1, "loss", 1.6531, "hf_trainer"),  # Hugging Face Trainer dicts (sentence-transformers)
        ("0063.log", 1, "learning_rate", 1.3934426229508198e-05, "hf_trainer"),
        ("0043.log", 1, "grad_norm", 14.98, "hf_trainer"),  # unsloth's aligned dicts
        ("0818.log", 28, "train/grad_norm", 2217390918.482301, "hf_trainer"),  # slime's `step N: {'train/...`
        ("0014.log", 40, "lr", 5e-05, "deepspeed"),  # DeepSpeed's log_dist step lines
        ("0014.log", 40, "skipped steps", 2.0, "deepspeed"),
        ("0425.log", 0, "reduced_train_loss", 11.0, "lightning"),  # NeMo / Lightning progress bar
        ("0041.log", 1631, "loss", 4.0863, "plain_step"),  # nanoGPT's `iter N: loss X, time Yms`
        ("0041.log", 1631, "time_ms", 561.94, "plain_step"),
        ("0068.log", 1020, "loss", 0.8473, "mmengine"),  # xtuner's mmengine `Iter(train) [i/N]`
        ("0633.log", 200, "grad_norm", 3.0608, "mmengine"),  # `Epoch(train) [1][200/735]`: epoch 1, step 200
        ("1076.log", 788 + 100, "grad_norm", 31101415.5974, "mmengine"),  # mmdetection, epoch 2 of 788 steps
    ],
)
def test_other_trainers_step_lines(case, step, metric, value, source):
    a = _analysis(CASES / case)
    row = a.series.filter((pl.col("metric") == metric) & (pl.col("step") == step))
    assert row.height == 1, a.series.select("metric", "step").unique().head(20)
    assert row["value"][0] == pytest.approx(value, rel=1e-9)
    assert row["source"][0] == source


def test_mmengine_lines_keep_no_eta_and_give_a_non_finite_grad_norm_its_step():
    """`eta: 2:44:49` is a duration, not a metric; grad_norm nan at iteration 240 is where instability starts."""
    a = _analysis(CASES / "0633.log")
    assert "eta" not in set(a.series["metric"])
    assert a.verdict.root_cause is not None and a.verdict.root_cause.step == 240


def test_hf_evaluation_dicts_belong_to_the_step_before_them():
    a = _analysis(CASES / "0063.log")
    train = _values(a, "loss")["step"].to_list()
    evaluation = _values(a, "eval_loss")
    assert train[:10] == list(range(1, 11))
    assert evaluation["step"][0] == 10 and evaluation["value"][0] == pytest.approx(1.2490781545639038)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("iter 3436 step 53: loss 2.9911, iter time: 400.10ms", (53, {"loss": 2.9911, "iter time_ms": 400.1})),
        (
            "2017-03-15 19:27:40.337271: step 1790, loss = 1.53 (1725.5 examples/sec; 0.074 sec/batch)",
            (1790, {"loss": 1.53}),
        ),
        ("step:12 - actor/pg_loss:0.1 - actor/entropy:0.5", None),  # verl's own: sources/verl.py reads it
        ("step 3 of 10 finished", None),  # no loss: not a training step line
    ],
)
def test_plain_step_prints(line, expected):
    """Lines of lit-gpt and the TensorFlow CIFAR tutorial as printed in public threads."""
    assert parse_plain(line) == expected


def test_plain_console_of_a_captured_run():
    a = _analysis(RUNS / "cpu_lm_plain_console")
    loss = _values(a, "loss")
    assert loss.height == 150 and set(loss["source"]) == {"plain_step"}


def test_flat_jsonl_keeps_full_precision():
    """The issue's case: a learning rate of 3e-4 read from 3-decimal console lines is 0.0; JSONL has it all."""
    a = _analysis(RUNS / "cpu_lm_flat_jsonl")
    records = _flat_jsonl("cpu_lm_flat_jsonl")
    lr = _values(a, "train/lr")
    assert lr.height == len(records) == 150
    assert lr["value"].to_list() == [r["train/lr"] for r in records]
    assert set(lr["source"]) == {"metrics_jsonl"}
    assert not [w for w in a.warnings if "metrics.jsonl" in w]


def test_csv_table_with_a_step_column():
    a = _analysis(RUNS / "cpu_lm_csv")
    loss = _values(a, "train/loss")
    assert loss.height == 150 and set(loss["source"]) == {"metrics_csv"}
    with lzma.open(RUNS / "cpu_lm_csv" / "metrics.csv.xz", "rt") as fh:
        header, first = fh.readline().strip().split(","), fh.readline().strip().split(",")
    assert loss["value"][0] == float(first[header.index("train/loss")])


def test_tensorboard_event_files_are_read_with_their_wall_time():
    pytest.importorskip("tensorboard")
    a = _analysis(RUNS / "cpu_lm_tensorboard")
    loss = _values(a, "train/loss")
    assert loss.height == 150 and set(loss["source"]) == {"tensorboard"}
    assert loss["ts"].null_count() == 0


def test_tensorboard_is_float32_and_loses_to_the_jsonl_copy():
    pytest.importorskip("tensorboard")
    from forensics.sources.tensorboard import _read

    run = RUNS / "cpu_lm_all_loggers"
    event_file = next(run.glob("tensorboard_log/*/events.out.tfevents.*"))
    sink = Sink()
    _read(event_file, event_file.name, sink)
    tb = sink.series().filter(pl.col("metric") == "train/lr").sort("step")
    exact = [r["train/lr"] for r in _flat_jsonl("cpu_lm_all_loggers")]
    assert tb["value"].to_list() == [float(np.float32(v)) for v in exact]
    merged = _values(_analysis(run), "train/lr")
    assert merged.height == len(exact) and "tensorboard" not in set(merged["source"])
    assert merged["value"].to_list() == exact


def test_one_sample_per_metric_step_and_rank_from_all_loggers():
    """Console, verl's file logger, flat JSONL, CSV and TensorBoard all hold the same steps: counted once."""
    a = _analysis(RUNS / "cpu_lm_all_loggers")
    stepped = a.series.filter(pl.col("step").is_not_null())
    assert stepped.group_by("metric", "step", "rank").len()["len"].max() == 1
    assert _values(a, "train/loss").height == 120


def test_mlflow_file_store():
    a = _analysis(RUNS / "cpu_lm_mlflow")
    loss = _values(a, "train/loss")  # a key with a slash is a sub-folder of metrics/
    assert loss.height == 120 and set(loss["source"]) == {"mlflow"}
    assert loss["ts"].null_count() == 0
    path = next((RUNS / "cpu_lm_mlflow").glob("mlruns/*/*/metrics/train/loss"))
    first = path.read_text().splitlines()[0].split()
    assert (loss["step"][0], loss["value"][0]) == (int(first[2]), float(first[1]))


def test_the_most_precise_copy_wins_and_a_ranked_copy_replaces_the_driver_echo():
    """verl before PR #2303 printed three decimals; its file logger kept the float."""
    sink = Sink()
    sink.sample("actor/lr", 0.0, source="verl_console", step=3)
    sink.sample("actor/lr", 3e-4, source="verl_file_logger", step=3)
    sink.sample("actor/lr", float(np.float32(3e-4)), source="tensorboard", step=3)
    sink.sample("actor/pg_loss", 0.5, source="verl_console", step=3)  # the driver's console
    sink.sample("actor/pg_loss", 0.5, source="verl_console", step=3, rank=0)  # rank 0's own stdout
    sink.sample("gpu/power_w", 300.0, source="nvidia_smi", rank=0)
    merged = one_sample_per_step(sink.series())
    lr = merged.filter(pl.col("metric") == "actor/lr")
    assert lr.select("value", "source").rows() == [(3e-4, "verl_file_logger")]
    assert merged.filter(pl.col("metric") == "actor/pg_loss").select("rank").rows() == [(0,)]
    assert merged.filter(pl.col("metric") == "gpu/power_w").height == 1


@pytest.mark.parametrize("step_scale", [1, 10**12])  # dense keys index arrays; sparse ones are sorted
def test_one_sample_per_step_in_numpy_keeps_what_the_polars_windows_keep(monkeypatch, step_scale):
    rng = np.random.default_rng(7)
    sources = ["verl_console", "verl_file_logger", "tensorboard", "plain_step"]
    for metrics in (3, 300):
        n = 500
        table = pl.DataFrame(
            {
                "step": [None if rng.random() < 0.1 else int(rng.integers(-3, 6)) * step_scale for _ in range(n)],
                "metric": [f"m{rng.integers(0, metrics)}" for _ in range(n)],
                "value": rng.random(n).tolist(),
                "ts": [None] * n,
                "rank": [None if rng.random() < 0.4 else int(rng.integers(0, 3)) for _ in range(n)],
                "source": [sources[rng.integers(0, len(sources))] for _ in range(n)],
            },
            schema=SERIES_SCHEMA,
        )
        fast = one_sample_per_step(table)
        monkeypatch.setattr(base, "_one_sample_rows", lambda stepped: None)
        assert fast.equals(one_sample_per_step(table))
        monkeypatch.undo()


def test_verl_jsonl_null_is_nan_but_a_flat_null_is_missing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "verl.jsonl").write_text('{"step": 1, "data": {"actor/pg_loss": null}}\n')
    (run / "flat.jsonl").write_text('{"step": 1, "train/loss": null, "train/acc": NaN}\n')
    a = analyze([run])
    by_metric = {r["metric"]: r["value"] for r in a.series.iter_rows(named=True)}
    assert set(by_metric) == {"actor/pg_loss", "train/acc"}
    assert np.isnan(by_metric["actor/pg_loss"]) and np.isnan(by_metric["train/acc"])


def test_wandb_offline_run():
    pytest.importorskip("wandb.proto.wandb_internal_pb2")
    a = _analysis(RUNS / "cpu_lm_wandb")
    loss = _values(a, "train/loss")
    assert loss.height == 120 and set(loss["source"]) == {"wandb"}
    assert loss["step"].to_list() == list(range(1, 121)) and loss["ts"].null_count() == 0
    assert _values(a, "train/lr")["value"][0] == pytest.approx(1.5e-4, rel=1e-12)  # float64: warm-up 1/20 of 3e-3


def test_a_truncated_wandb_file_keeps_the_records_before_the_damage(tmp_path):
    pytest.importorskip("wandb.proto.wandb_internal_pb2")
    source = next((RUNS / "cpu_lm_wandb").glob("wandb/*/*.wandb"))
    run = tmp_path / "run"
    run.mkdir()
    (run / source.name).write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    a = analyze([run])
    steps = _values(a, "train/loss")["step"].to_list()
    assert 40 < len(steps) < 80 and steps == list(range(1, len(steps) + 1))
    assert any("damaged after" in w for w in a.warnings)
