"""What a source module provides: line extractors for text logs, or a reader for a whole file kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.line_prefixes import FileContext, LineContext
from forensics.model import EVENT_SCHEMA, MESSAGE_CAP, SERIES_SCHEMA
from forensics.textio import LineBatch


@dataclass
class Hit:
    """A line that matched a trigger, with access to its neighbours in the batch."""

    file: str
    line: int
    text: str
    ctx: LineContext
    batch: LineBatch
    index: int
    fctx: FileContext

    def following(self, n: int) -> list[str]:
        end = min(len(self.batch.lines), self.index + 1 + n)
        return [self.batch.text(i) for i in range(self.index + 1, end)]

    def preceding(self, n: int) -> list[str]:
        start = max(0, self.index - n)
        return [self.batch.text(i) for i in range(start, self.index)]


@dataclass
class LineRecord:
    """The event a hit line becomes; extractors and rules fill it in."""

    hit: Hit
    kind: str | None = None
    source: str = "log"
    fields: dict[str, Any] = field(default_factory=dict)
    rules: list[str] = field(default_factory=list)
    level: str | None = None
    notable: bool = True  # False: keep the line only when a rule also fires on it
    ts_inferred: bool = False  # ctx.ts was read from an earlier line, not from this one


class Sink:
    """Collects event and series rows from every reader, then builds the two tables."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._series: dict[str, list[Any]] = {k: [] for k in SERIES_SCHEMA}
        self.step_marks: list[tuple[str, int, int]] = []  # (file, line, step) of each step line
        self.config: dict[str, Any] = {}  # flattened dotted keys printed in a text log (verl's config dump)
        self.environment: dict[str, Any] = {}  # versions and hardware named in a text log
        self.counters: dict[tuple[str, str], int] = {}  # per-file counts a reader keeps (a dict log's n-th record)

    def event(
        self,
        *,
        file: str,
        line: int,
        source: str,
        kind: str,
        message: str,
        ts: datetime | None = None,
        host: str | None = None,
        pid: int | None = None,
        rank: int | None = None,
        role: str | None = None,
        level: str | None = None,
        fields: dict[str, Any] | None = None,
        ts_inferred: bool = False,
    ) -> None:
        self._events.append(
            {
                "ts": ts,
                "ts_inferred": ts_inferred,
                "file": file,
                "line": line,
                "source": source,
                "host": host,
                "pid": pid,
                "rank": rank,
                "role": role,
                "level": level,
                "kind": kind,
                "message": message[:MESSAGE_CAP],
                "fields": json.dumps(fields or {}, default=str),
            }
        )

    def record(self, rec: LineRecord) -> None:
        ctx = rec.hit.ctx
        fields = dict(rec.fields)
        if rec.rules:
            fields["rules"] = rec.rules
        self.event(
            file=rec.hit.file,
            line=rec.hit.line,
            source=rec.source,
            kind=rec.kind or "match",
            message=ctx.body,
            ts=ctx.ts,
            host=ctx.host,
            pid=ctx.pid,
            rank=ctx.rank,
            role=ctx.role,
            level=rec.level or ctx.level,
            fields=fields,
            ts_inferred=rec.ts_inferred,
        )

    def sample(
        self,
        metric: str,
        value: float,
        *,
        source: str,
        step: int | None = None,
        rank: int | None = None,
        ts: datetime | None = None,
    ) -> None:
        s = self._series
        s["ts"].append(ts)
        s["step"].append(step)
        s["rank"].append(rank)
        s["source"].append(source)
        s["metric"].append(metric)
        s["value"].append(value)

    @property
    def event_count(self) -> int:
        return len(self._events)

    @property
    def sample_count(self) -> int:
        return len(self._series["metric"])

    def events(self) -> pl.DataFrame:
        return _frame(self._events, EVENT_SCHEMA)

    @staticmethod
    def merge(sinks: list[Sink]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The events and series of many sinks, in order, each table built in one conversion; one sample per
        (metric, step, rank), from the most precise source that has it (`one_sample_per_step`)."""
        events = _frame([row for sink in sinks for row in sink._events], EVENT_SCHEMA)
        series = {k: [v for sink in sinks for v in sink._series[k]] for k in SERIES_SCHEMA}
        return events, one_sample_per_step(_frame(series, SERIES_SCHEMA))

    def series(self) -> pl.DataFrame:
        return _frame(self._series, SERIES_SCHEMA)


# How exactly a source keeps a value: structured files hold float64, TensorBoard float32, text lines what was printed
# (verl before PR #2303 printed three decimals: a learning rate of 3e-4 reads 0.0).
SOURCE_PRECISION = {
    "verl_file_logger": 3,
    "metrics_jsonl": 3,
    "metrics_csv": 3,
    "mlflow": 3,
    "wandb": 3,
    "tensorboard": 2,
}
TEXT_PRECISION = 1


def one_sample_per_step(series: pl.DataFrame) -> pl.DataFrame:
    """One sample per (metric, step, rank): the same step logged by the console, each rank's stdout, the file
    logger and TensorBoard is one value, not four, and it comes from the most precise source.

    A copy without a rank (the driver's console) gives way to the ranked copies of the same precision (the
    same print, seen in that rank's own stdout). Samples without a step (GPU samples over time) are kept.
    """
    stepped = series.filter(pl.col("step").is_not_null())
    if stepped.is_empty():
        return series
    ranked = stepped.with_columns(
        pl.col("source").replace_strict(SOURCE_PRECISION, default=TEXT_PRECISION, return_dtype=pl.Int8).alias("_p"),
        pl.int_range(pl.len()).alias("_seq"),
    )
    best = ranked.filter(pl.col("_p") == pl.col("_p").max().over("metric", "step"))
    has_rank = pl.col("rank").is_not_null().any().over("metric", "step")
    best = best.filter(pl.col("rank").is_not_null() | ~has_rank)
    kept = best.unique(subset=["metric", "step", "rank"], keep="first", maintain_order=True)
    return pl.concat([series.filter(pl.col("step").is_null()), kept.sort("_seq").drop("_p", "_seq")])


def _frame(data: Any, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The table, with lone surrogates replaced when a reader let one through (Arrow holds UTF-8 only).

    JSON decodes `"\\ud800"` and pickles decode `surrogatepass` bytes into such strings; checking at
    the end costs nothing on the normal path.
    """
    try:
        return pl.DataFrame(data, schema=schema)
    except UnicodeEncodeError:
        return pl.DataFrame(_without_surrogates(data), schema=schema)


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_surrogates(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class LineExtractor:
    """Structure read from text-log lines that match `trigger` (a Rust-compatible regex).

    `handle` receives the line's record and may set its kind and fields, and add series samples.
    """

    name: str
    source: str
    trigger: str
    handle: Callable[[LineRecord, Sink], None]


@dataclass
class FileResult:
    """What a whole-file reader found besides rows in the sink."""

    note: str = ""
    lines: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FileSource:
    """A reader for one structured file kind (JSONL, CSV, pickle dumps, SQLite, traces)."""

    kind: str
    sniff: Callable[[str, bytes], bool]
    read: Callable[[Path, str, Sink], FileResult]
