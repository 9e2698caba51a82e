"""The health checklist: verl's batch-size and parallelism rules, versions, memory headroom, throughput."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from forensics.analyses.checks import health_checks
from forensics.model import EVENT_SCHEMA, SERIES_SCHEMA, empty_events, empty_series

VERL = {
    "data.train_batch_size": 1024,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.actor.ppo_micro_batch_size": None,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
}


def _checks(config=None, environment=None, series=None, events=None) -> dict[str, dict]:
    items = health_checks(
        events if events is not None else empty_events(),
        series if series is not None else empty_series(),
        [],
        config or {},
        environment or {},
    )
    assert all(set(i) == {"name", "status", "value", "detail"} for i in items)
    assert all(i["status"] in ("pass", "warn", "fail", "unknown") for i in items)
    return {i["name"]: i for i in items}


def test_a_run_with_nothing_to_judge_is_unknown_everywhere():
    assert {c["status"] for c in _checks().values()} == {"unknown"}


def test_verl_defaults_scaled_to_eight_gpus_pass():
    checks = _checks(VERL)
    assert checks["Batch sizes"]["status"] == "pass"
    assert checks["Parallel sizes vs GPUs"]["status"] == "pass"
    assert checks["Parallel sizes vs GPUs"]["value"].startswith("8 GPUs = tp 1 x pp 1 x cp 1 x dp 8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data.train_batch_size": 1026, "actor_rollout_ref.rollout.n": 1}, "1026 is not divisible by 8 GPUs"),
        ({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 48}, "mini-batch per rank (160) is not divisible"),
        ({"actor_rollout_ref.actor.ppo_micro_batch_size": 4}, "both ppo_micro_batch_size and"),
        ({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None}, "set ppo_micro_batch_size_per_gpu"),
        ({"actor_rollout_ref.actor.ppo_mini_batch_size": 2048}, "train_batch_size (1024) <"),
    ],
)
def test_verl_batch_size_rules(change, message):
    check = _checks({**VERL, **change})["Batch sizes"]
    assert check["status"] == "fail"
    assert message in check["detail"]


def test_dynamic_batch_size_needs_no_micro_batch():
    config = {**VERL, "actor_rollout_ref.actor.use_dynamic_bsz": True}
    config["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = None
    assert _checks(config)["Batch sizes"]["status"] == "pass"


def test_parallel_sizes_that_do_not_divide_the_gpus():
    check = _checks({**VERL, "actor_rollout_ref.rollout.tensor_model_parallel_size": 3})["Parallel sizes vs GPUs"]
    assert check["status"] == "fail" and "rollout tensor_model_parallel_size=3" in check["detail"]
    megatron = {**VERL, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 4}
    megatron["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"] = 3
    assert _checks(megatron)["Parallel sizes vs GPUs"]["status"] == "fail"
    fewer = _checks(VERL, {"gpu_count": 4})["Parallel sizes vs GPUs"]
    assert fewer["status"] == "fail" and "4 were found" in fewer["detail"]


@pytest.mark.parametrize(
    ("env", "name", "status"),
    [
        ({"driver_version": "550.54.15"}, "NVIDIA driver", "pass"),
        ({"driver_version": "525.60.11"}, "NVIDIA driver", "pass"),
        ({"driver_version": "470.256.02"}, "NVIDIA driver", "fail"),
        ({"driver_version": "575.57.08", "torch_cuda_version": "13.0"}, "NVIDIA driver", "fail"),
        ({"driver_version": "580.159.04", "torch_cuda_version": "13.0"}, "NVIDIA driver", "pass"),
        ({"torch_cuda_version": "12.4", "cuda_driver_version": "12.4"}, "CUDA", "pass"),
        ({"torch_cuda_version": "12.4", "cuda_driver_version": "12.2"}, "CUDA", "warn"),
        ({"torch_cuda_version": "13.0", "cuda_driver_version": "12.8"}, "CUDA", "fail"),
        ({"nccl_pip_version": "2.21.5"}, "NCCL", "pass"),
        ({"torch_version": "2.5.1+cu124"}, "PyTorch", "pass"),
        ({"vllm_version": "0.8.5"}, "vLLM", "pass"),
        ({"gpu_ecc_uncorrectable": 2, "gpu_row_remap_pending": 0}, "GPU health counters", "fail"),
        ({"gpu_ecc_uncorrectable": 0, "gpu_row_remap_pending": 1}, "GPU health counters", "warn"),
        ({"gpu_ecc_uncorrectable": 0, "gpu_row_remap_pending": 0}, "GPU health counters", "pass"),
        ({"nccl_latency_ms": 12.0}, "NCCL collective latency", "pass"),
        ({"nccl_latency_ms": 80.0}, "NCCL collective latency", "warn"),
    ],
)
def test_environment_checks(env, name, status):
    assert _checks(environment=env)[name]["status"] == status


def test_nccl_loaded_differs_from_the_pip_package():
    event = {k: None for k in EVENT_SCHEMA} | {"kind": "nccl_version", "fields": json.dumps({"nccl_version": "2.18.1"})}
    events = pl.DataFrame([event], schema=EVENT_SCHEMA)
    check = _checks(environment={"nccl_pip_version": "2.21.5"}, events=events)["NCCL"]
    assert (check["status"], check["value"]) == ("warn", "2.18.1")


def test_bf16_on_a_gpu_without_bf16_fails():
    config = {"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "bf16"}
    check = _checks(config, {"gpu_names": ["Tesla V100-SXM2-32GB"]})["Mixed precision"]
    assert check["status"] == "fail"
    mismatch = {**config, "actor_rollout_ref.rollout.dtype": "float16"}
    assert _checks(mismatch, {"gpu_names": ["NVIDIA H100 80GB HBM3"]})["Mixed precision"]["status"] == "warn"


def _gpu_series(peaks_mib: dict[int, float], total_mib: float) -> pl.DataFrame:
    rows = []
    for gpu, peak in peaks_mib.items():
        for value in (peak / 2, peak):
            rows.append({"source": "nvidia_smi", "metric": "gpu/memory_used_mib", "rank": gpu, "value": value})
        rows.append({"source": "nvidia_smi", "metric": "gpu/memory_total_mib", "rank": gpu, "value": total_mib})
    return pl.DataFrame([{k: None for k in SERIES_SCHEMA} | r for r in rows], schema=SERIES_SCHEMA)


def test_memory_headroom_names_the_fullest_gpu():
    check = _checks(series=_gpu_series({0: 40000, 1: 130000}, 143771))["GPU memory headroom"]
    assert check["status"] == "warn"
    assert check["value"] == "GPU 1: 127.0 / 140.4 GiB (90%)"
    assert _checks(series=_gpu_series({0: 40000, 1: 60000}, 143771))["GPU memory headroom"]["status"] == "pass"


def test_throughput_stability_after_warm_up():
    rng = np.random.default_rng(0)
    steady = np.r_[500.0, 1500.0, 3000 + rng.normal(0, 60, 60)]
    rows = [
        {k: None for k in SERIES_SCHEMA}
        | {"source": "verl_console", "metric": "perf/throughput", "step": i + 1, "value": v}
        for i, v in enumerate(steady)
    ]
    series = pl.DataFrame(rows, schema=SERIES_SCHEMA)
    check = _checks(series=series)["Throughput stability"]
    assert check["status"] == "pass"
    bouncing = series.with_columns(
        pl.when(pl.col("step") % 2 == 0).then(pl.col("value") * 0.5).otherwise(pl.col("value")).alias("value")
    )
    assert _checks(series=bouncing)["Throughput stability"]["status"] == "warn"
