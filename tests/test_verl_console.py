from __future__ import annotations

import math

from forensics.sources.verl import parse_step_line, parse_value


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
