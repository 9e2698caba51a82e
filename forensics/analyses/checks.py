"""The health checklist experienced verl users run through before blaming the code.

Each check is a small function that returns `{"name", "status", "value", "detail"}` with status
`pass`, `warn`, `fail` or `unknown` (the run left nothing to judge it by). Checks read the config,
the environment (versions from collect_env, nvidia-smi and the logs), the series and the findings;
they never change the verdict, they tell what else to look at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from forensics.analyses.dynamics.context import GPU_SOURCES, step_curves, warmup_steps
from forensics.model import Finding

MEMORY_WARN = 0.85
MEMORY_FAIL = 0.95
NCCL_LATENCY_MS = 50.0
THROUGHPUT_CV = 0.15
NORMAL_P10_P90 = 2.5631  # P90 - P10 of a normal distribution, in sigmas
MIN_DRIVER = {11: "450.80.02", 12: "525.60.11", 13: "580.65.06"}  # the oldest Linux driver for each CUDA major
NO_BF16_GPUS = re.compile(r"V100|T4\b|P100|P40|P4\b|K80|M60|RTX 20\d\d|GTX|Quadro RTX", re.IGNORECASE)
FP32 = {"fp32", "float32", "float", "torch.float32"}
HALF = {"fp16", "float16", "half", "torch.float16"}
BF16 = {"bf16", "bfloat16", "torch.bfloat16"}


@dataclass
class Inputs:
    events: pl.DataFrame
    series: pl.DataFrame
    findings: list[Finding]
    config: dict[str, Any]
    environment: dict[str, Any]


def _item(name: str, status: str, value: Any, detail: str) -> dict[str, Any]:
    return {"name": name, "status": status, "value": value, "detail": detail}


def _version(text: Any) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))[:3])


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = config.get(key, default)
    if isinstance(value, bool) or value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# --- memory, communication, throughput ------------------------------------------------------------


def check_memory_headroom(inp: Inputs) -> dict[str, Any]:
    name = "GPU memory headroom"
    oom = any(f.cls == "cuda_oom" and f.severity in ("error", "critical") for f in inp.findings)
    gpu = inp.series.filter(pl.col("source").is_in(GPU_SOURCES) & pl.col("rank").is_not_null())
    used = gpu.filter(pl.col("metric") == "gpu/memory_used_mib").group_by("rank").agg(pl.col("value").max())
    total = gpu.filter(pl.col("metric") == "gpu/memory_total_mib").group_by("rank").agg(pl.col("value").max())
    capacity_env = inp.environment.get("gpu_memory_total_mib")
    rows: list[tuple[str, float, float]] = []
    if not used.is_empty():
        caps = dict(total.iter_rows())
        for rank, peak in used.sort("rank").iter_rows():
            cap = caps.get(rank) or capacity_env
            if cap:
                rows.append((f"GPU {rank}", peak / 1024, float(cap) / 1024))
    source = "nvidia-smi"
    if not rows and capacity_env:
        curves = step_curves(inp.series)
        for metric in ("perf/max_memory_reserved_gb", "actor/perf/max_memory_reserved_gb"):
            if metric in curves and np.isfinite(curves[metric].values).any():
                rows.append(("max over ranks", float(np.nanmax(curves[metric].values)), float(capacity_env) / 1024))
                source = metric
                break
    if not rows:
        status = "fail" if oom else "unknown"
        return _item(name, status, "–", "a CUDA OOM occurred" if oom else "no per-GPU memory samples or capacity")
    where, peak, cap = max(rows, key=lambda r: r[1] / r[2])
    share = peak / cap
    status = "fail" if oom or share >= MEMORY_FAIL else "warn" if share >= MEMORY_WARN else "pass"
    detail = f"peak of {len(rows)} GPU(s) from {source}; keep it below {MEMORY_WARN:.0%} of capacity"
    util = inp.config.get("actor_rollout_ref.rollout.gpu_memory_utilization")
    engine = str(inp.config.get("actor_rollout_ref.rollout.name", "")).lower()
    if util is not None and source == "nvidia-smi" and engine in ("vllm", "sglang"):
        detail += f" (the rollout engine preallocates gpu_memory_utilization={util} of each GPU)"
    if oom:
        detail += "; a CUDA out-of-memory error occurred"
    return _item(name, status, f"{where}: {peak:.1f} / {cap:.1f} GiB ({share:.0%})", detail)


def check_nccl_latency(inp: Inputs) -> dict[str, Any]:
    name = "NCCL collective latency"
    value = inp.environment.get("nccl_latency_ms")
    if not isinstance(value, (int, float)):
        return _item(name, "unknown", "–", "no trace or timing of collectives in the run folder")
    status = "pass" if value < NCCL_LATENCY_MS else "warn"
    return _item(name, status, f"{value:.1f} ms", f"median collective latency; expect below {NCCL_LATENCY_MS:.0f} ms")


def check_throughput_stability(inp: Inputs) -> dict[str, Any]:
    name = "Throughput stability"
    curves = step_curves(inp.series)
    metric = next((m for m in ("perf/throughput", "timing_s/step", "perf/time_per_step") if m in curves), None)
    if metric is None:
        return _item(name, "unknown", "–", "no perf/throughput or timing_s/step logged")
    curve = curves[metric].finite()
    judged = curve.values[warmup_steps(len(curve)) :]
    if len(judged) < 5 or np.median(judged) <= 0:
        return _item(name, "unknown", "–", f"too few steps of {metric} after warm-up")
    p10, p90 = np.percentile(judged, [10, 90])
    cv = (p90 - p10) / NORMAL_P10_P90 / float(np.median(judged))
    status = "pass" if cv < THROUGHPUT_CV else "warn"
    return _item(
        name,
        status,
        f"{cv:.1%}",
        f"(P90 - P10) / 2.56 over the median of {metric}, {len(judged)} steps after warm-up (a coefficient of "
        f"variation that a few outliers do not move but a lasting slowdown does); expect below {THROUGHPUT_CV:.0%}",
    )


# --- configuration -------------------------------------------------------------------------------


def _n_gpus(config: dict[str, Any]) -> int | None:
    per_node = _int(config, "trainer.n_gpus_per_node")
    nodes = _int(config, "trainer.nnodes", 1)
    return per_node * nodes if per_node and nodes else None


def _world_size(events: pl.DataFrame) -> int | None:
    init = events.filter(pl.col("kind") == "nccl_init")
    sizes = [json.loads(f).get("nranks") for f in init.get_column("fields").to_list()]
    sizes = [s for s in sizes if isinstance(s, int)]
    return max(sizes) if sizes else None


def check_parallelism(inp: Inputs) -> dict[str, Any]:
    name = "Parallel sizes vs GPUs"
    c = inp.config
    n_gpus = _n_gpus(c)
    if n_gpus is None:
        return _item(name, "unknown", "–", "no trainer.n_gpus_per_node in the config")
    per_node = _int(c, "trainer.n_gpus_per_node") or n_gpus
    problems, notes = [], []
    prefix = "actor_rollout_ref.actor.megatron."
    tp = _int(c, prefix + "tensor_model_parallel_size", 1) or 1
    pp = _int(c, prefix + "pipeline_model_parallel_size", 1) or 1
    cp = _int(c, prefix + "context_parallel_size", 1) or 1
    sp = _int(c, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1) or 1
    if n_gpus % (tp * pp * cp):
        problems.append(f"{n_gpus} GPUs not divisible by tp x pp x cp = {tp}x{pp}x{cp}")
    if n_gpus % sp:
        problems.append(f"{n_gpus} GPUs not divisible by ulysses_sequence_parallel_size={sp}")
    rollout_tp = _int(c, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1) or 1
    if per_node % rollout_tp:
        problems.append(f"n_gpus_per_node={per_node} not divisible by rollout tensor_model_parallel_size={rollout_tp}")
    dp = n_gpus // (tp * pp * cp) if n_gpus % (tp * pp * cp) == 0 else None
    present = inp.environment.get("gpu_count")
    if isinstance(present, int) and present < per_node:
        problems.append(f"config asks for {per_node} GPUs per node but {present} were found")
    world = _world_size(inp.events)
    if world is not None and world != n_gpus:
        notes.append(f"NCCL communicators had up to {world} ranks")
    value = f"{n_gpus} GPUs = tp {tp} x pp {pp} x cp {cp} x dp {dp if dp else '?'}; rollout tp {rollout_tp}"
    detail = "; ".join(problems + notes) or "sizes divide the GPU count"
    return _item(name, "fail" if problems else "pass", value, detail)


def _batch_problems(c: dict[str, Any], role: str, n_gpus: int, rollout_n: int, train_bs: int) -> list[str]:
    """verl's own batch-size rules (verl/utils/config.py, workers/config/actor.py, fsdp_workers.py)."""
    problems = []
    mini = _int(c, f"{role}.ppo_mini_batch_size")
    micro = _int(c, f"{role}.ppo_micro_batch_size")
    micro_gpu = _int(c, f"{role}.ppo_micro_batch_size_per_gpu")
    dynamic = bool(c.get(f"{role}.use_dynamic_bsz"))
    sp = _int(c, f"{role}.ulysses_sequence_parallel_size", 1) or 1
    if micro is not None and micro_gpu is not None:
        problems.append(f"{role}: both ppo_micro_batch_size and ppo_micro_batch_size_per_gpu are set")
    if not dynamic and micro is None and micro_gpu is None and mini is not None:
        problems.append(f"{role}: set ppo_micro_batch_size_per_gpu (or use_dynamic_bsz)")
    if mini is None:
        return problems
    if train_bs < mini:
        problems.append(f"train_batch_size ({train_bs}) < {role}.ppo_mini_batch_size ({mini})")
    dp = max(1, n_gpus // sp)
    if (mini * rollout_n) % dp:
        problems.append(
            f"{role}.ppo_mini_batch_size x rollout.n = {mini * rollout_n} is not divisible by the {dp} "
            "data-parallel ranks"
        )
        return problems
    per_rank = mini * rollout_n // dp
    if per_rank <= 0:
        problems.append(f"{role}.ppo_mini_batch_size is 0 per rank after normalisation")
    elif micro_gpu and not dynamic and per_rank % micro_gpu:
        problems.append(
            f"{role}: mini-batch per rank ({per_rank}) is not divisible by ppo_micro_batch_size_per_gpu ({micro_gpu})"
        )
    return problems


def check_batch_sizes(inp: Inputs) -> dict[str, Any]:
    name = "Batch sizes"
    c = inp.config
    n_gpus = _n_gpus(c)
    train_bs = _int(c, "data.train_batch_size")
    if n_gpus is None or train_bs is None:
        return _item(name, "unknown", "–", "no data.train_batch_size / trainer.n_gpus_per_node in the config")
    rollout_n = _int(c, "actor_rollout_ref.rollout.n", 1) or 1
    problems = []
    if (train_bs * rollout_n) % n_gpus:
        problems.append(f"train_batch_size x rollout.n = {train_bs * rollout_n} is not divisible by {n_gpus} GPUs")
    problems += _batch_problems(c, "actor_rollout_ref.actor", n_gpus, rollout_n, train_bs)
    if any(k.startswith("critic.ppo_mini_batch_size") for k in c) and c.get("critic.enable") is not False:
        problems += _batch_problems(c, "critic", n_gpus, rollout_n, train_bs)
    mini = c.get("actor_rollout_ref.actor.ppo_mini_batch_size")
    micro = c.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    value = f"train {train_bs} x n {rollout_n}, mini {mini}, micro/GPU {micro}"
    return _item(name, "fail" if problems else "pass", value, "; ".join(problems) or "mini/micro batches divide evenly")


def check_mixed_precision(inp: Inputs) -> dict[str, Any]:
    name = "Mixed precision"
    c = inp.config
    mp = "actor_rollout_ref.actor.fsdp_config.mixed_precision."
    param = str(c.get(mp + "param_dtype", "")).lower() or None
    reduce = str(c.get(mp + "reduce_dtype", "")).lower() or None
    rollout = str(c.get("actor_rollout_ref.rollout.dtype", "")).lower() or None
    if not any((param, reduce, rollout)):
        return _item(name, "unknown", "–", "no dtype settings in the config (verl defaults: bf16 params, fp32 reduce)")
    problems, warnings = [], []
    names = " ".join(inp.environment.get("gpu_names", []) or [])
    uses_bf16 = any(d in BF16 for d in (param, reduce, rollout) if d)
    if uses_bf16 and NO_BF16_GPUS.search(names):
        problems.append(f"bf16 configured but {names} has no bf16 support")
    if reduce and reduce not in FP32:
        warnings.append(f"gradients reduced in {reduce}: keep reduce_dtype fp32")
    if param in HALF:
        warnings.append("fp16 parameters need loss scaling; prefer bf16")
    if param and rollout and (param in BF16) != (rollout in BF16):
        warnings.append(f"rollout dtype {rollout} differs from training dtype {param}: log-probs will not match")
    status = "fail" if problems else "warn" if warnings else "pass"
    value = f"params {param or 'default'}, reduce {reduce or 'default'}, rollout {rollout or 'default'}"
    return _item(name, status, value, "; ".join(problems + warnings) or "consistent")


# --- software and hardware -------------------------------------------------------------------------


def check_driver(inp: Inputs) -> dict[str, Any]:
    name = "NVIDIA driver"
    driver = inp.environment.get("driver_version")
    if not driver:
        return _item(name, "unknown", "–", "no nvidia-smi -q, collect_env or dcgm-exporter output in the run folder")
    cuda_major = (_version(inp.environment.get("torch_cuda_version")) or (12,))[0]
    need = MIN_DRIVER.get(cuda_major, MIN_DRIVER[12])
    ok = _version(driver) >= _version(need)
    detail = f"CUDA {cuda_major} needs {need} or newer"
    return _item(name, "pass" if ok else "fail", driver, detail)


def check_cuda(inp: Inputs) -> dict[str, Any]:
    name = "CUDA"
    env = inp.environment
    built, driver_max = env.get("torch_cuda_version"), env.get("cuda_driver_version")
    runtime = env.get("cuda_runtime_version")
    parts = [f"torch built for {built}" if built else "", f"driver supports {driver_max}" if driver_max else ""]
    parts.append(f"runtime {runtime}" if runtime else "")
    value = ", ".join(p for p in parts if p) or "–"
    if not built or not driver_max:
        return _item(name, "unknown" if value == "–" else "pass", value, "need both torch's CUDA and the driver's")
    b, d = _version(built)[:2], _version(driver_max)[:2]
    if b[0] > d[0]:
        return _item(name, "fail", value, f"torch needs CUDA {built} but the driver only supports {driver_max}")
    if b > d:
        return _item(name, "warn", value, "relies on CUDA minor-version compatibility; upgrade the driver")
    return _item(name, "pass", value, "the driver supports torch's CUDA")


def _nccl_logged(events: pl.DataFrame) -> str | None:
    rows = events.filter(pl.col("kind") == "nccl_version").get_column("fields").to_list()
    for raw in rows:
        version = json.loads(raw).get("nccl_version")
        if version:
            return str(version)
    return None


def check_nccl_version(inp: Inputs) -> dict[str, Any]:
    name = "NCCL"
    logged = _nccl_logged(inp.events)
    pip = inp.environment.get("nccl_pip_version")
    if not logged and not pip:
        return _item(name, "unknown", "–", "set NCCL_DEBUG=VERSION (or INFO) to log it")
    value = logged or str(pip)
    if logged and pip and _version(logged) != _version(pip):
        return _item(name, "warn", value, f"loaded NCCL {logged} but the pip package is {pip}: another libnccl wins")
    source = "logged by NCCL" if logged else "pip package"
    return _item(name, "pass", value, source)


def _version_item(name: str, key: str, hint: str) -> Callable[[Inputs], dict[str, Any]]:
    def check(inp: Inputs) -> dict[str, Any]:
        value = inp.environment.get(key)
        return (
            _item(name, "pass", str(value), "found in the run's logs and dumps")
            if value
            else _item(name, "unknown", "–", hint)
        )

    check.__name__ = f"check_{key}"
    return check


def check_gpu_health(inp: Inputs) -> dict[str, Any]:
    name = "GPU health counters"
    env = inp.environment
    if not any(k in env for k in ("gpu_ecc_uncorrectable", "gpu_row_remap_pending", "gpu_clock_slowdown")):
        return _item(name, "unknown", "–", "no nvidia-smi -q dump in the run folder")
    ecc = env.get("gpu_ecc_uncorrectable", 0) or 0
    pending = env.get("gpu_row_remap_pending", 0) or 0
    failure = env.get("gpu_row_remap_failure", 0) or 0
    slow = env.get("gpu_clock_slowdown") or []
    value = f"{ecc} uncorrectable ECC, {pending} pending row remaps"
    if ecc or failure:
        return _item(name, "fail", value, "uncorrectable memory errors: drain the node and reset or replace the GPU")
    if pending or slow:
        detail = "; ".join([*(["row remapping pending: reset the GPU"] if pending else []), *slow])
        return _item(name, "warn", value, detail)
    return _item(name, "pass", value, "no memory errors or clock slowdowns")


CHECKS: tuple[Callable[[Inputs], dict[str, Any]], ...] = (
    check_memory_headroom,
    check_nccl_latency,
    check_throughput_stability,
    check_parallelism,
    check_batch_sizes,
    check_mixed_precision,
    check_driver,
    check_cuda,
    check_nccl_version,
    _version_item("PyTorch", "torch_version", "no collect_env dump in the run folder"),
    _version_item("vLLM", "vllm_version", "no vLLM engine banner or collect_env line"),
    check_gpu_health,
)


def health_checks(
    events: pl.DataFrame,
    series: pl.DataFrame,
    findings: list[Finding],
    config: dict[str, Any],
    environment: dict[str, Any],
) -> list[dict[str, Any]]:
    """The checklist for one run, in a fixed order."""
    inp = Inputs(events, series, findings, config, environment)
    return [check(inp) for check in CHECKS]
