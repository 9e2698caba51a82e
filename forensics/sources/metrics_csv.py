"""Metrics in a CSV table with a step column: Lightning's CSVLogger (`metrics.csv`: `epoch,step,train_loss,...`
with empty cells where a metric was not logged at that step), and the CSVs loops write by hand.

A file is taken only when its header names a step column; every other column whose cells are numbers is
a metric. Values keep their full precision; `nan`/`inf` cells are kept as such, empty cells are missing.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary, without_compression_suffix

SOURCE = "metrics_csv"
STEP_COLUMNS = ("step", "global_step", "_step", "iteration", "trainer/global_step", "Step")
MAX_BYTES = 256 * 1024**2


def _header(head: bytes) -> list[str]:
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip("\r\ufeff")
    try:
        return [c.strip() for c in next(csv.reader([first]), [])]
    except csv.Error:  # a stray carriage return or NUL: not a table this reader takes
        return []


def _sniff(name: str, head: bytes) -> bool:
    return without_compression_suffix(name).endswith(".csv") and any(c in STEP_COLUMNS for c in _header(head))


def _number(cell: str) -> float | None:
    text = cell.strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _rows(rows: Iterator[list[str]], rel: str, result: FileResult) -> Iterator[tuple[int, list[str]]]:
    """(line, cells) after the header, up to a row the csv module cannot parse (a damaged file)."""
    try:
        next(rows, None)
        yield from enumerate(rows, start=2)
    except csv.Error as exc:
        result.warnings.append(f"{rel}: damaged after line {result.lines} ({exc}); the rows before it were read")


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    with open_binary(path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        result.warnings.append(f"{rel}: only the first {MAX_BYTES // 2**20} MiB were read")
        data = data[: data.rfind(b"\n", 0, MAX_BYTES) + 1]
    rows = csv.reader(io.StringIO(data.decode("utf-8", "replace").lstrip("\ufeff"), newline=""))
    header = _header(data)
    step_col = next((i for i, c in enumerate(header) if c in STEP_COLUMNS), None)
    if step_col is None:
        result.warnings.append(f"{rel}: no step column in the header; not read")
        return result
    bad = 0
    for number, row in _rows(rows, rel, result):
        result.lines = number
        step = _number(row[step_col]) if step_col < len(row) else None
        if step is None or not math.isfinite(step):
            bad += 1
            continue
        kept = 0
        for i, cell in enumerate(row):
            if i == step_col or i >= len(header):
                continue
            value = _number(cell)
            if value is not None:
                sink.sample(header[i], value, source=SOURCE, step=int(step))
                kept += 1
        if kept:
            sink.step_marks.append((rel, number, int(step)))
    if bad:
        result.warnings.append(f"{rel}: {bad} row(s) had no step and were skipped")
    return result


FILE_SOURCES = [FileSource("metrics_csv", _sniff, _read)]
