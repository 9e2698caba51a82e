"""Literal prefilters: strings of which at least one appears in every line a regex matches.

The rules' regexes are never run over every line. Each one's literals are read from its parse tree
(Python's own parser), the way RE2 and code-search prefilters do it: a sequence needs its most selective
factor, an alternation needs one of its branches, an optional part needs nothing. When nothing is certain
(a pattern made only of classes and repeats, a syntax Python cannot parse) the pattern has no prefilter
and is searched in full.

All the literals are then searched at once, by one of two engines:

- Hyperscan (`HyperscanLiteralFinder`), where its wheel installs (x86-64, macOS): one SIMD pass over the
  batch's bytes, ~1.3 GB/s a core for the ~270 bundled literals, that also says which literals each line
  holds;
- polars (`PolarsLiteralFinder`) elsewhere: plain alternations in the Rust regex engine over the batch's
  string column (~0.45 GB/s past ~70 literals, where it leaves SIMD for Aho-Corasick); the literals of
  each candidate line are then found again.

Only the few candidate lines reach Python, where the literals they hold pick the patterns worth trying.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.textio import LineBatch

try:  # the field's multi-literal matcher; no wheel for every platform (Linux aarch64), where polars searches
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    hyperscan = None

try:  # Python 3.11+
    from re import _constants as sre
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MAX_EXACT = 64  # sets of exact strings larger than this stop being tracked
MAX_ALSO = 2  # further literal sets tested on a candidate line (Literals.also)
MAX_CLASS = 8  # a character class of at most this many characters counts as exact ([KMGT], [-+])
# polars: the Rust regex engine searches up to about 70 literals with SIMD (Teddy), more with Aho-Corasick
# at a third of the speed. Two SIMD searches of half the literals each beat one Aho-Corasick; more do not.
SIMD_LITERALS = 64
RUST_META = set("\\.+*?()|[]{}^$#&-~")
# The literals each candidate line holds are found in Rust in one call (Aho-Corasick, ~0.7 ms to build)
# when the candidates are more than this many line-literal tests (~60 ns each in Python) would cost.
LITERAL_TESTS_IN_PYTHON_MAX = 12_000
ENGINE_VARIABLE = "FORENSICS_LITERAL_ENGINE"  # hyperscan, polars, or unset for hyperscan where installed


@dataclass(frozen=True)
class Literals:
    """Any line the pattern matches contains one of `strings` (lower-cased and compared so when `icase`)."""

    strings: frozenset[str]
    icase: bool = False
    # further sets the line must hold one of each of (other literals of the pattern's top-level sequence):
    # tested on the candidates only, they leave out lines that hold the searched literal in another context
    also: tuple[frozenset[str], ...] = ()

    def found_in(self, line: str, lowered: str) -> bool:
        haystack = lowered if self.icase else line
        return any(s in haystack for s in self.strings)

    @property
    def weak(self) -> bool:
        """Whether the strings are in lines of every kind: punctuation and spaces only (" -> ", ": "), or in
        every line of some log (UBIQUITOUS). Such a pattern is better searched in full."""
        return not any(c.isalnum() for s in self.strings for c in s) or _ubiquitous(set(self.strings))

    def also_in(self, line: str, lowered: str) -> bool:
        """Whether the line holds one string of each further set (`lowered`: the line lower-cased)."""
        haystack = lowered if self.icase else line
        return all(any(s in haystack for s in strings) for strings in self.also)


@dataclass
class _Info:
    exact: set[str] | None  # the node always matches one of these strings
    required: set[str] | None  # any match contains one of these strings


# Literals that every line of some log holds, however long: the prefix NCCL writes before each of its INFO
# lines, by the million with NCCL_DEBUG=INFO; the component and source file of every line of Ray's C++ logs
# (`[ts I pid tid] (raylet) node_manager.cc:123: ...`). A pattern's other required literals are searched
# instead, as long as it has any: which literals are searched never changes what matches.
UBIQUITOUS = ("NCCL INFO ", "] (raylet) ", ".cc:")


def _ubiquitous(strings: set[str]) -> bool:
    return any(s in u for s in strings for u in UBIQUITOUS)


def _better(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    """The more selective requirement: one without an ubiquitous literal, then the longer shortest string,
    then the fewer strings."""
    if not a:
        return b or None
    if not b:
        return a

    return a if _rank(a) >= _rank(b) else b


def _rank(x: set[str]) -> tuple[bool, int, int]:
    """How selective a requirement is likely to be: not ubiquitous, then the length of its shortest string,
    then the fewer strings."""
    return (not _ubiquitous(x), min(map(len, x)), -len(x))


def _as_required(exact: set[str] | None) -> set[str] | None:
    return exact if exact and "" not in exact else None


class _Analyzer:
    def __init__(self) -> None:
        self.icase = False
        self.depth = 0
        self.factors: list[set[str]] = []  # every requirement of the top-level sequence

    def sequence(self, nodes) -> _Info:
        run = {""}  # the exact strings of the current stretch of exact nodes
        exact = True  # every node so far was exact, and their product stayed small
        best: set[str] | None = None
        top = self.depth == 0
        self.depth += 1
        for op, av in nodes:
            info = self.node(op, av)
            if info.exact is not None and len(run) * len(info.exact) <= MAX_EXACT:
                run = {a + b for a in run for b in info.exact}
                continue
            exact = False
            best = self._keep(best, _as_required(run), top)
            best = self._keep(best, info.required, top)
            run = set(info.exact) if info.exact is not None and len(info.exact) <= MAX_EXACT else {""}
        best = self._keep(best, _as_required(run), top)
        self.depth -= 1
        return _Info(run if exact else None, best)

    def _keep(self, best: set[str] | None, required: set[str] | None, top: bool) -> set[str] | None:
        if top and required:
            self.factors.append(required)
        return _better(best, required)

    def node(self, op, av) -> _Info:
        if op is sre.LITERAL:
            return _Info({chr(av)}, {chr(av)})
        if op is sre.AT or op in (sre.ASSERT, sre.ASSERT_NOT):
            return _Info({""}, None)  # zero width: the strings on both sides stay adjacent
        if op is sre.IN:
            chars = _class_chars(av)
            return _Info(chars, chars) if chars else _Info(None, None)
        if op is sre.BRANCH:
            return self.branch(av[1])
        if op is sre.SUBPATTERN:
            _, add_flags, _, sub = av
            if add_flags & sre.SRE_FLAG_IGNORECASE:
                self.icase = True
            return self.sequence(sub)
        if op is getattr(sre, "ATOMIC_GROUP", None):
            return self.sequence(av)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) or op is getattr(sre, "POSSESSIVE_REPEAT", None):
            return self.repeat(*av)
        return _Info(None, None)  # ANY, NOT_LITERAL, GROUPREF, GROUPREF_EXISTS, CATEGORY: anything

    def branch(self, alternatives) -> _Info:
        infos = [self.sequence(alt) for alt in alternatives]
        exact: set[str] | None = set()
        required: set[str] | None = set()
        for info in infos:
            if exact is not None and info.exact is not None:
                exact |= info.exact
            else:
                exact = None
            need = info.required or _as_required(info.exact)
            if required is not None and need:
                required |= need
            else:
                required = None
        if exact is not None and len(exact) > MAX_EXACT:
            exact = None
        return _Info(exact, required or None)

    def repeat(self, lo: int, hi: int, item) -> _Info:
        inner = self.sequence(item)
        if lo == 0:
            return _Info({""} if hi == 0 else None, None)
        exact = None
        if lo == hi and inner.exact is not None and len(inner.exact) ** lo <= MAX_EXACT:
            exact = {""}
            for _ in range(lo):
                exact = {a + b for a in exact for b in inner.exact}
        return _Info(exact, inner.required or _as_required(inner.exact))


def _class_chars(items) -> set[str] | None:
    chars: set[str] = set()
    for op, av in items:
        if op is sre.LITERAL:
            chars.add(chr(av))
        elif op is sre.RANGE and av[1] - av[0] < MAX_CLASS:
            chars.update(chr(c) for c in range(av[0], av[1] + 1))
        else:  # NEGATE, CATEGORY, a wide RANGE
            return None
        if len(chars) > MAX_CLASS:
            return None
    return chars or None


@functools.lru_cache(maxsize=4096)  # every analysis reads the same rules: parse each pattern once a process
def required_literals(pattern: str) -> Literals | None:
    """The literals any match of `pattern` must contain, or None when no such set is certain."""
    try:
        with warnings.catch_warnings():
            # Python warns where it reads a class differently from Rust ([[:alpha:]], [a-z&&[^x]]): no prefilter
            warnings.simplefilter("error", FutureWarning)
            tree = sre_parse.parse(pattern)
    except (re.error, FutureWarning, OverflowError, RecursionError, TypeError, ValueError):
        return None
    analyzer = _Analyzer()
    info = analyzer.sequence(tree)
    strings = info.required or _as_required(info.exact)
    if not strings:
        return None
    icase = analyzer.icase or bool(tree.state.flags & sre.SRE_FLAG_IGNORECASE)
    also = [f for f in analyzer.factors if f != strings and _telling(f)]
    also = sorted(also, key=_rank, reverse=True)[:MAX_ALSO]
    if icase:
        if not all(s.isascii() for s in strings.union(*also)):
            return None  # Unicode case folding is beyond a lower-cased substring test
        strings = {s.lower() for s in strings}
        also = [{s.lower() for s in f} for f in also]
    return Literals(frozenset(strings), icase, tuple(frozenset(f) for f in also))


def _telling(strings: set[str]) -> bool:
    """Whether a further set is worth a test: not in every line of some log, no string shorter than 3."""
    return not _ubiquitous(strings) and min(map(len, strings)) >= 3


def rust_literal(text: str) -> str:
    """`text` as a Rust regex that matches it literally."""
    out = []
    for c in text:
        if c in RUST_META:
            out.append("\\" + c)
        elif not c.isprintable():
            out.append(f"\\x{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def _without_superstrings(strings: set[str], also_covered_by: set[str] = frozenset(), fold: bool = False) -> list[str]:
    """Drop each string that contains another: a line holding it holds the shorter one too."""
    covers = strings | set(also_covered_by)

    def key(x: str) -> str:
        return x.lower() if fold else x

    kept = [s for s in strings if not any(o != s and key(o) in key(s) for o in covers)]
    return sorted(kept, key=lambda s: (-len(s), s))


def literal_searches(sets: list[Literals]) -> list[str]:
    """Rust regexes, each a plain alternation of literals, that together match every line any set needs.

    Plain and case-insensitive literals go to separate searches: mixed into one regex, a `(?i:...)` part
    takes the whole search off the engine's fast literal path; plain literals just past what one SIMD
    search holds are split in two. Literals containing another literal are left out (redundant), which also
    spares the engine the false candidates of their first bytes.
    """
    folded = {s for ls in sets if ls.icase for s in ls.strings}
    plain = {s for ls in sets if not ls.icase for s in ls.strings}
    plain = {s for s in plain if not any(f in s.lower() for f in folded)}
    kept = _without_superstrings(plain)
    parts = 2 if SIMD_LITERALS < len(kept) <= 2 * SIMD_LITERALS else 1
    searches = ["|".join(rust_literal(s) for s in kept[part::parts]) for part in range(parts) if kept]
    if folded:
        searches.append("(?i)" + "|".join(rust_literal(s) for s in _without_superstrings(folded, fold=True)))
    return searches


LiteralKey = tuple[str, bool]  # (text, case-insensitive): lower-cased when case-insensitive


class LiteralFinder(ABC):
    """Finds the lines of a batch that hold any of the literals, and which literals each holds."""

    def __init__(self, literals: list[LiteralKey]):
        self.literals = literals

    @abstractmethod
    def lines_holding(self, batch: LineBatch) -> dict[int, list[int]]:
        """Index into batch.lines of each owned line holding a literal -> the indexes of those literals."""

    @abstractmethod
    def any_in(self, texts: list[bytes]) -> list[bool]:
        """For each text, whether it holds any literal (a whole file at once: no line is needed)."""


class PolarsLiteralFinder(LiteralFinder):
    """The literal searches in polars' Rust regex engine, over the batch's string column.

    Which literals a candidate line holds is found again, in one Aho-Corasick call over the candidates
    when they are many, else by substring tests in Python.
    """

    def __init__(self, literals: list[LiteralKey]):
        super().__init__(literals)
        self.searches = literal_searches([Literals(frozenset({text}), icase) for text, icase in literals])
        self._plain = [i for i, (_, icase) in enumerate(literals) if not icase]
        self._folded = [i for i, (_, icase) in enumerate(literals) if icase]
        self._python_lookup_max = LITERAL_TESTS_IN_PYTHON_MAX // max(1, len(self._plain))
        self._plain_texts = [literals[i][0] for i in self._plain]
        self._plain_index = {literals[i][0]: i for i in self._plain}

    def lines_holding(self, batch: LineBatch) -> dict[int, list[int]]:
        lines = owned_lines(batch)
        if not self.searches or lines.len() == 0:
            return {}
        rows = np.flatnonzero(_any_contains(lines, self.searches))
        if len(rows) == 0:
            return {}
        plain_found: list[list[str]] | None = None
        if len(rows) > self._python_lookup_max and self._plain:
            plain_found = lines.gather(rows).str.extract_many(self._plain_texts, overlapping=True).to_list()
        held: dict[int, list[int]] = {}
        for n, row in enumerate((rows + batch.own_start).tolist()):
            text = batch.text(row)
            if plain_found is not None:
                ids = sorted({self._plain_index[s] for s in plain_found[n]})
            else:
                ids = [i for i in self._plain if self.literals[i][0] in text]
            if self._folded:
                lowered = text.lower()
                ids += [i for i in self._folded if self.literals[i][0] in lowered]
            if ids:
                held[row] = ids
        return held

    def any_in(self, texts: list[bytes]) -> list[bool]:
        if not self.searches:
            return [False] * len(texts)
        return _any_contains(text_column(texts), self.searches).tolist()


class HyperscanLiteralFinder(LiteralFinder):
    """The literals in one Hyperscan database, searched over the batch's bytes (SIMD, several GB/s).

    Hyperscan reports each literal where it ends, so the lines and the literals they hold come from the
    same pass. Case-insensitive literals fold ASCII case only (the rules' own regexes fold Unicode, so a
    line whose match needs Unicode folding, like the Kelvin sign for "k", is missed: no rule needs one).
    """

    def __init__(self, literals: list[LiteralKey]):
        super().__init__(literals)
        self._database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._database.compile(
            expressions=[text.encode("utf-8") for text, _ in literals],
            ids=list(range(len(literals))),
            elements=len(literals),
            flags=[hyperscan.HS_FLAG_CASELESS if icase else 0 for _, icase in literals],
            literal=True,
        )
        self._local = threading.local()  # a scan needs scratch space of its own in each thread

    def _scratch(self):
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self._database)
        return scratch

    def lines_holding(self, batch: LineBatch) -> dict[int, list[int]]:
        starts = batch.offsets
        begin, end = int(starts[batch.own_start]), int(starts[batch.own_end])
        found: list[tuple[int, int]] = []
        self._database.scan(
            batch.data[begin:end],
            match_event_handler=lambda literal, _start, stop, _flags, _ctx: found.append((stop, literal)),
            scratch=self._scratch(),
        )
        if not found:
            return {}
        stops = np.fromiter((stop for stop, _ in found), dtype=np.int64, count=len(found)) + (begin - 1)
        rows = np.searchsorted(starts, stops, side="right") - 1  # the line holding each match's last byte
        held: dict[int, set[int]] = {}
        for row, (_, literal) in zip(rows.tolist(), found, strict=True):
            held.setdefault(row, set()).add(literal)
        return {row: sorted(ids) for row, ids in held.items()}

    def any_in(self, texts: list[bytes]) -> list[bool]:
        return [self._holds_any(text) for text in texts]

    def _holds_any(self, text: bytes) -> bool:
        try:
            self._database.scan(text, match_event_handler=lambda *_: True, scratch=self._scratch())
        except hyperscan.ScanTerminated:  # the handler stopped the scan at the first literal
            return True
        return False


def literal_finder(literals: Iterable[LiteralKey]) -> LiteralFinder:
    """Hyperscan where it is installed (or asked for in FORENSICS_LITERAL_ENGINE), else polars."""
    engine = os.environ.get(ENGINE_VARIABLE, "hyperscan" if hyperscan is not None else "polars")
    return _literal_finder(tuple(sorted(set(literals))), engine)


@functools.lru_cache(maxsize=8)  # the finders hold no state of a scan: one per rule set and engine a process
def _literal_finder(ordered: tuple[LiteralKey, ...], engine: str) -> LiteralFinder:
    if engine == "hyperscan" and hyperscan is not None and ordered:
        try:
            return HyperscanLiteralFinder(list(ordered))
        except hyperscan.error:  # a literal the compiler refuses: the slower engine reads it all the same
            pass
    return PolarsLiteralFinder(list(ordered))


# `^` and `$` at line ends, as in the rules' (?m) form; a pattern that can match nothing is still a candidate
LINE_REGEX_FLAGS = (hyperscan.HS_FLAG_MULTILINE | hyperscan.HS_FLAG_ALLOWEMPTY) if hyperscan is not None else 0


class LineRegexFinder:
    """Regexes searched over a batch's bytes in one Hyperscan pass: the lines each may match.

    For the patterns whose literals are in most lines (LineExtractor.literal_prefilter False), a pattern being
    a trigger and, optionally, a second regex the same line must match too (`(T)[^\\n]*(R)|(R)[^\\n]*(T)`).
    Hyperscan reports where each match ends; the line holding that byte is a candidate. Its classes are ASCII
    and `\\s` may cross a newline, so the lines are a superset, each told apart again by the pattern's own
    regex; a pattern Hyperscan cannot compile (a look-around, a back-reference) is left to `fallback`.
    """

    def __init__(self, patterns: list[tuple[str, str | None]]):
        self.expressions: dict[int, bytes] = {}
        engine = os.environ.get(ENGINE_VARIABLE, "hyperscan")
        for index, (trigger, requires) in enumerate(patterns):
            expression = _both_on_one_line(trigger, requires).encode()
            if hyperscan is not None and engine == "hyperscan" and _hyperscan_compiles(expression):
                self.expressions[index] = expression
        self.fallback = [i for i in range(len(patterns)) if i not in self.expressions]
        self._database = None
        if self.expressions:
            self._database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            self._database.compile(
                expressions=list(self.expressions.values()),
                ids=list(self.expressions),
                elements=len(self.expressions),
                flags=[LINE_REGEX_FLAGS] * len(self.expressions),
            )
        self._local = threading.local()

    def lines_matching(self, batch: LineBatch) -> dict[int, set[int]]:
        """Index into batch.lines of each owned line a compiled pattern may match -> those patterns."""
        if self._database is None:
            return {}
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self._database)
        starts = batch.offsets
        begin, end = int(starts[batch.own_start]), int(starts[batch.own_end])
        found: list[tuple[int, int]] = []
        self._database.scan(
            batch.data[begin:end],
            match_event_handler=lambda pattern, _start, stop, _flags, _ctx: found.append((stop, pattern)),
            scratch=scratch,
        )
        if not found:
            return {}
        stops = np.fromiter((stop for stop, _ in found), dtype=np.int64, count=len(found)) + (begin - 1)
        rows = np.searchsorted(starts, np.maximum(stops, begin), side="right") - 1
        held: dict[int, set[int]] = {}
        for row, (_, pattern) in zip(rows.tolist(), found, strict=True):
            held.setdefault(row, set()).add(pattern)
        return held


def _both_on_one_line(trigger: str, requires: str | None) -> str:
    """One regex for a line that both match, in either order (a line of its own: `.` stops at a newline)."""
    if requires is None:
        return trigger
    return f"(?:{trigger})[^\\n]*(?:{requires})|(?:{requires})[^\\n]*(?:{trigger})"


def line_regex_finder(patterns: list[tuple[str, str | None]]) -> LineRegexFinder:
    """The finder of these patterns, built once a process for each set and engine (a compile takes ~50 ms)."""
    return _line_regex_finder(tuple(patterns), os.environ.get(ENGINE_VARIABLE, "hyperscan"))


@functools.lru_cache(maxsize=8)
def _line_regex_finder(patterns: tuple[tuple[str, str | None], ...], _engine: str) -> LineRegexFinder:
    return LineRegexFinder(list(patterns))


@functools.lru_cache(maxsize=4096)
def _hyperscan_compiles(expression: bytes) -> bool:
    try:
        hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK).compile(expressions=[expression], flags=[LINE_REGEX_FLAGS])
    except hyperscan.error:
        return False
    return True


def owned_lines(batch: LineBatch) -> pl.Series:
    """The lines of the batch that it owns (not the context shared with a neighbour)."""
    if batch.own_start or batch.own_end != batch.lines.len():
        return batch.lines.slice(batch.own_start, batch.own_end - batch.own_start)
    return batch.lines


def text_column(texts: list[bytes]) -> pl.Series:
    """Whole texts as one string column (invalid UTF-8 replaced), for a search over each at once."""
    return pl.Series("t", [t.decode("utf-8", "replace") for t in texts], dtype=pl.String)


def _any_contains(column: pl.Series, searches: list[str]) -> np.ndarray:
    """A mask of the strings that any of the regexes matches."""
    if len(searches) == 1:
        return column.str.contains(searches[0]).to_numpy()
    found = pl.DataFrame({"line": column}).select(pl.any_horizontal([pl.col("line").str.contains(s) for s in searches]))
    return found.to_series().to_numpy()
