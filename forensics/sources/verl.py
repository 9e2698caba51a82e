"""verl's trainer output: console step lines and the file logger's JSONL.

Console lines look like `(TaskRunner pid=N) step:12 - actor/pg_loss:-0.0036 - perf/throughput:3283.3`,
with values from `pprint.pformat` (new) or `{v:.3f}` (before verl PR #2303), numpy scalars printed as
`np.float64(0.5)`, and `nan`/`inf` kept as such.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, LineExtractor, LineRecord, Sink
from forensics.textio import open_binary

SOURCE = "verl_console"
STEP_LINE = re.compile(r"(?:^|\s)step:(?P<step>\d+)(?P<kv>(?: - [^\s:][^:]*:\S+)*)")
REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
NUMPY_SCALAR = re.compile(r"^np\.\w+\((?P<v>[^()]*)\)$")


def parse_value(raw: str) -> float | None:
    """A metric value as verl prints it, or None for a non-number."""
    text = raw.strip().rstrip(",")
    m = NUMPY_SCALAR.match(text)
    if m:
        text = m["v"]
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def parse_step_line(body: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) from a console step line, or None when the line is not one."""
    body = REPEATED.sub("", body)
    m = STEP_LINE.search(body)
    if not m:
        return None
    metrics: dict[str, float] = {}
    for part in m["kv"].split(" - ")[1:]:
        key, sep, raw = part.rpartition(":")
        if not sep:
            continue
        value = parse_value(raw)
        if value is not None:
            metrics[key.strip()] = value
    return int(m["step"]), metrics


def _handle_step(rec: LineRecord, sink: Sink) -> None:
    parsed = parse_step_line(rec.hit.ctx.body)
    if parsed is None:
        return
    step, metrics = parsed
    rec.kind = "verl_step"
    rec.source = SOURCE
    rec.notable = False
    rec.fields["step"] = step
    sink.step_marks.append((rec.hit.file, rec.hit.line, step))
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if bad:
        rec.fields["non_finite"] = bad[:20]
    for metric, value in metrics.items():
        sink.sample(metric, value, source=SOURCE, step=step, rank=rec.hit.ctx.rank, ts=rec.hit.ctx.ts)


EXTRACTORS = [LineExtractor("verl_step", SOURCE, r"step:\d+ - [^\s:][^:]*:", _handle_step)]


def _sniff_jsonl(name: str, head: bytes) -> bool:
    return name.endswith(".jsonl") and head.lstrip().startswith(b'{"step"')


def _read_jsonl(path: Path, rel: str, sink: Sink) -> FileResult:
    """verl's file logger: one `{"step": N, "data": {...}}` per line; truncated last lines are skipped."""
    result = FileResult()
    bad = 0
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            result.lines = number
            try:
                row = json.loads(raw)
                step = int(row["step"])
                data = row["data"]
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            for metric, value in data.items():
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)):
                    sink.sample(metric, float(value), source="verl_file_logger", step=step)
    if bad:
        result.warnings.append(f"{rel}: {bad} line(s) were not valid file-logger records and were skipped")
    return result


FILE_SOURCES = [FileSource("verl_jsonl", _sniff_jsonl, _read_jsonl)]
