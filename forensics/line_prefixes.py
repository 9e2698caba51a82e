"""Who printed a line and when: Ray, torchrun, c10 and NCCL prefixes, and timestamps.

Applied only to the few lines that matched something, so plain Python regexes are fine here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath

# colour codes, also those whose ESC was lost in a paste (`[36m(TaskRunner pid=1)[0m`)
# (a bare `[m` only before a bracket, a space or the end: `[master:1234]` is a word, not a colour code)
# (the lookbehind after the `[`, not before it: a pattern that starts with literals is searched 4x faster)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[(?<![\w\]]\[)(?:\d{1,3}(?:;\d{1,3})*m(?=[\[(\w\s]|$)|m(?=[\[(\s]|$))")
# Wrappers that tools and people put in front of a program's line: a quoted paste (`> `), MPI's `[1,290]<stderr>:`,
# Slurm's `srun --label` (`12: `), pdsh's `host: `, a log viewer's line counter (`[80746] `), a container
# runtime's timestamp, a harness's stream name (`stderr: `, as accelerate's test runner prints a child's output).
# They stand before the program's own prefixes, any number of them.
QUOTE_PREFIX = re.compile(r"^\s{0,3}>+ ?")
MPI_PREFIX = re.compile(r"^\[\d+,(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?")
SRUN_PREFIX = re.compile(r"^\s{0,4}(?P<rank>\d{1,5}): (?=\S)")
# A host name holds a digit; a dotted Python class (`vllm.v1.engine.exceptions.EngineDeadError: `) is no host.
HOST_PREFIX = re.compile(
    r"^(?P<host>(?=[\w.-]*\d)(?![\w.-]*Error: )(?![\w.-]*Exception: )(?![\w.-]*Warning: )[A-Za-z0-9][\w.-]{1,62})"
    r": (?=\S)"
)
COUNTER_PREFIX = re.compile(r"^\[\d{1,9}\] (?=\S)")
STREAM_PREFIX = re.compile(r"^(?:stdout|stderr): ")
RUNTIME_TS_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z (?=\S)")
# syslog and journalctl (`Feb 14 05:03:41 gpu-1 kernel: `, `Sep 22 23:46:41 host vllm[361682]: `) and a CI
# console's timestamper (`Jul 13 21:22:34 `, no host): one space is peeled, the program's indentation stays
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
SYSLOG_PREFIX = re.compile(
    rf"^(?P<mon>{'|'.join(MONTHS)}) (?P<d>[ \d]\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d{{1,9}}))? "
    r"(?:(?P<host>[A-Za-z0-9][\w.-]{0,62}) (?P<prog>[\w.@/-]{1,64})(?:\[(?P<pid>\d+)\])?: )?"
)
RAY_PREFIX = re.compile(r"^\((?:(?P<name>[^()]*?) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^)\s]+))?\)\s?")
RAY_SYSTEM_PREFIX = re.compile(r"^\((?P<src>raylet|gcs_server|autoscaler[^,)]*)(?:, ip=(?P<ip>[^)\s]+))?\)\s?")
TORCHRUN_PREFIX = re.compile(r"^\[(?:default|rank)(?P<rank>\d+)\]:\s?")
C10_PREFIX = re.compile(
    r"^\[(?P<sev>[IWEF])(?:(?P<mmdd>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?))?(?: \d+)? [\w./-]+:\d+\]\s?"
)
NCCL_PREFIX = re.compile(
    r"^(?:\[(?P<ts>\d{4}-\d\d-\d\d [^\]]+)\] )?(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?.*?NCCL (?:INFO|WARN|TRACE|CALL)"
)
# The rank a message says it was printed on: `[PG 0 Rank 3]`, `on rank 3`, `rank=3`; torch's desync check
# (`Rank 1 is running collective: ..., but Rank 0 is ...`, raised on the first) and communicator setup (`[1] is
# setting up NCCL communicator ... from [0]`); torchrun's failure entry pasted flat (`rank2 (local rank: 2)`).
RANK_IN_MESSAGE = re.compile(
    r"\[(?:PG [^\]]*?)?Rank (\d+)\]|\bon rank (\d+)\b|\brank(?:=| )(\d+)\b|\bRank (\d+) is running collective\b"
    r"|\[(\d+)\] is setting up NCCL communicator\b|\brank\s*:?\s*(\d+) \(local[_ ]rank: \d+\)"
)
PYLOG_LEVEL = re.compile(r"\b(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
GLOG_LEVEL = {"I": "info", "W": "warning", "E": "error", "F": "critical"}

TIMESTAMP_HEAD_CHARS = 256
ISO_TS = re.compile(
    r"(?P<y>\d{4})[-/](?P<mo>\d\d)[-/](?P<d>\d\d)[ T_](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d{1,9}))?"
)
MONTHDAY_TS = re.compile(r"\b(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d{1,9}))?")

_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")


def rust_form(pattern: str) -> str:
    """`pattern` without group names: Rust's engine refuses a name used twice, as alternations of these do."""
    return _NAMED_GROUP.sub("(?:", pattern)


def _unanchored(pattern: re.Pattern) -> str:
    return rust_form(pattern.pattern).removeprefix("^")


_LOOKAHEAD = re.compile(r"\(\?[=!](?:[^()\\]|\\.)*\)")


def _loose(pattern: re.Pattern) -> str:
    """A prefix regex as Rust's engine reads it: unanchored, without group names and without its look-aheads
    (so it matches wherever the prefix does, and may match where `attribute` would not peel it)."""
    return _LOOKAHEAD.sub("", _unanchored(pattern))


# For reading many lines at once in Rust. ANSI_ESC: the colour codes with their ESC; ANSI_ESCLESS: wherever a
# colour code that lost its ESC may stand (ANSI strips those only between certain characters: a line holding one
# is read by `attribute`, one at a time). ANY_PREFIX: each prefix `attribute` may peel, in any order it peels
# them: a line's body is what follows some run of them, and when `attribute` peels a prefix, one of these
# matches it (they may match more: the look-aheads and `attribute`'s six rounds are left out).
ANSI_ESC = r"\x1b\[[0-9;?]*[A-Za-z]"
ANSI_ESCLESS = r"\[[\d;]*m"
ANY_PREFIX = "|".join(
    _loose(p)
    for p in (
        RAY_PREFIX,
        RAY_SYSTEM_PREFIX,
        TORCHRUN_PREFIX,
        MPI_PREFIX,
        QUOTE_PREFIX,
        COUNTER_PREFIX,
        STREAM_PREFIX,
        RUNTIME_TS_PREFIX,
        SYSLOG_PREFIX,
        SRUN_PREFIX,
        HOST_PREFIX,
    )
)
# The last torchrun rank of a line whose only prefixes are a Ray prefix and torchrun's (verl's bulk step lines).
LAST_TORCHRUN_RANK = (
    f"^(?:{_unanchored(RAY_PREFIX)}|{_unanchored(RAY_SYSTEM_PREFIX)})?(?:{_unanchored(TORCHRUN_PREFIX)})*"
    r"\[(?:default|rank)(\d+)\]:"
)

TORCHRUN_FILE = re.compile(r"(?:^|/)attempt_\d+/(?P<rank>\d+)/(?:stdout|stderr|error)\.(?:log|json)$")
RAY_WORKER_FILE = re.compile(  # rotated copies too: `.1` after the name (older Ray) or after the extension
    r"(?:^|/)(?:worker|python-core-worker|python-core-driver)-[0-9a-f]+(?:-[0-9a-f]+)?[-_](?P<pid>\d+)"
    r"(?:\.\d+)?\.(?:out|err|log)(?:\.\d+)?$"
)
NCCL_DEBUG_FILE = re.compile(r"\.(?P<host>[\w-]+)\.(?P<pid>\d+)(?:\.log)?$")


@dataclass
class LineContext:
    """What the prefixes of one line tell about its origin."""

    body: str
    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    role: str | None = None
    level: str | None = None
    ts: datetime | None = None


@dataclass(frozen=True)
class FileContext:
    """What a file's path tells about every line in it."""

    rank: int | None = None
    pid: int | None = None
    host: str | None = None
    role: str | None = None
    year: int | None = None


def file_context(rel_path: str) -> FileContext:
    path = PurePosixPath(rel_path).as_posix()
    m = TORCHRUN_FILE.search(path)
    if m:
        return FileContext(rank=int(m["rank"]))
    m = RAY_WORKER_FILE.search(path)
    if m:
        return FileContext(pid=int(m["pid"]))
    return FileContext()


def _frac_us(frac: str | None) -> int:
    return int((frac or "0")[:6].ljust(6, "0"))


def _from_match(m, year: int) -> datetime | None:
    try:
        return datetime(
            year,
            int(m["mo"]),
            int(m["d"]),
            int(m["h"]),
            int(m["mi"]),
            int(m["s"]),
            _frac_us(m["frac"]),
            tzinfo=timezone.utc,
        )
    except ValueError:
        return None


def parse_timestamp(text: str, default_year: int | None = None) -> datetime | None:
    """The first timestamp in `text`, read as UTC; month-day forms take `default_year`."""
    m = ISO_TS.search(text)
    if m:
        return _from_match(m, int(m["y"]))
    if default_year is None:
        return None
    m = MONTHDAY_TS.search(text)
    return _from_match(m, default_year) if m else None


def _c10_timestamp(mmdd: str, hms: str, year: int | None) -> datetime | None:
    if year is None:
        return None
    month, day = (int(mmdd[:-2]), int(mmdd[-2:]))
    try:
        h, mi, s = hms.split(":")
        sec, _, frac = s.partition(".")
        return datetime(year, month, day, int(h), int(mi), int(sec), _frac_us(frac), tzinfo=timezone.utc)
    except ValueError:
        return None


def _syslog_timestamp(m: re.Match[str], year: int | None) -> datetime | None:
    if year is None:
        return None
    try:
        return datetime(
            year, MONTHS.index(m["mon"]) + 1, int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
            _frac_us(m["frac"]), tzinfo=timezone.utc,
        )  # fmt: skip
    except ValueError:
        return None


def _peel(text: str, ctx: LineContext, year: int | None) -> str | None:
    """`text` without the outermost prefix it starts with (noting what that prefix tells), or None."""
    m = RAY_PREFIX.match(text)
    if m:
        ctx.role = (m["name"] or "").strip() or ctx.role
        ctx.pid = int(m["pid"])
        ctx.host = m["ip"] or ctx.host
        return text[m.end() :]
    m = RAY_SYSTEM_PREFIX.match(text)
    if m:
        ctx.role = m["src"].split(" ")[0]
        ctx.host = m["ip"] or ctx.host
        return text[m.end() :]
    m = TORCHRUN_PREFIX.match(text) or MPI_PREFIX.match(text)  # `[default0]:`, c10's `[rank0]:`, MPI's rank
    if m:
        ctx.rank = int(m["rank"])
        return text[m.end() :]
    m = QUOTE_PREFIX.match(text) or COUNTER_PREFIX.match(text) or STREAM_PREFIX.match(text)
    if m:
        return text[m.end() :]
    m = RUNTIME_TS_PREFIX.match(text)
    if m:
        ctx.ts = ctx.ts or parse_timestamp(m[0])
        return text[m.end() :]
    m = SYSLOG_PREFIX.match(text)
    if m:
        ctx.ts = ctx.ts or _syslog_timestamp(m, year)
        ctx.host = m["host"] or ctx.host
        ctx.pid = int(m["pid"]) if m["pid"] else ctx.pid
        return text[m.end() :]
    m = SRUN_PREFIX.match(text)
    if m:
        ctx.rank = ctx.rank if ctx.rank is not None else int(m["rank"])
        return text[m.end() :]
    m = HOST_PREFIX.match(text)
    if m and not NCCL_PREFIX.match(text):
        ctx.host = m["host"]
        return text[m.end() :]
    return None


def attribute(line: str, fctx: FileContext) -> LineContext:
    """Peel the known prefixes off `line`, outermost first and in any order, and say what they tell."""
    text = ANSI.sub("", line).rstrip("\r\n")
    ctx = LineContext(body=text, rank=fctx.rank, pid=fctx.pid, host=fctx.host, role=fctx.role)
    for _ in range(6):  # wrappers nest: `> [1,0]<stderr>: (WorkerDict pid=1) [rank0]: ...`
        peeled = _peel(text, ctx, fctx.year)
        if peeled is None:
            break
        text = peeled
    m = C10_PREFIX.match(text)
    if m:
        ctx.level = GLOG_LEVEL[m["sev"]]
        if m["mmdd"] and m["hms"]:
            ctx.ts = _c10_timestamp(m["mmdd"], m["hms"], fctx.year)
    m = NCCL_PREFIX.match(text)
    if m:
        ctx.host = m["host"]
        ctx.pid = int(m["pid"])
    if ctx.rank is None and ("ank" in text or "communicator" in text):  # what every alternative holds
        m = RANK_IN_MESSAGE.search(text)
        if m:
            ctx.rank = int(next(group for group in m.groups() if group))
    if ctx.ts is None:  # a line's own time is at its head; a time deep in a message is what it talks about
        ctx.ts = parse_timestamp(text[:TIMESTAMP_HEAD_CHARS], fctx.year)
    if ctx.level is None:
        m = PYLOG_LEVEL.search(text[:80])
        if m:
            level = m["level"].lower()
            ctx.level = {"warn": "warning", "fatal": "critical"}.get(level, level)
    ctx.body = text
    return ctx
