"""verl's trainer output: console step lines and the config dump (its file logger's JSONL: metrics_jsonl.py).

Console lines look like `(TaskRunner pid=N) step:12 - actor/pg_loss:-0.0036 - perf/throughput:3283.3`,
with values from `pprint.pformat` (new) or `{v:.3f}` (before verl PR #2303), numpy scalars printed as
`np.float64(0.5)`, and `nan`/`inf` kept as such. A terminal or a paste may hard-wrap a long step line:
its continuation lines start with ` - key:value`, or (wrapped inside a key) with the rest of the key.

At start the TaskRunner pprints the resolved config as a Python dict literal over many prefixed lines;
it is read back with `ast.literal_eval` (never `eval`) into flattened dotted keys.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from forensics.line_prefixes import attribute
from forensics.sources.base import Hit, LineExtractor, LineRecord, Sink

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


EXTRACTORS = [
    LineExtractor("verl_step", SOURCE, r"step:\d+ - [^\s:][^:]*:", _handle_step),
    LineExtractor(
        "verl_config",
        SOURCE,
        r"(?:^|[\s:)\]])\{'(?:actor_rollout_ref|algorithm|critic|data|trainer)': ",
        _handle_config,
    ),
]
