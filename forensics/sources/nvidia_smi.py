"""nvidia-smi sampling output: `--query-gpu=... --format=csv` and `nvidia-smi dmon`, per GPU over time.

In the series table these samples carry the GPU index in `rank` (on one host, the local rank).
`dmon` prints two `#` header lines (names, units; repeated now and then), one row per GPU per
interval, `-` for an unsupported field, and with `-o DT` a date and a time column first.
"""

from __future__ import annotations

import io
import re
from datetime import datetime, timezone
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
    result.environment["gpu_count"] = frame.get_column("_gpu").drop_nulls().n_unique()
    if "memory.total" in frame.columns:
        total = frame.select(_number("memory.total")).to_series().max()
        if total is not None:
            result.environment["gpu_memory_total_mib"] = float(total)
    for column, metric in METRICS.items():
        if column not in frame.columns:
            continue
        values = frame.select("_ts", "_gpu", _number(column).alias("v")).drop_nulls("v")
        for ts_value, gpu, value in values.iter_rows():
            sink.sample(metric, value, source=SOURCE, rank=gpu, ts=ts_value)
    return result


DMON_METRICS = {
    "pwr": "gpu/power_w",
    "gtemp": "gpu/temperature_c",
    "temp": "gpu/temperature_c",
    "sm": "gpu/util_pct",
    "mem": "gpu/mem_util_pct",
    "fb": "gpu/memory_used_mib",
    "pclk": "gpu/sm_clock_mhz",
}
DMON_HEADER = re.compile(r"^#\s*(?:Date\s+Time\s+)?gpu\b", re.IGNORECASE)


def _sniff_dmon(name: str, head: bytes) -> bool:
    lines = head.decode("utf-8", "replace").lstrip().splitlines()
    return len(lines) >= 2 and bool(DMON_HEADER.match(lines[0])) and "Idx" in lines[1]


def _dmon_time(date: str, time: str) -> datetime | None:
    try:
        return datetime.strptime(f"{date} {time}", "%Y%m%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _read_dmon(path: Path, rel: str, sink: Sink) -> FileResult:
    """One sample per GPU, interval and supported column; rows that do not fit the header are counted."""
    result = FileResult()
    columns: list[str] = []
    gpus: set[int] = set()
    bad = 0
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            result.lines = number
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            if line.startswith("#"):
                names = line.lstrip("#").split()
                if names and names[0].lower() in ("gpu", "date"):
                    columns = [n.lower() for n in names]
                continue
            values = line.split()
            if not columns or len(values) != len(columns):
                bad += 1
                continue
            row = dict(zip(columns, values, strict=True))
            try:
                gpu = int(row["gpu"])
            except (KeyError, ValueError):
                bad += 1
                continue
            gpus.add(gpu)
            ts = _dmon_time(row["date"], row["time"]) if "date" in row and "time" in row else None
            for column, metric in DMON_METRICS.items():
                try:
                    value = float(row[column])
                except (KeyError, ValueError):  # absent, or `-` for a field this GPU does not support
                    continue
                sink.sample(metric, value, source=SOURCE, rank=gpu, ts=ts)
    if bad:
        result.warnings.append(f"{rel}: {bad} dmon row(s) did not match the header and were skipped")
    if gpus:
        result.environment["gpu_count"] = len(gpus)
    return result


FILE_SOURCES = [FileSource("nvidia_smi_csv", _sniff, _read), FileSource("nvidia_smi_dmon", _sniff_dmon, _read_dmon)]
