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

    def found_in(self, line: str, lowered: str) -> bool:
        haystack = lowered if self.icase else line
        return any(s in haystack for s in self.strings)


@dataclass
class _Info:
    exact: set[str] | None  # the node always matches one of these strings
    required: set[str] | None  # any match contains one of these strings


# Literals that every line of some log holds, however long: the prefix NCCL writes before each of its INFO
# lines, by the million with NCCL_DEBUG=INFO. A pattern's other required literals are searched instead (in
# nccl-return-chain, " -> 2"), as long as it has any: which literals are searched never changes what matches.
UBIQUITOUS = ("NCCL INFO ",)


def _ubiquitous(strings: set[str]) -> bool:
    return any(s in u for s in strings for u in UBIQUITOUS)


def _better(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    """The more selective requirement: one without an ubiquitous literal, then the longer shortest string,
    then the fewer strings."""
    if not a:
        return b or None
    if not b:
        return a

    def rank(x: set[str]) -> tuple[bool, int, int]:
        return (not _ubiquitous(x), min(map(len, x)), -len(x))

    return a if rank(a) >= rank(b) else b


def _as_required(exact: set[str] | None) -> set[str] | None:
    return exact if exact and "" not in exact else None


class _Analyzer:
    def __init__(self) -> None:
        self.icase = False

    def sequence(self, nodes) -> _Info:
        run = {""}  # the exact strings of the current stretch of exact nodes
        exact = True  # every node so far was exact, and their product stayed small
        best: set[str] | None = None
        for op, av in nodes:
            info = self.node(op, av)
            if info.exact is not None and len(run) * len(info.exact) <= MAX_EXACT:
                run = {a + b for a in run for b in info.exact}
                continue
            exact = False
            best = _better(best, _as_required(run))
            best = _better(best, info.required)
            run = set(info.exact) if info.exact is not None and len(info.exact) <= MAX_EXACT else {""}
        best = _better(best, _as_required(run))
        return _Info(run if exact else None, best)

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
    if icase:
        if not all(s.isascii() for s in strings):
            return None  # Unicode case folding is beyond a lower-cased substring test
        strings = {s.lower() for s in strings}
    return Literals(frozenset(strings), icase)


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
    ordered = sorted(set(literals))
    engine = os.environ.get(ENGINE_VARIABLE, "hyperscan" if hyperscan is not None else "polars")
    if engine == "hyperscan" and hyperscan is not None and ordered:
        try:
            return HyperscanLiteralFinder(ordered)
        except hyperscan.error:  # a literal the compiler refuses: the slower engine reads it all the same
            pass
    return PolarsLiteralFinder(ordered)


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
