"""Metric records in JSON Lines: verl's file logger (`{"step": N, "data": {...}}`) and flat records
(`{"step": N, "train/loss": ...}`, as many loops and loggers write them), one record a line.

The step is the record's `step` (or `global_step`, `_step`, `iteration`, `trainer/global_step`); nested
objects are flattened with `/`. In verl's nested form a null value is a metric that became non-finite
(orjson writes NaN and inf as null); in a flat record a null is only a missing value. Python's `json`
writes `NaN` and `Infinity`, which are read as such. Values keep their full (float64) precision.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary, without_compression_suffix

SOURCE_NESTED = "verl_file_logger"
SOURCE_FLAT = "metrics_jsonl"
STEP_KEYS = ("step", "global_step", "_step", "iteration", "trainer/global_step", "train/global_step")
MAX_RECORD_BYTES = 64 * 1024**2  # a longer "line" is read in pieces, each a bad record
MAX_DEPTH = 4


def _sniff(name: str, head: bytes) -> bool:
    if not without_compression_suffix(name).endswith((".jsonl", ".ndjson")):
        return False
    first = head.lstrip()[:4096]
    return first.startswith(b"{") and any(f'"{k}"'.encode() in first for k in STEP_KEYS)


def _flatten(record: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < MAX_DEPTH:
            out.update(_flatten(value, name + "/", depth + 1))
        else:
            out[name] = value
    return out


def _step(record: dict[str, Any]) -> int | None:
    for key in STEP_KEYS:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return int(value)
    return None


def _samples(record: dict[str, Any]) -> tuple[int, str, dict[str, Any]] | None:
    """(step, source, metrics) of one record, or None when it is not a metrics record."""
    step = _step(record)
    if step is None:
        return None
    data = record.get("data")
    if isinstance(data, dict) and len(record) <= 3:  # verl: {"step": N, "data": {...}} (maybe a timestamp)
        return step, SOURCE_NESTED, _flatten(data)
    return step, SOURCE_FLAT, {k: v for k, v in _flatten(record).items() if k not in STEP_KEYS}


def _value(raw: Any, null_is_nan: bool) -> float | None:
    if raw is None:
        return math.nan if null_is_nan else None
    if isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, (int, float)):
        return float(raw)
    return None


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    """Every record; a line that is not a metrics record (a truncated last line, a header) is counted and skipped."""
    result = FileResult()
    bad = 0
    with open_binary(path) as fh:
        for number, raw in enumerate(iter(lambda: fh.readline(MAX_RECORD_BYTES), b""), start=1):
            result.lines = number
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                bad += 1
                continue
            parsed = _samples(record) if isinstance(record, dict) else None
            if parsed is None:
                bad += 1
                continue
            step, source, metrics = parsed
            kept = 0
            for metric, raw_value in metrics.items():
                value = _value(raw_value, null_is_nan=source == SOURCE_NESTED)
                if value is not None:
                    sink.sample(metric, value, source=source, step=step)
                    kept += 1
            if kept:
                sink.step_marks.append((rel, number, step))
    if bad:
        result.warnings.append(f"{rel}: {bad} line(s) were not metric records (JSON objects with a step); skipped")
    return result


FILE_SOURCES = [FileSource("metrics_jsonl", _sniff, _read)]
