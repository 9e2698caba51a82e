from __future__ import annotations

import math

import polars as pl

from forensics.sources.verl import parse_config_dump, parse_step_line, parse_value, unwrap_step_line
from tests.conftest import FIXTURES


def test_new_pformat_style_with_numpy_scalars_nan_and_inf():
    step, metrics = parse_step_line(
        "step:7 - actor/pg_loss:-0.0036091046008680547 - actor/lr:1e-06 - actor/entropy:np.float64(0.5)"
        " - actor/kl_loss:nan - actor/grad_norm:inf - training/epoch:0"
    )
    assert step == 7
    assert metrics["actor/pg_loss"] == -0.0036091046008680547
    assert metrics["actor/lr"] == 1e-06
    assert metrics["actor/entropy"] == 0.5
    assert math.isnan(metrics["actor/kl_loss"])
    assert metrics["actor/grad_norm"] == math.inf
    assert metrics["training/epoch"] == 0


def test_old_three_decimal_style_with_ray_dedup_suffix():
    step, metrics = parse_step_line(
        "step:2 - global_seqlen/min:538646.000 - actor/lr:0.000 - timing_s/gen:74.020 [repeated 2x across cluster]"
    )
    assert step == 2
    assert metrics == {"global_seqlen/min": 538646.0, "actor/lr": 0.0, "timing_s/gen": 74.02}


def test_not_a_step_line():
    assert parse_step_line("Training Progress:   1%|          | 1/140") is None
    assert parse_value("'abc'") is None


def test_hard_wrapped_step_line_from_a_real_paste_is_joined(corpus):
    """verl issue #7412: the paste wraps inside the key `critic/rewards/min`."""
    from forensics.pipeline import analyze

    a = analyze([corpus / "cases" / "045_healthy.log"])
    by_metric = dict(a.series.filter(pl.col("step") == 34).select("metric", "value").iter_rows())
    assert by_metric["critic/rewards/max"] == 1.0
    assert by_metric["critic/rewards/min"] == -1.0  # the key that was cut in two
    assert by_metric["response_length/min"] == 38.0  # from the continuation line
    assert "critic" not in by_metric


def test_continuation_lines_starting_with_a_dash_are_read_with_their_step():
    text = unwrap_step_line(
        "step:3 - actor/pg_loss:0.1", [" - actor/grad_norm:nan - perf/throughput:12.5", "- timing_s/step:2.0", "x"]
    )
    step, metrics = parse_step_line(text)
    assert step == 3 and metrics["perf/throughput"] == 12.5 and metrics["timing_s/step"] == 2.0
    assert math.isnan(metrics["actor/grad_norm"])


def test_the_next_step_line_is_never_taken_as_a_continuation():
    text = unwrap_step_line("step:3 - a:1 - critic", ["step:4 - a:2"])
    assert parse_step_line(text) == (3, {"a": 1.0})


def test_taskrunner_config_dump_and_hydra_files_become_dotted_config():
    from forensics.pipeline import analyze

    a = analyze([FIXTURES / "config" / "ray_healthy"])
    c = a.config
    assert c["actor_rollout_ref.actor.ppo_mini_batch_size"] == 4
    assert c["actor_rollout_ref.actor.optim.lr"] == 1e-06
    assert c["actor_rollout_ref.rollout.name"] == "vllm"
    assert c["trainer.logger"] == ["console"]
    assert c["trainer.n_gpus_per_node"] == 2
    assert c["ray_kwargs.ray_init.num_cpus"] == 2  # an override from .hydra/overrides.yaml
    # .hydra/config.yaml leaves ${...} unresolved; the TaskRunner's resolved value is the one kept
    assert c["trainer.default_local_dir"] == "checkpoints/verl_grpo_example_gsm8k/qwen2_5_0_5b_grpo"
    val = a.series.filter(pl.col("metric") == "val-core/openai/gsm8k/acc/mean@1")
    assert val.select("step", "value").rows() == [(0, 0.25)]
    kinds = {f.path: f.kind for f in a.files}
    assert kinds["outputs/.hydra/config.yaml"] == "hydra_config"
    assert kinds["outputs/.hydra/overrides.yaml"] == "hydra_overrides"


def test_config_dump_is_parsed_as_literals_only():
    lines = ["{'trainer': {'n_gpus_per_node': 8,", "             'cmd': __import__('os').getcwd()}}"]
    assert parse_config_dump(lines) is None
    assert parse_config_dump(["{'trainer': {'nnodes': 2,", "             'logger': ['console']}}"]) == {
        "trainer.nnodes": 2,
        "trainer.logger": ["console"],
    }
    assert parse_config_dump(["{'unrelated': 1}"]) is None  # not a verl config


def test_file_logger_null_is_a_non_finite_value(tmp_path):
    """verl's file logger writes with orjson, which turns NaN and inf into null."""
    from forensics.pipeline import analyze

    run = tmp_path / "run"
    (run / "proj").mkdir(parents=True)
    (run / "proj" / "exp.jsonl").write_text(
        '{"step":1,"data":{"actor/pg_loss":0.5,"actor/grad_norm":0.2}}\n'
        '{"step":2,"data":{"actor/pg_loss":null,"actor/grad_norm":null,"note":"text"}}\n'
    )
    a = analyze([run])
    step2 = a.series.filter(pl.col("step") == 2)
    assert sorted(step2["metric"].to_list()) == ["actor/grad_norm", "actor/pg_loss"]
    assert step2["value"].is_nan().all()
