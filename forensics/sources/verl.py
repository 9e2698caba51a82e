"""verl's trainer output: console step lines, the config dump, and the file logger's JSONL.

Console lines look like `(TaskRunner pid=N) step:12 - actor/pg_loss:-0.0036 - perf/throughput:3283.3`,
with values from `pprint.pformat` (new) or `{v:.3f}` (before verl PR #2303), numpy scalars printed as
`np.float64(0.5)`, and `nan`/`inf` kept as such. A terminal or a paste may hard-wrap a long step line:
its continuation lines start with ` - key:value`, or (wrapped inside a key) with the rest of the key.

A batch's step lines are read at once, in polars (`read_step_lines`): 20,000 steps of 150 metrics are 3
million values, too many for a loop over lines in Python. The lines this cannot read exactly (hard-wrapped,
dated, naming a rank in the text, or shaped unlike a step line) are left to the line-by-line reader, which
gives the same values (`parse_value` accepts what the bulk reader accepts).

At start the TaskRunner pprints the resolved config as a Python dict literal over many prefixed lines;
it is read back with `ast.literal_eval` (never `eval`) into flattened dotted keys.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from forensics.line_prefixes import ANSI, LAST_TORCHRUN_RANK, PEELED_PREFIXES, RANK_IN_MESSAGE, attribute, rust_form
from forensics.sources.base import BatchLines, BatchRead, FileResult, FileSource, Hit, LineExtractor, LineRecord, Sink
from forensics.textio import open_binary

SOURCE = "verl_console"
STEP_LINE = re.compile(r"(?:^|\s)step:(?P<step>\d+)(?P<kv>(?: - [^\s:][^:]*:\S+)*)")
REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
NUMPY_SCALAR = re.compile(r"^np\.\w+\((?P<v>[^()]*)\)$")
CONTINUATION = re.compile(r"^\s*-\s+[^\s:-][^:]*:\S")  # ` - key:value - …` on its own line
KEY_TAIL = re.compile(r"^[^\s:]+:\S+(?:\s+-\s+|\s*-?\s*$)")  # `/rewards/min:-1.0 - …`: a key cut in two
MAX_WRAPPED_LINES = 32
CONFIG_ROOTS = frozenset({"actor_rollout_ref", "data", "trainer", "algorithm", "critic", "reward_model"})
MAX_CONFIG_LINES = 4000
MAX_CONFIG_CHARS = 2_000_000
MAX_RECORD_BYTES = 64 * 1024**2  # a longer "line" of the file logger is read in pieces, each a bad record
# A number as `repr` prints one (no spaces, underscores or non-ASCII digits, which float() would also take):
# exactly what polars' cast to Float64 reads (tests/test_step_lines_in_bulk.py checks the two agree)
NUMBER = re.compile(r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:nan|inf|infinity))$")
_ANSI_RUN = r"(?:\x1b\[[0-9;?]*[A-Za-z])*"
# The step lines read in bulk: a Ray prefix (actor names and addresses without `-`, `:`, `(`), torchrun
# prefixes, ANSI colour around them, then `step:N` and ` - key:value` to the end, with no space, colon or
# ANSI code in a key or a value. `attribute` reads nothing else on such a line (no time, no prefix it would
# peel differently), and each ` - ` part holds one colon, so splitting at it is what `rpartition` does.
BULK_STEP_LINE = (
    rf"^{_ANSI_RUN}(?:\((?:[^():-]*? )?pid=\d+(?:, ip=[\w.]+)?\)|\((?:raylet|gcs_server|autoscaler[^,():-]*)"
    rf"(?:, ip=[\w.]+)?\))?{_ANSI_RUN}\s?{_ANSI_RUN}(?:\[(?:default|rank)\d+\]:\s?{_ANSI_RUN})*"
    r"step:\d+(?: - [^\s:\x1b]+:[^\s:\x1b]+)*[ \t]*\r?\n?$"
)
RANK_IN_TEXT = rust_form(RANK_IN_MESSAGE.pattern)


def parse_value(raw: str) -> float | None:
    """A metric value as verl prints it, or None for a non-number."""
    text = raw.strip().rstrip(",")
    m = NUMPY_SCALAR.match(text)
    if m:
        text = m["v"]
    if text in ("True", "False"):
        return float(text == "True")
    return float(text) if NUMBER.match(text) else None


def parse_values(raw: pl.Series) -> pl.Series:
    """`parse_value` of each string, in polars; the few numpy scalars and booleans are read apart."""
    text = raw.str.strip_chars().str.strip_chars_end(",")
    numpy = text.str.starts_with("np.").arg_true()
    if numpy.len():
        text = text.scatter(numpy, text.gather(numpy).str.replace(NUMPY_SCALAR.pattern, "$v"))
    value = text.cast(pl.Float64, strict=False)
    unread = value.is_null().arg_true()
    if unread.len():
        words = pl.DataFrame({"w": text.gather(unread)})
        truth = words.select(pl.when(pl.col("w") == "True").then(1.0).when(pl.col("w") == "False").then(0.0))
        value = value.scatter(unread, truth.to_series())
    return value


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


def _same_origin(a: Any, b: Any) -> bool:
    """Whether two attributed lines could come from one print (same Ray pid / torchrun rank, when shown)."""
    return (a.pid is None or b.pid is None or a.pid == b.pid) and (a.rank is None or b.rank is None or a.rank == b.rank)


def unwrap_step_line(first: str, following: list[str]) -> str:
    """A step line joined with the continuation lines a hard wrap split off (bodies, prefixes removed)."""
    text = REPEATED.sub("", first).rstrip()
    for raw in following:
        nxt = REPEATED.sub("", raw).strip()
        if not nxt:
            break
        last = text.rsplit(" - ", 1)[-1]
        if CONTINUATION.match(nxt):
            text = text.rstrip(" -") + " - " + nxt.lstrip("- ").rstrip()
        elif ":" not in last and not text.endswith("-") and KEY_TAIL.match(nxt) and not nxt.startswith("step:"):
            text += nxt  # the wrap fell inside a key: `critic` + `/rewards/min:-1.0`
        elif text.endswith(" -") and KEY_TAIL.match(nxt) and not nxt.startswith("step:"):
            text += " " + nxt
        else:
            break
    return text


def _continuations(hit: Hit) -> list[str]:
    """Bodies of the lines right after a step line that look like its hard-wrapped rest, same process.

    Stops at the first line that does not, so a normal log costs one look at the next line.
    """
    out = []
    for raw in hit.following(MAX_WRAPPED_LINES):
        ctx = attribute(raw, hit.fctx)
        body = ctx.body.strip()
        if (
            not _same_origin(ctx, hit.ctx)
            or body.startswith("step:")
            or not (CONTINUATION.match(body) or KEY_TAIL.match(body))
        ):
            break
        out.append(ctx.body)
    return out


def _handle_step(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    following = _continuations(rec.hit)
    if following:
        body = unwrap_step_line(body, following)
    parsed = parse_step_line(body)
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


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} → {'a.b': 1}; lists and scalars are kept as values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def parse_config_dump(lines: list[str]) -> dict[str, Any] | None:
    """The dict a `pprint(config)` spread over `lines` (prefixes already removed), or None.

    Stops at the line where the brackets balance; only literals are accepted (`ast.literal_eval`).
    """
    depth = 0
    taken: list[str] = []
    size = 0
    for line in lines[:MAX_CONFIG_LINES]:
        taken.append(line)
        size += len(line)
        if size > MAX_CONFIG_CHARS:
            return None
        depth += _bracket_balance(line)
        if depth <= 0:
            break
    if depth > 0:
        return None
    try:
        tree = ast.literal_eval("\n".join(taken).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, dict) or not CONFIG_ROOTS.intersection(map(str, tree)):
        return None
    return flatten({str(k): v for k, v in tree.items()})


_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _bracket_balance(line: str) -> int:
    code = _STRING.sub("", line)
    return sum(code.count(c) for c in "{[(") - sum(code.count(c) for c in "}])")


def _handle_config(rec: LineRecord, sink: Sink) -> None:
    """verl's TaskRunner prints the resolved config; keep it as flattened dotted keys."""
    if not rec.hit.ctx.body.lstrip().startswith("{'"):
        return
    lines = [rec.hit.ctx.body]
    for raw in rec.hit.following(MAX_CONFIG_LINES):
        ctx = attribute(raw, rec.hit.fctx)
        if _same_origin(ctx, rec.hit.ctx):  # other processes' lines may interleave in a Ray driver log
            lines.append(ctx.body)
    config = parse_config_dump(lines)
    if config is None:
        return
    rec.kind = "verl_config"
    rec.source = SOURCE
    rec.level = "info"
    rec.fields["keys"] = len(config)
    for key, value in config.items():
        sink.config.setdefault(key, value)


def read_step_lines(found: BatchLines, sink: Sink) -> BatchRead:
    """The step lines of a batch into the sink, read in polars; `_handle_step` reads the lines left.

    Left: lines not shaped as BULK_STEP_LINE, naming a rank in their text, or maybe hard-wrapped.
    """
    frame = pl.DataFrame({"row": found.rows, "line": found.lines, "wrapped": _may_continue(found)})
    rank = pl.col("line").str.extract(LAST_TORCHRUN_RANK, 1).cast(pl.Int64, strict=False)
    if found.fctx.rank is not None:  # the file's rank, unless a torchrun prefix names another
        rank = rank.fill_null(found.fctx.rank)
    step = pl.col("line").str.extract(r"step:(\d+)", 1).cast(pl.Int64, strict=False)
    frame = frame.with_columns(step=step, rank=rank)
    bulk = pl.col("line").str.contains(BULK_STEP_LINE) & ~pl.col("wrapped") & pl.col("step").is_not_null()
    if found.fctx.rank is None:  # a rank named in the text is `attribute`'s to read
        bulk = bulk & (pl.col("rank").is_not_null() | ~pl.col("line").str.contains(RANK_IN_TEXT))
    frame = frame.with_columns(bulk=bulk)
    read = frame.filter("bulk")
    fields = _step_samples(found, read, sink) if read.height else {}
    return BatchRead(frame.filter(~pl.col("bulk"))["row"].to_numpy(), fields)


def _may_continue(found: BatchLines) -> pl.Series:
    """Whether the line after each step line may be its hard-wrapped rest (`_handle_step` then reads both)."""
    last = len(found.batch.lines) - 1
    texts = found.batch.lines.gather(np.minimum(found.rows + 1, last)).str.replace_all(ANSI.pattern, "")
    bodies = texts.str.replace(PEELED_PREFIXES, "").str.strip_chars()
    looks = (bodies.str.contains(CONTINUATION.pattern) | bodies.str.contains(KEY_TAIL.pattern)) & ~(
        bodies.str.starts_with("step:")
    )
    return looks & pl.Series(found.rows < last)


def _step_samples(found: BatchLines, read: pl.DataFrame, sink: Sink) -> dict[int, dict[str, Any]]:
    """The metrics of the BULK_STEP_LINE lines, and the marks of their steps; returns the event fields of
    the `described` rows among them (as `_handle_step` sets them)."""
    order = pl.int_range(pl.len(), dtype=pl.UInt32)
    parts = read.select("step", "rank", order=order, part=pl.col("line").str.split(" - ").list.slice(1))
    parts = parts.explode("part")
    kv = parts.with_columns(pl.col("part").str.split_exact(":", 1).struct.rename_fields(["key", "raw"])).unnest("part")
    kv = kv.with_columns(value=parse_values(kv["raw"])).filter(pl.col("value").is_not_null())
    rank: pl.Series | int | None = kv["rank"] if read["rank"].null_count() < read.height else None
    sink.samples(kv["key"], kv["value"], kv["step"], source=SOURCE, rank=rank, line=kv["order"])
    rows = read["row"].to_numpy()
    steps = read["step"].to_list()
    sink.step_marks.extend(
        zip([found.file] * read.height, (rows + found.batch.first_line).tolist(), steps, strict=True)
    )
    described = np.flatnonzero(np.isin(rows, found.described))
    fields: dict[int, dict[str, Any]] = {int(rows[i]): {"step": steps[i]} for i in described}
    if fields:
        wanted = kv.filter(pl.col("order").is_in(described) & ~pl.col("value").is_finite())
        for (order,), bad in wanted.group_by("order"):
            fields[int(rows[order])]["non_finite"] = sorted(set(bad["key"].to_list()))[:20]
    return fields


EXTRACTORS = [
    LineExtractor("verl_step", SOURCE, r"step:\d+ - [^\s:][^:]*:", _handle_step, handle_batch=read_step_lines),
    LineExtractor(
        "verl_config",
        SOURCE,
        r"(?:^|[\s:)\]])\{'(?:actor_rollout_ref|algorithm|critic|data|trainer)': ",
        _handle_config,
    ),
]


def _sniff_jsonl(name: str, head: bytes) -> bool:
    return name.endswith(".jsonl") and head.lstrip().startswith(b'{"step"')


def _read_jsonl(path: Path, rel: str, sink: Sink) -> FileResult:
    """verl's file logger: one `{"step": N, "data": {...}}` per line; truncated last lines are skipped."""
    result = FileResult()
    bad = 0
    with open_binary(path) as fh:
        for number, raw in enumerate(iter(lambda: fh.readline(MAX_RECORD_BYTES), b""), start=1):
            result.lines = number
            try:
                row = json.loads(raw)
                step = int(row["step"])
                data = row["data"]
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            for metric, value in data.items():
                if value is None:  # orjson writes NaN and inf as null: a metric that became non-finite
                    value = math.nan
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)):
                    sink.sample(metric, float(value), source="verl_file_logger", step=step)
    if bad:
        result.warnings.append(f"{rel}: {bad} line(s) were not valid file-logger records and were skipped")
    return result


FILE_SOURCES = [FileSource("verl_jsonl", _sniff_jsonl, _read_jsonl)]
