"""A check no example can make: every rule regex stays fast on long, hostile lines.

Rust's engine, which decides where a rule matches, is linear whatever the regex. Python's `regex`, which then
reads each matched line (which clause, the values to extract), backtracks: two unbounded repeats that can take
the same characters, one after the other or one inside the other, cost quadratic or exponential time on a long
line of those characters, and a rule that spends RULE_TIME_BUDGET_S so is switched off mid-run. So each regex
is timed, in both engines, on lines of LINE_CHARS (what Python reads of a line at most) built to find that:

- a verl step line of 150 metrics at full precision, repeated to that length, and the same with a NaN loss at
  its end (a line the rule matches, then read in Python);
- for every unbounded repeat in the regex, a run of what it takes, alone and after the text that leads to it,
  with no end that lets the match finish, and that text with one such unit, over and over;
- each of the regex's literals over and over, and the rule's own examples repeated.

A regex is slow when a line takes it more than SLOW_S, or when its time grows more than GROWTH_MAX times
from a quarter of the line to the whole (linear: 4x, quadratic: 16x). And since Rust compiles a regex anew
in each batch it is tried on, one that takes over RUST_COMPILE_S to compile is reported too. The limits are
scaled by baselines (Python's timed once, and again before a regex is called slow; Rust's compile beside each
regex), so that a busy machine does not fail what an idle one passes.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import regex

from forensics.prefilter import required_literals, sre, sre_parse
from forensics.rules.loader import RuleError
from forensics.rules.model import Rule

LINE_CHARS = 64 * 1024  # textio.MAX_LINE_CHARS: Python never reads more of a line
SLOW_S = 0.5  # a linear regex takes at most ~0.2 s on such a line (trying every start), a quadratic one minutes
TIMEOUT_S = 1.0
GROWTH_MAX = 10.0
RUST_COMPILE_S = 0.008  # most rule regexes compile in about 1 ms; a bounded Unicode class repeat in 15-70 ms
# What the limits are measured against on the machine at hand: a regex that compiles in no time (the cost of a
# polars call), and a linear regex doing the work a rule's does, a bounded lazy gap then alternatives, from every
# other start of a 64 KiB line (PY_BASELINE_S on an idle machine; a trivial regex's time does not follow a slow
# machine's the same way).
BASELINE_REGEX = "abc"
RUST_COMPILE_RATIO = 10.0
PY_BASELINE = (regex.compile(r"W.{0,64}?(?:failed|error)"), "W " * (LINE_CHARS // 2))
PY_BASELINE_S = 0.065
GROWTH_FLOOR_S = 0.05  # below this, timings are noise and growth is not judged
LITERALS_TRIED = 8
RUNS = 3
COMPILE_RUNS = 5
_STEP_METRICS = (
    "actor/entropy:np.float64(0.22266578674316406)",
    "actor/pg_loss:np.float64(0.042396901015308686)",
    "actor/kl_loss:0.0013280365410537343",
    "actor/grad_norm:0.129638671875",
    "actor/lr:3e-06",
    "critic/score/mean:0.0888671875",
    "critic/vf_loss:0.7714697429563925",
    "global_seqlen/min:419336",
    "perf/throughput:3283.320414789452",
    "timing_s/step:48.7025266494602",
)
_NAN_TAIL = " - actor/pg_loss:nan"
_VARIANTS = itertools.count(1000)
_CLASS_SAMPLES = "a1 x_-:/.(=Z\t"


@dataclass(frozen=True)
class HostileLine:
    kind: str  # what the line is, for the message
    text: str


def slow_regexes(rules: list[Rule], roots: list[Path] | None = None) -> list[RuleError]:
    """One error for each regex of the rules that is slow on a hostile line (see the module docstring)."""
    errors = []
    slowness = _python_slowness()
    for rule in rules:
        for key, pattern in _regexes(rule):
            lines = hostile_lines(pattern, rule.examples_match)
            verdict = judge(pattern, lines, slowness)
            if verdict:  # judged again against the machine as it is now: a load that came since is not the regex
                slowness = _python_slowness()
                verdict = judge(pattern, lines, slowness)
            if verdict:
                errors.append(RuleError(rule.path, _line_of(rule, pattern, roots or []), key, verdict, rule.id))
    return errors


def judge(pattern: str, lines: list[HostileLine], slowness: float | None = None) -> str | None:
    """Why `pattern` is slow on one of `lines`, or None. The limits grow with `slowness`, how slow the machine
    is now against an idle one (measured here when not given), so a loaded machine does not fail a regex an
    idle one passes."""
    compiled = regex.compile(pattern)
    slowness = _python_slowness() if slowness is None else slowness
    slow_s, timeout_s = SLOW_S * slowness, TIMEOUT_S * slowness
    for line in lines:
        seconds = _python_seconds(compiled, line.text, timeout_s)
        if seconds is None:
            return f"regex {pattern!r} took over {timeout_s:.2g} s on {line.kind}: {_ADVICE}"
        if seconds > slow_s:
            return f"regex {pattern!r} took {seconds:.2f} s on {line.kind}: {_ADVICE}"
        if seconds > GROWTH_FLOOR_S:
            quarter = _python_seconds(compiled, line.text[: len(line.text) // 4], timeout_s) or 0.0
            if seconds > GROWTH_MAX * max(quarter, 1e-6):
                return (
                    f"regex {pattern!r} took {seconds / max(quarter, 1e-6):.0f}x longer on {line.kind} than on a "
                    f"quarter of it (linear: 4x): {_ADVICE}"
                )
    seconds = _rust_seconds(pattern, [line.text for line in lines])
    if seconds > slow_s * len(lines):
        return f"regex {pattern!r} took {seconds:.2f} s in Rust's engine on {len(lines)} lines: make it smaller"
    seconds, baseline = _rust_compile_seconds(pattern)
    if seconds > max(RUST_COMPILE_S, RUST_COMPILE_RATIO * baseline):
        return (
            f"regex {pattern!r} takes {seconds * 1000:.0f} ms to compile in Rust's engine, again in each batch it "
            "is tried on: a bounded repeat of a Unicode class (\\w{1,128}) is the usual cause; use an ASCII class "
            "([A-Za-z0-9_]{1,128})"
        )
    return None


_ADVICE = (
    "two unbounded repeats can take the same characters (nested, or one after the other); bound one "
    "(`{0,64}`) or make their characters exclusive"
)


def hostile_lines(pattern: str, examples: tuple[str, ...] = (), size: int = LINE_CHARS) -> list[HostileLine]:
    """The lines a regex is timed on: step lines, runs for each of its repeats, its literals, its examples."""
    lines = [
        HostileLine("a long verl step line", _step_line(size)),
        HostileLine("a long verl step line ending in a NaN loss", _step_line(size - len(_NAN_TAIL)) + _NAN_TAIL),
    ]
    tree = _parsed(pattern)
    if tree is not None:
        for lead, run in _repeats(tree, ""):
            lines.append(HostileLine(f"{run!r} repeated after {lead[-40:]!r}", _fill(lead, run, size)))
            lines.append(HostileLine(f"{run!r} repeated", _fill("", run, size)))
            if lead:
                lines.append(HostileLine(f"{(lead + run)[-40:]!r} repeated", _fill("", lead + run, size)))
    literals = required_literals(pattern)
    for literal in sorted(literals.strings, key=len)[:LITERALS_TRIED] if literals else ():
        lines.append(HostileLine(f"{literal!r} repeated", _fill("", literal, size)))
    for example in examples:
        lines.append(HostileLine("its example repeated", _fill("", example.replace("\n", " ") + " ", size)))
    unique = {line.text: line for line in lines}
    return list(unique.values())


def _step_line(size: int) -> str:
    parts = ["(TaskRunner pid=222265) step:34"]
    length = len(parts[0])
    i = 0
    while length < size:
        part = _STEP_METRICS[i % len(_STEP_METRICS)]
        parts.append(part)
        length += len(part) + 3
        i += 1
    return " - ".join(parts)[:size]


def _fill(lead: str, run: str, size: int) -> str:
    """`lead`, then `run` over and over, to `size`; the last character is one no regex here takes (NUL),
    so that a match that could only end at the end of the line fails there, after trying everything."""
    return (lead + run * (1 + (size - len(lead)) // max(1, len(run))))[: size - 1] + "\x00"


def _parsed(pattern: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return sre_parse.parse(pattern)
    except (ValueError, TypeError, OverflowError, RecursionError, sre.error):
        return None  # a syntax only `regex` reads: the step lines, literals and examples still test it


def _repeats(nodes, lead: str) -> Iterator[tuple[str, str]]:
    """(text that leads there, a run unit) for each unbounded repeat under `nodes`, depth first."""
    for op, av in nodes:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) or op is getattr(sre, "POSSESSIVE_REPEAT", None):
            _, hi, item = av
            unit = _sample(item) or ""
            if hi == sre.MAXREPEAT and unit:
                yield lead, unit
            yield from _repeats(item, lead + unit)
        elif op is sre.BRANCH:
            for alternative in av[1]:
                yield from _repeats(alternative, lead)
        elif op is sre.SUBPATTERN:
            yield from _repeats(av[3], lead)
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            yield from _repeats(av, lead)
        lead += _sample([(op, av)]) or ""


def _sample(nodes) -> str | None:
    """A short text that `nodes` match (None where none is found)."""
    out = []
    for op, av in nodes:
        if op is sre.LITERAL:
            out.append(chr(av))
        elif op is sre.NOT_LITERAL:
            out.append("x" if av != ord("x") else "y")
        elif op is sre.ANY:
            out.append("x")
        elif op is sre.IN:
            char = next((c for c in _CLASS_SAMPLES if _in_class(c, av)), None)
            if char is None:
                return None
            out.append(char)
        elif op is sre.BRANCH:
            samples = [s for s in (_sample(alt) for alt in av[1]) if s is not None]
            if not samples:
                return None
            out.append(min(samples, key=len))
        elif op is sre.SUBPATTERN:
            part = _sample(av[3])
            if part is None:
                return None
            out.append(part)
        elif op is getattr(sre, "ATOMIC_GROUP", None):
            part = _sample(av)
            if part is None:
                return None
            out.append(part)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT) or op is getattr(sre, "POSSESSIVE_REPEAT", None):
            part = _sample(av[2])
            if part is None:
                return None
            out.append(part * av[0])
        # AT, ASSERT, ASSERT_NOT, GROUPREF, ...: nothing to add
    return "".join(out)


_CATEGORIES = {
    "CATEGORY_DIGIT": str.isdigit,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdigit(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_NOT_WORD": lambda c: not (c.isalnum() or c == "_"),
}


def _in_class(char: str, items) -> bool:
    negate = bool(items) and items[0][0] is sre.NEGATE
    hit = False
    for op, av in items:
        if op is sre.LITERAL:
            hit = hit or ord(char) == av
        elif op is sre.RANGE:
            hit = hit or av[0] <= ord(char) <= av[1]
        elif op is sre.CATEGORY:
            hit = hit or _CATEGORIES.get(str(av), lambda c: False)(char)
    return hit != negate


def _python_seconds(compiled: regex.Pattern, text: str, timeout_s: float = TIMEOUT_S) -> float | None:
    """CPU seconds of the fastest of RUNS searches (CPU time, and the fastest: what other work on a shared
    machine adds is left out); None past `timeout_s`."""
    best = timeout_s
    for _ in range(RUNS):
        start = time.thread_time()
        try:
            compiled.search(text, timeout=timeout_s)
        except TimeoutError:
            return None
        best = min(best, time.thread_time() - start)
        if best > timeout_s / 2:
            break
    return best


def _python_slowness() -> float:
    """How many times slower than an idle machine Python's regex engine runs now (at least 1)."""
    seconds = _python_seconds(*PY_BASELINE) or TIMEOUT_S
    return max(1.0, seconds / PY_BASELINE_S)


def _rust_seconds(pattern: str, texts: list[str]) -> float:
    column = pl.Series(texts, dtype=pl.String)
    start = time.process_time()
    column.str.contains(pattern)
    return time.process_time() - start


def _rust_compile_seconds(pattern: str) -> tuple[float, float]:
    """CPU seconds Rust's engine takes to compile `pattern`, and BASELINE_REGEX timed in turn with it (the
    fastest of COMPILE_RUNS each): polars keeps a few compiled regexes, so each run compiles a variant of its own
    (an extra alternative that cannot match a line: NULs)."""
    best = [TIMEOUT_S, TIMEOUT_S]
    column = pl.Series([""], dtype=pl.String)
    for _ in range(COMPILE_RUNS):
        for which, timed in enumerate((pattern, BASELINE_REGEX)):
            variant = f"(?:{timed})|\\x00{{{next(_VARIANTS)}}}"
            start = time.process_time()
            column.str.contains(variant)
            best[which] = min(best[which], time.process_time() - start)
    return best[0], best[1]


def _regexes(rule: Rule) -> Iterator[tuple[str, str]]:
    for clause in rule.match:
        yield "match", clause.regex
        if clause.followed_by:
            yield "match", clause.followed_by
    for pattern in rule.extract.values():
        yield "extract", pattern


def _line_of(rule: Rule, pattern: str, roots: list[Path]) -> int:
    """The line of the rule's file that holds `pattern` (as YAML quotes it), else 1."""
    for root in roots:
        path = root / rule.path
        if not path.is_file():
            continue
        probe = pattern[:24].replace("'", "''")
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if probe in line or pattern[:24] in line:
                return number
    return 1
