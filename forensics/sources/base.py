"""What a source module provides: line extractors for text logs, or a reader for a whole file kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
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


@dataclass
class BatchLines:
    """Lines of one batch that matched an extractor, handed to it all at once (see LineExtractor.handle_batch)."""

    file: str
    batch: LineBatch
    rows: np.ndarray  # indexes into batch.lines, ascending
    fctx: FileContext
    described: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # rows a rule matched too

    @property
    def lines(self) -> pl.Series:
        return self.batch.lines.gather(self.rows)

    def line_numbers(self) -> np.ndarray:
        return self.rows + self.batch.first_line


@dataclass
class BatchRead:
    """What LineExtractor.handle_batch did with its lines."""

    left: np.ndarray  # rows it did not read: `handle` reads them one by one
    fields: dict[int, dict[str, Any]] = field(default_factory=dict)  # of the `described` rows it read: their
    # event's fields, should a rule fire on the line (the event's kind is the extractor's name)


@dataclass
class _Repeats:
    """The lines that repeated an event (see Sink.repeat): how many in all, and the last one."""

    event: int  # index into Sink._events
    count: int = 1
    last_line: int = 0
    last_ts: datetime | None = None


@dataclass
class _SampleBlock:
    """Series samples added in bulk: metric names as codes into the sink's name table."""

    source: str
    codes: np.ndarray
    value: pl.Series
    step: pl.Series
    rank: pl.Series | int | None


class Sink:
    """Collects event and series rows from every reader, then builds the two tables."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._series: dict[str, list[Any]] = {k: [] for k in SERIES_SCHEMA}
        self._blocks: list[_SampleBlock] = []
        self._metric_codes: dict[str, int] = {}
        self._repeats: dict[str, _Repeats] = {}
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

    def record(self, rec: LineRecord, repeat_key: str | None = None) -> None:
        """The record as an event; with `repeat_key`, later lines of the same key count as its repeats."""
        if repeat_key is not None:
            self._repeats[repeat_key] = _Repeats(len(self._events), last_line=rec.hit.line, last_ts=rec.hit.ctx.ts)
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

    def knows_repeat(self, key: str) -> bool:
        return key in self._repeats

    def repeat(self, key: str, count: int, line: int, ts: datetime | None) -> None:
        """`count` more lines like the event recorded under `key`, the last of them at `line` (and `ts`)."""
        repeats = self._repeats[key]
        repeats.count += count
        repeats.last_line = line
        repeats.last_ts = ts if ts is not None else repeats.last_ts

    def samples(
        self,
        metric: pl.Series,
        value: pl.Series,
        step: pl.Series,
        *,
        source: str,
        rank: pl.Series | int | None,
        line: pl.Series | None = None,
    ) -> None:
        """Many samples at once, as columns: metric names, Float64 values, Int64 steps, a rank per row or one.

        With `line` (which line each sample was printed on), a metric printed twice on a line keeps its last
        value, as a dict of that line's metrics would.
        """
        if metric.is_empty():
            return
        categories = metric.cast(pl.Categorical)
        present = categories.unique()
        lookup = np.zeros(int(present.to_physical().max()) + 1, dtype=np.uint32)
        for code, name in zip(present.to_physical().to_list(), present.cast(pl.String).to_list(), strict=True):
            lookup[code] = self._metric_codes.setdefault(name, len(self._metric_codes))
        codes = lookup[categories.to_physical().to_numpy()]
        keep = _last_of_each(line.to_numpy(), codes) if line is not None else None
        if keep is not None:
            codes, value, step = codes[keep], value.filter(keep), step.filter(keep)
            rank = rank.filter(keep) if isinstance(rank, pl.Series) else rank
        self._blocks.append(_SampleBlock(source, codes, value, step, rank))

    @property
    def event_count(self) -> int:
        return len(self._events)

    @property
    def sample_count(self) -> int:
        return len(self._series["metric"]) + sum(len(b.codes) for b in self._blocks)

    def events(self) -> pl.DataFrame:
        return _frame(self._event_rows(), EVENT_SCHEMA)

    @staticmethod
    def merge(sinks: list[Sink]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The events and series of many sinks, in order, each table built in one conversion; the sinks'
        samples taken in bulk move into the series (they are not kept twice); one sample per (metric, step,
        rank), from the most precise source that has it (`one_sample_per_step`)."""
        events = _frame([row for sink in sinks for row in sink._event_rows()], EVENT_SCHEMA)
        series = {k: [v for sink in sinks for v in sink._series[k]] for k in SERIES_SCHEMA}
        return events, one_sample_per_step(_with_blocks(_frame(series, SERIES_SCHEMA), sinks, consume=True))

    def series(self) -> pl.DataFrame:
        return _with_blocks(_frame(self._series, SERIES_SCHEMA), [self])

    def _event_rows(self) -> list[dict[str, Any]]:
        """The events, those that repeated with their `repeats` (how many lines in all, the last line and time)."""
        rows = list(self._events)
        for repeats in self._repeats.values():
            if repeats.count > 1:
                row = rows[repeats.event] = dict(rows[repeats.event])
                fields = json.loads(row["fields"])
                last_ts = repeats.last_ts.isoformat() if repeats.last_ts else None
                fields["repeats"] = {"count": repeats.count, "last_line": repeats.last_line, "last_ts": last_ts}
                row["fields"] = json.dumps(fields, default=str)
        return rows


BINCOUNT_MAX = 1 << 24  # (line, metric) pairs counted in one array; more are sorted instead


def _last_of_each(lines: np.ndarray, codes: np.ndarray) -> np.ndarray | None:
    """A mask keeping the last sample of each (line, metric) pair, or None when no pair repeats."""
    width = int(codes.max()) + 1 if len(codes) else 1
    key = lines.astype(np.int64) * width + codes
    if (int(lines.max()) + 1) * width <= BINCOUNT_MAX:
        if np.bincount(key).max() <= 1:
            return None
    elif len(np.unique(key)) == len(key):
        return None
    _, last = np.unique(key[::-1], return_index=True)
    keep = np.zeros(len(key), dtype=bool)
    keep[len(key) - 1 - last] = True
    return keep


def _with_blocks(series: pl.DataFrame, sinks: list[Sink], consume: bool = False) -> pl.DataFrame:
    """The series with the samples the sinks took in bulk, built a column at a time (with `consume`, each
    sink's blocks are let go as soon as a column holds them: they are not kept twice at the peak).

    The metric column is gathered from one table of distinct names: 16 bytes a row, each a view into that
    table (built row by row, each row would hold its name again). A column with one value in all the bulk
    samples (no time; one source; one rank or none) stays one value, when no other sample joins it.
    """
    blocks = [(sink, block) for sink in sinks for block in sink._blocks]
    if not blocks:
        return series
    if consume:
        for sink in sinks:
            sink._blocks = []
    names: dict[str, int] = {}
    to_global = {
        id(sink): np.array([names.setdefault(n, len(names)) for n in sink._metric_codes], dtype=np.uint32)
        for sink in sinks
    }
    codes = np.concatenate([to_global[id(sink)][block.codes] for sink, block in blocks])
    metric = pl.Series("metric", list(names), dtype=SERIES_SCHEMA["metric"]).gather(codes)
    del codes
    rank, source = _one_column([b for _, b in blocks]), _sources(blocks)
    step = pl.concat([block.step for _, block in blocks]).cast(pl.Int64)
    value = pl.concat([block.value for _, block in blocks]).cast(pl.Float64)
    del blocks
    frame = pl.DataFrame({"step": step, "metric": metric, "value": value})
    del step, metric, value
    frame = frame.with_columns(ts=pl.lit(None, SERIES_SCHEMA["ts"]), rank=rank, source=source)
    frame = frame.select(list(SERIES_SCHEMA))
    return pl.concat([series, frame]) if series.height else frame


def _one_column(blocks: list[_SampleBlock]) -> pl.Expr | pl.Series:
    """The blocks' ranks: one value when they share it, else a column."""
    ranks = {b.rank for b in blocks if not isinstance(b.rank, pl.Series)}
    if len(ranks) == 1 and not any(isinstance(b.rank, pl.Series) for b in blocks):
        return pl.lit(ranks.pop(), pl.Int64)
    parts = [b.rank if isinstance(b.rank, pl.Series) else pl.repeat(b.rank, len(b.codes), eager=True) for b in blocks]
    return pl.concat([part.cast(pl.Int64) for part in parts])


def _sources(blocks: list[tuple[Sink, _SampleBlock]]) -> pl.Expr | pl.Series:
    sources = {block.source for _, block in blocks}
    if len(sources) == 1:
        return pl.lit(sources.pop(), SERIES_SCHEMA["source"])
    parts = [pl.repeat(block.source, len(block.codes), dtype=pl.String, eager=True) for _, block in blocks]
    return pl.concat(parts).cast(SERIES_SCHEMA["source"])


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
    unstepped = series["step"].null_count()
    stepped = series.filter(pl.col("step").is_not_null()) if unstepped else series
    if stepped.is_empty():
        return series
    kept_rows = _one_sample_rows(stepped)
    if kept_rows is not None:
        if not unstepped and (kept_rows is EVERY_ROW or len(kept_rows) == series.height):
            return series  # one sample per step already (a single console's): no copy
        kept = stepped[kept_rows]
        return pl.concat([series.filter(pl.col("step").is_null()), kept]) if unstepped else kept
    ranked = stepped.with_columns(
        pl.col("source").replace_strict(SOURCE_PRECISION, default=TEXT_PRECISION, return_dtype=pl.Int8).alias("_p"),
        pl.int_range(pl.len()).alias("_seq"),
    )
    best = ranked.filter(pl.col("_p") == pl.col("_p").max().over("metric", "step"))
    has_rank = pl.col("rank").is_not_null().any().over("metric", "step")
    best = best.filter(pl.col("rank").is_not_null() | ~has_rank)
    kept = best.unique(subset=["metric", "step", "rank"], keep="first", maintain_order=True)
    return pl.concat([series.filter(pl.col("step").is_null()), kept.sort("_seq").drop("_p", "_seq")])


DENSE_KEYS_PER_ROW = 4  # keys up to this many times the rows index arrays; sparser ones are sorted
EVERY_ROW = slice(None)  # what `_one_sample_rows` keeps when it keeps every row (no index array is built)


def _one_sample_rows(stepped: pl.DataFrame) -> np.ndarray | slice | None:
    """The rows `one_sample_per_step` keeps of the stepped samples, in order, found with integer keys in numpy;
    None when the keys do not fit in 64 bits (or a metric is missing), for the polars path.

    Polars' windows over (metric, step) hash every row's string and keep their tables for each of the three
    steps: on 3M samples (a 1 GiB run's 20,000 steps of 150 metrics) the peak RSS went from 0.36 to 1.35 GB.
    """
    n = stepped.height
    metric = stepped["metric"]
    if metric.null_count():
        return None
    codes = metric.cast(pl.Categorical).to_physical().to_numpy()
    step = stepped["step"].to_numpy()
    rank_col = stepped["rank"]
    has_rank = rank_col.is_not_null().to_numpy()
    rank = rank_col.fill_null(0).to_numpy().astype(np.int64) if has_rank.any() else np.zeros(1, dtype=np.int64)
    step_min = int(step.min())
    step_span = int(step.max()) - step_min + 1
    rank_span = int(rank.max()) - int(rank.min()) + 2
    span = (int(codes.max()) + 1) * step_span * rank_span
    if span >= 1 << 62:
        return None
    key_type = np.int32 if span < 1 << 31 else np.int64  # half the memory where the keys fit
    group = codes.astype(key_type)  # (metric, step), computed in place: a 1 GiB run has 3M samples
    del codes
    group *= step_span
    group += step
    group -= step_min
    del step
    groups = int(group.max()) + 1
    if groups > DENSE_KEYS_PER_ROW * n:  # sparse: numbered 0.. in a sort (dense keys index arrays directly)
        _, group = np.unique(group, return_inverse=True)
        groups = int(group.max()) + 1
    sources = stepped["source"].unique()
    if sources.len() == 1:  # one source (a verl run's console): one precision, every sample is of the best
        keep = np.ones(n, dtype=bool)
    else:
        precision = stepped["source"].replace_strict(SOURCE_PRECISION, default=TEXT_PRECISION, return_dtype=pl.Int8)
        precision = precision.to_numpy()
        best = np.full(groups, np.iinfo(np.int8).min, dtype=np.int8)
        np.maximum.at(best, group, precision)
        keep = precision == best[group]  # from the most precise source of its (metric, step)
        del precision, best
    if has_rank.any() and not has_rank.all():
        ranked_group = np.bincount(group[keep & has_rank], minlength=groups) > 0
        keep &= has_rank | ~ranked_group[group]  # a copy without a rank gives way to ranked copies
    if keep.all():  # every row stays: no index arrays (they would take 8 bytes a sample)
        rows, key = None, group
    else:
        rows = np.flatnonzero(keep)
        key = group[rows]
    del keep, group
    if has_rank.any():
        ranked = has_rank if rows is None else has_rank[rows]
        row_rank = rank if rows is None else rank[rows]
        key = key * rank_span + np.where(ranked, row_rank - rank.min() + 1, 0).astype(key_type)
    kept = len(key)
    if int(key.max()) < DENSE_KEYS_PER_ROW * n:  # the first row of each (metric, step, rank)
        seen = np.zeros(int(key.max()) + 1, dtype=bool)
        seen[key] = True
        if np.count_nonzero(seen) == kept:
            return EVERY_ROW if rows is None else rows  # one sample each already
        del seen
        first = np.full(int(key.max()) + 1, kept, dtype=np.int64)
        np.minimum.at(first, key, np.arange(kept))
        first = np.sort(first[first < kept])
    else:
        _, first = np.unique(key, return_index=True)
        first = np.sort(first)
    return first if rows is None else rows[first]


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
    `handle_batch`, when given, receives at once all the lines of a batch that match this extractor, to read
    them in native code; `handle` reads the rows it leaves, one by one, and rules still read the others.
    `folds`: a regex (Python, matched at the line's start; "" for any line) for the lines whose event
    depends on nothing that changes between repeats of one message (numbers, times, neighbouring lines):
    repeats of such a line are counted into the first one's event. None: every line is read.
    `reads_line_above`: for an event that may depend on the lines above it, whether, given the raw line right
    above, it would: such a line is read on its own (the first line of a file has none above; the first line
    of a batch whose line above is out of it is read on its own too).
    `requires`: a second regex (Rust-compatible) a line must match too, anywhere, for `handle` to be given it
    (a trigger's literals find the lines, this says which of them are worth reading: both are decided in Rust).
    `yields_to`: the batch extractors (by name) whose lines this one reads nothing of, when they read them in
    bulk: such a line is not handed to this one's `handle` (nor read one by one for it).
    `literal_prefilter`: False for a trigger whose literals are words most lines hold (a rank's "rank", a host
    name's "gpu", Ray's "WorkerDict"): the literal search would make every such line a candidate, each costing
    Python time; instead Rust searches the whole batch for the trigger, then those lines for `requires`.
    """

    name: str
    source: str
    trigger: str
    handle: Callable[[LineRecord, Sink], None]
    handle_batch: Callable[[BatchLines, Sink], BatchRead] | None = None
    folds: str | None = None
    reads_line_above: Callable[[str], bool] | None = None
    requires: str | None = None
    yields_to: tuple[str, ...] = ()
    literal_prefilter: bool = True


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
