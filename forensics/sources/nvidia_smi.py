"""`nvidia-smi --query-gpu=... --format=csv` samples: memory, utilisation, power, temperature per GPU.

In the series table these samples carry the GPU index in `rank` (on one host, the local rank).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import polars as pl

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

SOURCE = "nvidia_smi"
MAX_BYTES = 512 * 1024 * 1024
UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
METRICS = {
    "utilization.gpu": "gpu/util_pct",
    "utilization.memory": "gpu/mem_util_pct",
    "memory.used": "gpu/memory_used_mib",
    "memory.total": "gpu/memory_total_mib",
    "memory.free": "gpu/memory_free_mib",
    "temperature.gpu": "gpu/temperature_c",
    "power.draw": "gpu/power_w",
    "clocks.current.sm": "gpu/sm_clock_mhz",
    "clocks.sm": "gpu/sm_clock_mhz",
}


def _sniff(name: str, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    return "," in first and ("utilization.gpu" in first or "memory.used" in first) and "index" in first


def _number(col: str) -> pl.Expr:
    return pl.col(col).str.extract(r"(-?[\d.]+)").cast(pl.Float64, strict=False)


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    with open_binary(path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        result.warnings.append(f"{rel}: only the first {MAX_BYTES // 2**20} MiB of samples were read")
        data = data[: data.rfind(b"\n", 0, MAX_BYTES) + 1]
    try:
        frame = pl.read_csv(
            io.BytesIO(data),
            infer_schema=False,
            truncate_ragged_lines=True,
            ignore_errors=True,
            encoding="utf8-lossy",
        )
    except (pl.exceptions.PolarsError, ValueError) as exc:
        result.warnings.append(f"{rel}: not readable as nvidia-smi CSV: {exc}")
        return result
    frame = frame.rename({c: UNIT.sub("", c).strip() for c in frame.columns})
    frame = frame.with_columns(pl.all().str.strip_chars())
    result.lines = frame.height + 1
    if "index" not in frame.columns:
        result.warnings.append(f"{rel}: no `index` column; samples were not attributed to GPUs")
        return result
    ts = (
        pl.col("timestamp").str.to_datetime("%Y/%m/%d %H:%M:%S%.f", strict=False, time_zone="UTC")
        if "timestamp" in frame.columns
        else pl.lit(None, dtype=pl.Datetime("us", "UTC"))
    )
    frame = frame.with_columns(ts.dt.cast_time_unit("us").alias("_ts"), _number("index").cast(pl.Int64).alias("_gpu"))
    names = frame.get_column("name").unique().to_list() if "name" in frame.columns else []
    if names:
        result.environment["gpu_names"] = sorted(str(n) for n in names if n)
    for column, metric in METRICS.items():
        if column not in frame.columns:
            continue
        values = frame.select("_ts", "_gpu", _number(column).alias("v")).drop_nulls("v")
        for ts_value, gpu, value in values.iter_rows():
            sink.sample(metric, value, source=SOURCE, rank=gpu, ts=ts_value)
    return result


FILE_SOURCES = [FileSource("nvidia_smi_csv", _sniff, _read)]
