"""PyTorch profiler (Kineto) traces, `*.pt.trace.json[.gz]`, one per rank: where each GPU's time went.

A trace of a few training steps is hundreds of MB of pretty-printed JSON, most of it CPU operators. It
is never parsed whole: the bytes stream through in 256 KiB chunks; a vectorised scan (numpy over the raw
bytes: quotes, escapes, bracket depth) finds the elements of `traceEvents`, and another (numpy again)
the few that hold a GPU category or `ProfilerStep#`; only those are decoded, by polars in Rust and with
only the fields needed. Memory holds one chunk and the GPU activity (a few dozen bytes per kernel),
whatever the size; Arrow (pyarrow) is never loaded.

Format (reference §5): GPU events have `pid` = device, `ts`/`dur` in µs from `baseTimeNanoseconds`;
the rank is `distributedInfo.rank` — a trace without it is never silently rank 0.
"""

from __future__ import annotations

import io
import json
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.sources.gputrace import (
    COMMUNICATION,
    COMPUTE,
    EXTRAS_KEY,
    SLOWEST_NCCL,
    TOP_GAPS,
    TOP_KERNELS,
    DeviceTrace,
    KernelStat,
    NcclStat,
    SyncTimeline,
    TraceFile,
    build_timeline,
    comm_kernels,
    nccl_op,
    normalise_collective,
    rank_from_file_name,
    record_samples,
)
from forensics.textio import open_binary

SOURCE = "kineto"
CHUNK_BYTES = 256 * 1024  # peak memory grows with it (512 KiB: +8 MiB, two ranks read at once; 4% faster)
MAX_ELEMENT_BYTES = 256 * 1024 * 1024  # one event larger than this means the file is not a trace
PENDING_ROWS = 1_000  # parsed GPU events held before interning their names (a few hundred KB)
MAX_TAIL_BYTES = 16 * 1024 * 1024  # the keys after `traceEvents` are a few short values
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
KEEP_MARKERS = (b'"kernel"', b'"gpu_memcpy"', b'"gpu_memset"', b'"Kernel"', b'"Memcpy"', b'"Memset"', b"ProfilerStep#")
# each marker's first four bytes as one little-endian integer, the key of the vectorised search
MARKER_HEADS = np.unique(np.array([int.from_bytes(m[:4], "little") for m in KEEP_MARKERS], dtype=np.uint32))
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
WORKER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json")
EPOCH_US = 1e15  # older traces carry absolute µs timestamps and no baseTimeNanoseconds
_ARGS = {
    "Collective name": pl.String,
    "device": pl.String,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "Process Group Name": pl.String,
}
EVENT_SCHEMA = {
    "ph": pl.String,
    "cat": pl.String,
    "name": pl.String,
    "pid": pl.String,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "args": pl.Struct(_ARGS),
}
_NO_EVENTS = pl.DataFrame(schema=EVENT_SCHEMA)
_NEWLINES = bytes.maketrans(b"\n\r", b"  ")
_QUOTE, _BACKSLASH, _COMMA, _SQUARE = 34, 92, 44, 91
_FOLD = 0x20  # OR-ing it folds `[` onto `{` and `]` onto `}`, and no other byte onto either
_OPEN, _CLOSE = 123, 125  # { }


# older Kineto (2022) writes no schemaVersion, puts distributedInfo last and names categories `Kernel`, `Runtime`
_OLD_LAYOUT = re.compile(rb'"ph"\s*:\s*"X"\s*,\s*"cat"\s*:\s*"(?:Kernel|Runtime|Operator|cpu_op|kernel)"')


def _sniff(name: str, head: bytes) -> bool:
    if name.endswith((".pt.trace.json", ".pt.trace.json.gz")):
        return True
    if not name.endswith((".json", ".json.gz")) or b'"traceEvents"' not in head:
        return False
    markers = (b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
    return any(k in head for k in markers) or _OLD_LAYOUT.search(head) is not None


# --- the byte-level scan ---------------------------------------------------------------------------


def _prefix_parity(bits: np.ndarray) -> np.ndarray:
    """Running XOR of a bool array, 64 elements at a time: bit-packed words, a prefix XOR inside each word
    by shifts, then one carry per word. Several times faster than `np.bitwise_xor.accumulate` per byte."""
    if sys.byteorder != "little":
        return np.bitwise_xor.accumulate(bits.view(np.uint8)).view(bool)
    packed = np.packbits(bits, bitorder="little")
    words = np.zeros((packed.size + 7) // 8, dtype=np.uint64)
    words.view(np.uint8)[: packed.size] = packed
    for shift in (1, 2, 4, 8, 16, 32):
        words ^= words << np.uint64(shift)
    carry = np.zeros_like(words)
    carry[1:] = np.bitwise_xor.accumulate(words[:-1] >> np.uint64(63))
    words ^= carry * np.uint64(0xFFFFFFFFFFFFFFFF)
    return np.unpackbits(words.view(np.uint8), count=bits.size, bitorder="little").view(bool)


def _outside_strings(buf: np.ndarray) -> np.ndarray:
    """True for every byte outside a JSON string: a running parity of the unescaped quotes."""
    quote = buf == _QUOTE
    backslashes = np.flatnonzero(buf == _BACKSLASH)
    if backslashes.size:  # a quote after an odd run of backslashes is text, not a delimiter
        after = backslashes[(backslashes + 1 < buf.size)]
        after = after[buf[after + 1] == _QUOTE]
        if after.size:
            run_start = np.ones(backslashes.size, dtype=bool)
            run_start[1:] = backslashes[1:] != backslashes[:-1] + 1
            first_of_run = np.maximum.accumulate(np.where(run_start, np.arange(backslashes.size), 0))
            last = np.searchsorted(backslashes, after)
            quote[after[(last - first_of_run[last] + 1) % 2 == 1] + 1] = False
    inside = _prefix_parity(quote)
    return np.logical_not(inside, out=inside)


@dataclass
class _Structure:
    """Brackets outside strings with the nesting depth after each, and the separators at depth 0."""

    brackets: np.ndarray
    depth_after: np.ndarray
    separators: np.ndarray


def _brackets(buf: np.ndarray, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets of the brackets outside strings, and whether each opens. Temporaries are byte-sized masks
    of the whole chunk, so there are as few as can be: they make the reader's peak memory."""
    folded = buf | _FOLD
    opening = folded == _OPEN
    opening &= outside
    bracket = folded == _CLOSE
    bracket &= outside
    bracket |= opening
    offsets = np.flatnonzero(bracket)
    return offsets, opening[offsets]


def _commas(buf: np.ndarray, outside: np.ndarray) -> np.ndarray:
    comma = buf == _COMMA
    comma &= outside
    return np.flatnonzero(comma)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if values.size else values


def _structure(buf: np.ndarray) -> _Structure:
    outside = _outside_strings(buf)
    brackets, opens = _brackets(buf, outside)
    depth_after = np.cumsum(np.where(opens, 1, -1))
    commas = _commas(buf, outside)
    # a separator is the first comma after the start or after an element closes, with no bracket between
    after = np.concatenate(([-1], brackets[depth_after == 0]))
    first = np.searchsorted(commas, after)
    candidates = commas[first[first < commas.size]]
    last_bracket = np.searchsorted(brackets, candidates) - 1
    at_depth_0 = np.where(last_bracket >= 0, depth_after[np.maximum(last_bracket, 0)] == 0, True)
    return _Structure(brackets, depth_after, _sorted_unique(candidates[at_depth_0]))  # already in order


@dataclass
class _Elements:
    """Whole elements of `traceEvents` as raw JSON, and the offsets of the commas between them."""

    region: bytes
    separators: np.ndarray


@dataclass
class _Split:
    """The raw JSON outside `traceEvents`, kept while its elements stream through."""

    head: bytes = b""
    tail: bytes = b""
    found: bool = False
    closed: bool = False
    warnings: list[str] = field(default_factory=list)


def _find_array_start(data: bytes) -> int | None:
    """Offset just after the `[` of the top-level `"traceEvents": [`."""
    s = _structure(np.frombuffer(data, dtype=np.uint8))
    for pos, depth in zip(s.brackets.tolist(), s.depth_after.tolist(), strict=True):
        if depth == 2 and data[pos] == _SQUARE and re.search(rb'"traceEvents"\s*:\s*$', data[max(0, pos - 64) : pos]):
            return pos + 1
    return None


def split_trace_events(stream: io.BufferedIOBase, split: _Split, chunk_bytes: int = 0) -> Iterator[_Elements]:
    """Yield the `traceEvents` elements a chunk at a time; keep the rest of the document in `split`."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    data = b""
    while not split.found:
        block = stream.read(max(chunk_bytes, len(data)))
        data += block
        start = _find_array_start(data)
        if start is not None:
            split.head, data, split.found = data[: start - 1], data[start:], True
        elif not block or len(data) > MAX_ELEMENT_BYTES:
            split.warnings.append("no top-level `traceEvents` array")
            return
    eof = False
    window = chunk_bytes  # bytes scanned at a time (memory scales with it), doubled while no event fits
    while True:
        if not eof and len(data) < window:
            block = stream.read(window - len(data))
            eof = not block
            data += block
        s = _structure(np.frombuffer(data, dtype=np.uint8))
        separators = s.separators
        closing = np.flatnonzero(s.depth_after < 0)
        if closing.size:  # the `]` of traceEvents
            close = int(s.brackets[closing[0]])
            yield _Elements(data[:close], separators[separators < close])
            split.tail, split.closed = data[close + 1 :] + stream.read(MAX_TAIL_BYTES), True
            return
        complete = np.flatnonzero(s.depth_after == 0)
        if complete.size:
            cut = int(s.brackets[complete[-1]]) + 1
            yield _Elements(data[:cut], separators[separators < cut])
            data = data[cut:]
            window = max(chunk_bytes, 2 * len(data))  # what is left is one unfinished event
        else:
            window = 2 * max(window, len(data))
        if eof:
            if data.strip(b" \t\r\n,"):
                split.warnings.append("the file ends inside `traceEvents` (truncated?); the events before it were read")
            return
        if len(data) > MAX_ELEMENT_BYTES:
            split.warnings.append(f"an event larger than {MAX_ELEMENT_BYTES // 2**20} MiB; reading stopped there")
            return


# --- events to frames ------------------------------------------------------------------------------


def _marker_starts(region: bytes) -> list[int]:
    """Where a marker starts in `region`. Every 4-byte window is compared, as one integer, with the markers'
    first four bytes (four views, at offsets 0 to 3, hold every window); the few hits are then confirmed.
    As fast as a regex over the region cut into lines (which needs Arrow to be cheap), and nothing is copied."""
    found = []
    for offset in range(min(4, len(region) - 3)):
        words = np.frombuffer(region, dtype="<u4", count=(len(region) - offset) // 4, offset=offset)
        hit = words == MARKER_HEADS[0]
        for head in MARKER_HEADS[1:]:
            hit |= words == head
        found.append(np.flatnonzero(hit) * 4 + offset)
    starts = np.sort(np.concatenate(found)).tolist() if found else []
    return [p for p in starts if region.startswith(KEEP_MARKERS, p)]


def _marked_events(chunk: _Elements) -> list[bytes]:
    """The elements holding a marker (GPU categories, `ProfilerStep#`), raw newlines made spaces: whitespace
    to JSON, and inside a string (where JSON forbids them) what keeps the event readable."""
    separators = chunk.separators
    which = _sorted_unique(np.searchsorted(separators, _marker_starts(chunk.region)))
    starts = np.concatenate(([0], separators + 1))[which].tolist()
    ends = np.append(separators, len(chunk.region))[which].tolist()
    return [chunk.region[s:e].translate(_NEWLINES) for s, e in zip(starts, ends, strict=True)]


def _parse_block(chunk: _Elements, bad_lines: list[int]) -> pl.DataFrame:
    """The GPU and step events of a chunk, parsed in Rust with only the needed fields.

    Elements are first kept by a literal marker (GPU categories, `ProfilerStep#`), so the CPU operators
    that make most of a trace are never decoded. Lines polars refuses (invalid UTF-8, NaN literals) go
    through Python's json one by one.
    """
    lines = _marked_events(chunk)
    if not lines:  # most chunks: Kineto writes the CPU operators first, then the GPU activity
        return _NO_EVENTS
    try:
        text = pl.Series("line", lines, dtype=pl.Binary).cast(pl.String)
        return text.str.json_decode(pl.Struct(EVENT_SCHEMA)).struct.unnest()
    except (pl.exceptions.PolarsError, OSError):
        rows = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                bad_lines[0] += 1
                continue
            if isinstance(event, dict):
                args = event.get("args") if isinstance(event.get("args"), dict) else {}
                rows.append(
                    {k: _text_or_number(event.get(k), EVENT_SCHEMA[k]) for k in EVENT_SCHEMA if k != "args"}
                    | {"args": {k: _text_or_number(args.get(k), dtype) for k, dtype in _ARGS.items()}}
                )
        return pl.DataFrame(rows, schema=EVENT_SCHEMA)


def _text_or_number(value: Any, dtype: Any) -> Any:
    if value is None:
        return None
    if dtype == pl.Float64:
        return float(value) if isinstance(value, (int, float)) else None
    if dtype == pl.Int64:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return str(value)


_NS = 1000.0


def _gpu_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """GPU activity as (dev, s, e, cls, name, op, stream, corr, pg) with integer ns; cls 0 compute, 1
    communication (kernel_classes.yaml), 2 memory. `op` is the raw collective name, normalised in `_finish_ops`."""
    cat = pl.col("cat").str.to_lowercase()
    name = pl.col("name")
    args = pl.col("args").struct
    is_memory = cat.is_in(["gpu_memcpy", "gpu_memset", "memcpy", "memset"]) | name.str.contains(r"^(?:Memcpy|Memset)")
    is_comm = name.str.contains(comm_kernels().any_pattern)
    start = (pl.col("ts") * _NS).round().cast(pl.Int64)
    return (
        frame.filter((pl.col("ph") == "X") & cat.is_in(GPU_CATEGORIES) & pl.col("ts").is_not_null())
        .select(
            pl.coalesce(args.field("device"), pl.col("pid")).cast(pl.Int64, strict=False).alias("dev"),
            start.alias("s"),
            (start + (pl.col("dur").fill_null(0) * _NS).round().cast(pl.Int64)).alias("e"),
            pl.when(is_memory).then(2).when(is_comm).then(1).otherwise(0).cast(pl.Int8).alias("cls"),
            name.cast(pl.Categorical),
            pl.when(is_comm & ~is_memory)
            .then(pl.coalesce(args.field("Collective name"), name))
            .cast(pl.Categorical)
            .alias("op"),
            args.field("stream").alias("stream"),
            args.field("correlation").alias("corr"),
            args.field("Process Group Name").cast(pl.Categorical).alias("pg"),
        )
        .filter(pl.col("dev").is_not_null())
    )


def _finish_ops(rows: pl.DataFrame) -> pl.DataFrame:
    """One spelling per collective: torch's `allreduce` (kernel args) and NCCL's `AllReduce` (kernel name) are one."""
    raw = [v for v in rows.get_column("op").unique().to_list() if v is not None]
    mapping = {v: normalise_collective(nccl_op(v)) for v in raw}
    return rows.with_columns(pl.col("op").cast(pl.String).replace(mapping).cast(pl.Categorical))


def _step_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """CPU-side `ProfilerStep#N` windows: (step, s, e) in ns."""
    start = (pl.col("ts") * _NS).round().cast(pl.Int64)
    return frame.filter(
        (pl.col("ph") == "X")
        & pl.col("name").str.starts_with("ProfilerStep#")
        & ~pl.col("cat").fill_null("").str.starts_with("gpu_")
    ).select(
        pl.col("name").str.extract(STEP_NAME.pattern, 1).cast(pl.Int64, strict=False).alias("step"),
        start.alias("s"),
        (start + (pl.col("dur").fill_null(0) * _NS).round().cast(pl.Int64)).alias("e"),
    )


# --- per-device summaries --------------------------------------------------------------------------


def _unions(rows: pl.DataFrame) -> dict[int, tuple[int, int, int, int]]:
    """dev -> (count, first start, last end, length of the union of the [s, e) intervals)."""
    if rows.is_empty():
        return {}
    prev = pl.col("e").cum_max().shift(1).over("dev")
    out = (
        rows.select("dev", "s", "e")
        .sort("dev", "s", "e")
        .with_columns(prev.alias("prev"))
        .group_by("dev")
        .agg(
            pl.len().alias("n"),
            pl.col("s").min().alias("first"),
            pl.col("e").max().alias("last"),
            (pl.col("e") - pl.max_horizontal("s", pl.col("prev").fill_null(pl.col("s"))))
            .clip(lower_bound=0)
            .sum()
            .alias("union"),
        )
    )
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in out.iter_rows()}


def _idle_gaps(rows: pl.DataFrame) -> dict[int, list[tuple[int, int]]]:
    gaps = (
        rows.select("dev", "s", "e")
        .sort("dev", "s", "e")
        .with_columns(pl.col("e").cum_max().shift(1).over("dev").alias("prev"))
        .filter(pl.col("s") > pl.col("prev"))
        .with_columns((pl.col("s") - pl.col("prev")).alias("gap"))
        .sort("gap", descending=True)
        .group_by("dev", maintain_order=True)
        .head(TOP_GAPS)
    )
    out: dict[int, list[tuple[int, int]]] = {}
    for dev, prev, gap in gaps.select("dev", "prev", "gap").iter_rows():
        out.setdefault(dev, []).append((prev, gap))
    return out


def _top_kernels(rows: pl.DataFrame) -> dict[int, list[KernelStat]]:
    top = (
        rows.filter(pl.col("cls") < 2)
        .group_by("dev", "name", "cls")
        .agg(
            pl.len().alias("n"),
            (pl.col("e") - pl.col("s")).sum().alias("total"),
            (pl.col("e") - pl.col("s")).max().alias("longest"),
        )
        .sort("total", descending=True)
        .group_by("dev", maintain_order=True)
        .head(TOP_KERNELS)
    )
    out: dict[int, list[KernelStat]] = {}
    for dev, name, cls, n, total, longest in top.iter_rows():
        out.setdefault(dev, []).append(KernelStat(str(name), COMMUNICATION if cls == 1 else COMPUTE, n, total, longest))
    return out


def _nccl_stats(
    rows: pl.DataFrame,
) -> tuple[dict[int, list[NcclStat]], dict[int, int], dict[int, list[tuple[str, int, int]]]]:
    nccl = rows.filter(pl.col("cls") == 1).with_columns((pl.col("e") - pl.col("s")).alias("d"))
    per_op = (
        nccl.group_by("dev", "op")
        .agg(
            pl.len().alias("n"),
            pl.col("d").sum().alias("total"),
            pl.col("d").median().alias("median"),
            pl.col("d").max().alias("longest"),
        )
        .sort("total", descending=True)
    )
    ops: dict[int, list[NcclStat]] = {}
    for dev, op, n, total, median, longest in per_op.iter_rows():
        ops.setdefault(dev, []).append(NcclStat(str(op), n, total, round(median), longest))
    medians = {dev: round(m) for dev, m in nccl.group_by("dev").agg(pl.col("d").median()).iter_rows()}
    slowest: dict[int, list[tuple[str, int, int]]] = {}
    top = nccl.sort("d", descending=True).group_by("dev", maintain_order=True).head(SLOWEST_NCCL)
    for dev, op, s, d in top.select("dev", "op", "s", "d").iter_rows():
        slowest.setdefault(dev, []).append((str(op), s, d))
    return ops, medians, slowest


def summarise_devices(rows: pl.DataFrame, rel: str, steps: int | None, origin_ns: int | None) -> list[DeviceTrace]:
    """One DeviceTrace per GPU in the activity rows (dev, s, e, cls, name, op; ns)."""
    busy = _unions(rows)
    compute = _unions(rows.filter(pl.col("cls") == 0))
    comm = _unions(rows.filter(pl.col("cls") == 1))
    memory = _unions(rows.filter(pl.col("cls") == 2))
    kernels = _unions(rows.filter(pl.col("cls") < 2))
    gaps = _idle_gaps(rows)
    top = _top_kernels(rows)
    ops, medians, slowest = _nccl_stats(rows)
    none = (0, 0, 0, 0)
    devices = []
    for dev in sorted(busy):
        _, first, last, busy_ns = busy[dev]
        devices.append(
            DeviceTrace(
                file=rel,
                source=SOURCE,
                device=dev,
                rank=None,
                host=None,
                start=None if origin_ns is None else datetime.fromtimestamp((origin_ns + first) / 1e9, tz=timezone.utc),
                span_ns=last - first,
                busy_ns=busy_ns,
                compute_ns=compute.get(dev, none)[3],
                comm_ns=comm.get(dev, none)[3],
                memory_ns=memory.get(dev, none)[3],
                kernels_ns=kernels.get(dev, none)[3],
                kernel_count=kernels.get(dev, none)[0],
                nccl_count=comm.get(dev, none)[0],
                nccl_median_ns=medians.get(dev),
                steps=steps,
                top_kernels=top.get(dev, []),
                nccl_ops=ops.get(dev, []),
                slowest_nccl=[
                    {"op": op, "offset_ms": round((s - first) / 1e6, 3), "us": round(d / 1e3, 2)}
                    for op, s, d in slowest.get(dev, [])
                ],
                idle_gaps=[(prev - first, gap) for prev, gap in gaps.get(dev, [])],
            )
        )
    return devices


# --- the reader ------------------------------------------------------------------------------------


def _document(split: _Split) -> dict[str, Any]:
    """The top-level keys besides `traceEvents` (deviceProperties, distributedInfo, baseTimeNanoseconds)."""
    text = split.head + b"[]" + split.tail
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        doc = {}
        for key in ("distributedInfo", "baseTimeNanoseconds"):
            m = re.search(rb'"' + key.encode() + rb'"\s*:\s*(\{[^{}]*\}|\d+)', text)
            if m:
                doc[key] = json.loads(m.group(1))
        return doc


def _rank(doc: dict[str, Any], rel: str, result: FileResult) -> int | None:
    info = doc.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int):
        return rank
    from_name = rank_from_file_name(rel)
    how = f"rank {from_name} taken from the file name" if from_name is not None else "its rank is unknown"
    result.warnings.append(f"{rel}: the trace has no distributedInfo.rank; {how}")
    return from_name


def _origin_ns(doc: dict[str, Any], rows: pl.DataFrame) -> int | None:
    base = doc.get("baseTimeNanoseconds")
    if isinstance(base, int):
        return base
    first = rows.get_column("s").min() if rows.height else None
    return 0 if first is not None and first > EPOCH_US * _NS else None


def _flush(pending: list[pl.DataFrame], gpu: list[pl.DataFrame], steps: dict[int, tuple[int, int]]) -> None:
    """Parsed events (names as text) to GPU rows (names interned) and step windows, in one batch."""
    if not pending:
        return
    frame = pl.concat(pending)
    pending.clear()
    gpu.append(_gpu_rows(frame))
    for step, start, end in _step_rows(frame).iter_rows():
        if step is not None and (step not in steps or end - start > steps[step][1] - steps[step][0]):
            steps[step] = (start, end)


def _timeline(rows: pl.DataFrame, device: int, steps: dict[int, tuple[int, int]]) -> SyncTimeline:
    """The what-if's view of one device (see SyncTimeline)."""
    mine = rows.filter(pl.col("dev") == device)
    lane = mine.filter(pl.col("cls") != 1).sort("s")
    comm = mine.filter(pl.col("cls") == 1).sort("s")
    totals = (
        mine.filter(pl.col("cls") == 0)
        .group_by("name")
        .agg(pl.len().alias("n"), (pl.col("e") - pl.col("s")).sum().alias("ns"))
    )
    return build_timeline(
        lane.get_column("s").to_numpy(),
        lane.get_column("e").to_numpy(),
        lane.get_column("corr").fill_null(-1).to_numpy(),
        comm.get_column("s").to_numpy(),
        comm.get_column("e").to_numpy(),
        comm.get_column("corr").fill_null(-1).to_numpy(),
        comm.get_column("stream").fill_null(-1).to_numpy(),
        [str(g) if g is not None else "" for g in comm.get_column("pg").to_list()],
        sorted((k, s, e) for k, (s, e) in steps.items()),
        {str(n): (c, t) for n, c, t in totals.iter_rows()},
    )


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    split = _Split()
    bad_lines = [0]
    gpu: list[pl.DataFrame] = []
    steps: dict[int, tuple[int, int]] = {}
    try:
        with open_binary(path) as fh:
            pending: list[pl.DataFrame] = []  # parsed events, turned into compact rows in batches
            for chunk in split_trace_events(fh, split):
                frame = _parse_block(chunk, bad_lines)
                if frame.height:
                    pending.append(frame)
                if sum(f.height for f in pending) >= PENDING_ROWS:
                    _flush(pending, gpu, steps)
            _flush(pending, gpu, steps)
    except (OSError, EOFError, zlib.error) as exc:
        split.warnings.append(f"reading stopped early ({type(exc).__name__}: {exc}); the events before were read")
    result.warnings += [f"{rel}: {w}" for w in split.warnings]
    if bad_lines[0]:
        result.warnings.append(f"{rel}: {bad_lines[0]} trace events were not valid JSON and were skipped")
    if not split.found:
        return result
    doc = _document(split)
    rows = _finish_ops(pl.concat(gpu) if gpu else _gpu_rows(pl.DataFrame(schema=EVENT_SCHEMA)))
    rank = _rank(doc, rel, result)
    devices = summarise_devices(rows, rel, len(steps) or None, _origin_ns(doc, rows))
    host_match = WORKER_NAME.match(rel.rsplit("/", 1)[-1])
    main = max(devices, key=lambda d: d.busy_ns, default=None)
    for d in devices:
        d.rank = rank if d is main else None
        d.host = host_match["host"] if host_match else None
    if main is not None:
        main.timeline = _timeline(rows, main.device, steps)
    if len(devices) > 1:
        others = ", ".join(str(d.device) for d in devices if d is not main)
        result.warnings.append(
            f"{rel}: GPU activity on devices {others} besides device {main.device}, rank {rank}'s GPU"
        )
    _environment(doc, result)
    result.extras[EXTRAS_KEY] = TraceFile(rel, SOURCE, rank, devices)
    record_samples(sink, devices)
    kernels = sum(d.kernel_count for d in devices)
    result.note = (
        f"PyTorch profiler trace: rank {rank if rank is not None else '?'}, {len(steps)} steps, "
        f"{kernels} kernels ({sum(d.nccl_count for d in devices)} NCCL)"
    )
    return result


def _environment(doc: dict[str, Any], result: FileResult) -> None:
    props = doc.get("deviceProperties")
    if isinstance(props, list):
        names = sorted({p.get("name") for p in props if isinstance(p, dict) and p.get("name")})
        if names:
            result.environment["gpu_names"] = names
    info = doc.get("distributedInfo")
    if isinstance(info, dict):
        for key in ("nccl_version", "world_size"):
            if info.get(key) is not None:
                result.environment[key] = info[key]


FILE_SOURCES = [FileSource("kineto_trace", _sniff, _read)]
