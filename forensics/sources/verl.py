"""verl's trainer output: console step lines and the config dump (its file logger's JSONL: metrics_jsonl.py).

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
import math
import re
from typing import Any

import numpy as np
import polars as pl

from forensics.line_prefixes import (
    ANSI_ESC,
    ANSI_ESCLESS,
    ANY_PREFIX,
    LAST_TORCHRUN_RANK,
    RANK_IN_MESSAGE,
    attribute,
    rust_form,
)
from forensics.sources.base import BatchLines, BatchRead, Hit, LineExtractor, LineRecord, Sink

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
# A number as `repr` prints one (no spaces, underscores or non-ASCII digits, which float() would also take):
# exactly what polars' cast to Float64 reads (tests/test_step_lines_in_bulk.py checks the two agree)
NUMBER = re.compile(r"^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:nan|inf|infinity))$")
_ANSI_RUN = r"(?:\x1b\[[0-9;?]*[A-Za-z])*"
# The step lines read in bulk: a Ray prefix (actor names and addresses without `-`, `:`, `(`), at most five
# torchrun prefixes (`attribute` peels six prefixes at most), ANSI colour around them, then `step:N` and
# ` - key:value` to the end, with no space, colon or ANSI code in a key or a value, and no colour code that lost
# its ESC anywhere (see ANSI_ESCLESS). `attribute` reads nothing else on such a line (no time, no prefix it would
# peel differently), and each ` - ` part holds one colon, so splitting at it is what `rpartition` does.
BULK_STEP_LINE = (
    rf"^{_ANSI_RUN}(?:\((?:[^():-]*? )?pid=\d+(?:, ip=[\w.]+)?\)|\((?:raylet|gcs_server|autoscaler[^,():-]*)"
    rf"(?:, ip=[\w.]+)?\))?{_ANSI_RUN}\s?{_ANSI_RUN}(?:\[(?:default|rank)\d+\]:\s?{_ANSI_RUN}){{0,5}}"
    r"step:\d+(?: - [^\s:\x1b]+:[^\s:\x1b]+)*[ \t]*\r?\n?$"
)
RANK_IN_TEXT = rust_form(RANK_IN_MESSAGE.pattern)
# A key other than `step` (a line starting `step:` is a step line of its own, never a wrapped rest)
_NOT_STEP_KEY = r"(?:[^\s:]{5,}|[^\s:]{1,3}|[^\s:s][^\s:]{3}|s[^\s:t][^\s:]{2}|st[^\s:e][^\s:]|ste[^\s:p])"
# A line (ESC colour codes removed) whose body, after some run of the prefixes `attribute` may peel, is what
# `_continuations` takes for the hard-wrapped rest of a step line (CONTINUATION, or KEY_TAIL but for `step:`):
# whenever it is, this matches (and it may match more, which only leaves a step line to `_handle_step`).
MAY_BE_WRAPPED_REST = rf"^(?:{ANY_PREFIX})*\s*(?:-\s+[^\s:-][^:]*:\S|{_NOT_STEP_KEY}:\S+(?:\s+-\s+|\s*-?\s*$))"


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
    bulk = bulk & ~pl.col("line").str.replace_all(ANSI_ESC, "").str.contains(ANSI_ESCLESS)
    if found.fctx.rank is None:  # a rank named in the text is `attribute`'s to read
        bulk = bulk & (pl.col("rank").is_not_null() | ~pl.col("line").str.contains(RANK_IN_TEXT))
    frame = frame.with_columns(bulk=bulk)
    read = frame.filter("bulk")
    fields = _step_samples(found, read, sink) if read.height else {}
    return BatchRead(frame.filter(~pl.col("bulk"))["row"].to_numpy(), fields)


def _may_continue(found: BatchLines) -> pl.Series:
    """Whether the line after each step line may be its hard-wrapped rest (`_handle_step` then reads both)."""
    last = len(found.batch.lines) - 1
    texts = found.batch.lines.gather(np.minimum(found.rows + 1, last)).str.replace_all(ANSI_ESC, "")
    texts = texts.str.strip_chars_end("\r\n")
    looks = texts.str.contains(MAY_BE_WRAPPED_REST) | texts.str.contains(ANSI_ESCLESS)  # ESC-less: `attribute`'s
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
