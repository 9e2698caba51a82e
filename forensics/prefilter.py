"""Literal prefilters: strings of which at least one appears in every line a regex matches.

Scanning a batch for one alternation of plain strings runs several times faster than the alternation of
the regexes themselves, which the Rust regex engine must walk as a DFA over every byte (and which stops
fitting its cache past a few dozen patterns). Up to about 70 literals the search is SIMD (Teddy); past
that an Aho-Corasick automaton, 2-4x slower, and then flat however many rules are added. The same
literals tell, for each of the few candidate lines, which regexes are worth trying.

The literals are read from the regex's parse tree (Python's own parser), the way RE2 and code-search
prefilters do it: a sequence needs its most selective factor, an alternation needs one of its branches,
an optional part needs nothing. When nothing is certain (a pattern made only of classes and repeats, a
syntax Python cannot parse) the pattern has no prefilter and is searched in full.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

try:  # Python 3.11+
    from re import _constants as sre
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MAX_EXACT = 64  # sets of exact strings larger than this stop being tracked
MAX_CLASS = 8  # a character class of at most this many characters counts as exact ([KMGT], [-+])
# The Rust regex engine searches up to about 70 literals with SIMD (Teddy), more with Aho-Corasick at a
# third of the speed. Two SIMD searches of half the literals each beat one Aho-Corasick; more do not.
SIMD_LITERALS = 64
RUST_META = set("\\.+*?()|[]{}^$#&-~")


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


def _better(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    """The more selective requirement: the longer shortest string, then the fewer strings."""
    if not a:
        return b or None
    if not b:
        return a
    return a if (min(map(len, a)), -len(a)) >= (min(map(len, b)), -len(b)) else b


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
