"""MLflow's file store (`mlruns/<experiment>/<run>/metrics/<key>`): one file per metric, one
`<timestamp ms> <value> <step>` line per logged value, keys with `/` as sub-folders.

The format is plain text, so no MLflow install is needed to read it. The metric's name is its path under
`metrics/`; the timestamp becomes the sample's time.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

SOURCE = "mlflow"
LINE = re.compile(rb"^(\d{10,13}) (\S+) (-?\d+)\s*$")
MAX_LINES = 10_000_000


def _sniff(name: str, head: bytes) -> bool:
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()] or [head.strip()]
    return bool(lines[0]) and all(LINE.match(line) for line in lines[:20])


def _metric_name(rel: str) -> str:
    parts = rel.split("/")
    if "metrics" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("metrics") + 1 :])
    return parts[-1]


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    metric = _metric_name(rel)
    bad = 0
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            if number > MAX_LINES:
                result.warnings.append(f"{rel}: only the first {MAX_LINES} values were read")
                break
            result.lines = number
            m = LINE.match(raw)
            if not m:
                bad += 1
                continue
            try:
                value = float(m[2])
            except ValueError:
                bad += 1
                continue
            when = datetime.fromtimestamp(int(m[1]) / 1000, timezone.utc)
            sink.sample(metric, value, source=SOURCE, step=int(m[3]), ts=when)
    if bad:
        result.warnings.append(f"{rel}: {bad} line(s) were not `timestamp value step` and were skipped")
    return result


FILE_SOURCES = [FileSource("mlflow_metric", _sniff, _read)]
