"""The text-log scanner: Rust finds what every pattern matches; Python reads only what it must.

Per batch of lines, in native code:

1. one search for the literals that every rule regex and extractor trigger needs (prefilter.py; a pattern
   without such literals is searched in full): the candidate lines, and the patterns worth trying on each;
2. one polars call that tries those patterns on those lines in Rust's linear-time engine, the pairs sorted
   by pattern so that each regex is compiled once: what matches where is known before Python sees a line
   (a batch with only a few short candidates, as most small files have, is told apart by Python's regexes,
   compiled once: Rust compiles a rule's regex anew on each call, up to 13 ms for one);
3. an extractor that reads a whole batch (verl's step lines) gets its lines as one column;
4. repeats of a line (the same patterns, the same origin, the same text but for its numbers and times) are
   grouped, and only the first of each group becomes an event, the others being counted into it: memory
   grows with distinct events, not with lines.

Python then handles the remaining lines one by one: rule values, extractor fields, prefixes and times. The
alternation of all the patterns is never run: past a few dozen patterns its automaton stops fitting the
regex engine's cache and it slows down a thousandfold, while a literal search stays flat.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import regex

from forensics.line_prefixes import RANK_IN_MESSAGE, FileContext, attribute, file_context, rust_form
from forensics.prefilter import (
    Literals,
    line_regex_finder,
    literal_finder,
    owned_lines,
    required_literals,
    text_column,
)
from forensics.rules.model import USER_REGEX_TIMEOUT_S, MatchClause, Rule
from forensics.sources.base import BatchLines, Hit, LineExtractor, LineRecord, Sink
from forensics.textio import LineBatch, iter_line_batches, open_binary, prefetched, read_problem
from forensics.tracebacks import cut_traceback

ALSO_IN_PYTHON_MAX = 32  # a pattern's candidate lines tested for its further literals in Python, more in Rust
PAIRS_IN_PYTHON_MAX = 64  # a batch with at most this many (line, pattern) pairs to try,
SHORT_LINE_BYTES = 2048  # on lines no longer than this, tries them in Python (no backtracking risk to speak of)
MAX_HITS_PER_FILE = 200_000  # distinct matching lines; past them only the error rules' lines are read (a warning)
MAX_ERROR_HITS_PER_FILE = 50_000  # those error lines, past the cap; past them the file is counted, not read
SERIOUS = frozenset({"error", "critical"})
LOOKBACK_LINES = 64  # how far above an undated error its time is looked for (a long traceback fits)
CUT_TRACEBACK_LINES = 200  # the last lines of a file read for a traceback cut before its exception line
CUT_TAIL_BYTES = 4096  # the end of a small file searched for a frame before it is skipped as matching nothing
FRAME_TEXT = '", line '  # in every traceback frame: `File "x.py", line 12, in f`
FRAME_MARK = FRAME_TEXT.encode()
CUT_LAST_FRAME_LINES = 8  # how close to the end of a file the last frame of a cut traceback is
RULE_TIME_BUDGET_S = 10.0  # Python time one rule may spend on its matching lines before it is switched off
# What tells repeats apart (see _repeat_groups): the line's prefixes (Ray actor; torchrun, MPI and srun ranks; a
# host), the pid of a Ray C++ log line, NCCL's host:pid, a rank named in the text; the rest is compared with its
# numbers masked. ORIGIN takes every prefix `attribute` may peel (line_prefixes.ANY_PREFIX, in ASCII classes), and
# more where they look alike; a log viewer's line counter and a container runtime's time in it are masked.
ORIGIN = (
    r"^(?:\x1b\[[0-9;?]*[A-Za-z]|\[[0-9;]*m|\([^()]*\)|[ \t]|>+|\[(?:default|rank)[0-9]+\]:"
    r"|\[[0-9]+,[0-9]+\]<(?:stdout|stderr)>:|\[[0-9]{1,9}\] |[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z "
    r"|[A-Za-z0-9][A-Za-z0-9_.-]{0,62}: )*"
)
ORIGIN_NOISE = r"\[[0-9]{1,9}\] |[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z "
NCCL_ORIGIN = r"[^: \t]+:[0-9]+:[0-9]+ (?:\[[0-9]+\] )?.*?NCCL "
RAY_LOG_PID = r"^\[[^\]]*? [IWEFDC] ([0-9]+) [0-9]+\]"  # Ray's C++ logs: `[ts I pid tid]`
RANK_NAMED = rust_form(RANK_IN_MESSAGE.pattern).replace(r"\d", "[0-9]")
NUMBERS = r"0x[0-9a-fA-F]+|[0-9]+"


SHAPES_IN_PYTHON_MAX = 64  # fewer lines than this are keyed in Python: a polars call costs ~0.2 ms
_SHAPE_PARTS = [  # (pattern, group, what of it is masked)
    (re.compile(ORIGIN), 0, re.compile(ORIGIN_NOISE)),
    (re.compile(RAY_LOG_PID), 1, None),
    (re.compile(NCCL_ORIGIN), 0, None),
    (re.compile(RANK_NAMED), 0, None),
]
_NUMBERS = re.compile(NUMBERS)


def _shapes(batch: LineBatch, rows: list[int]) -> list[str]:
    """What tells the lines apart once repeats are counted: origin, NCCL host:pid, rank named, masked text.

    Many lines at once in Rust; a few in Python, with the same patterns (ASCII classes, which both engines
    read alike; a line longer than MAX_LINE_CHARS may be keyed apart, and its repeats counted apart).
    """
    if len(rows) < SHAPES_IN_PYTHON_MAX:
        texts = [batch.text(row) for row in rows]
        return ["\x1f".join([*(_first(*part, t) for part in _SHAPE_PARTS), _NUMBERS.sub("#", t)]) for t in texts]
    line = pl.col("line")
    parts = []
    for pattern, group, noise in _SHAPE_PARTS:
        part = line.str.extract(pattern.pattern, group).fill_null("")
        parts.append(part.str.replace_all(noise.pattern, "#") if noise is not None else part)
    key = pl.concat_str([*parts, line.str.replace_all(NUMBERS, "#")], separator="\x1f")
    lines = batch.lines.gather(np.array(rows, dtype=np.int64)).str.strip_chars_end("\r\n")
    return pl.DataFrame({"line": lines}).select(key).to_series().to_list()


def _first(pattern: re.Pattern, group: int, noise: re.Pattern | None, text: str) -> str:
    m = pattern.search(text)
    found = (m.group(group) or "") if m else ""
    return noise.sub("#", found) if noise is not None and found else found


_ANY_LINE = re.compile("")


def prefilter_form(pattern: str) -> str:
    """The pattern without group names, so that patterns without literals can share one alternation."""
    return rust_form(pattern)


@dataclass(frozen=True)
class _Pattern:
    rust: str
    rule: Rule | None = None
    extractor: LineExtractor | None = None
    literals: Literals | None = field(default=None, compare=False)
    folds: re.Pattern | None = None  # lines whose repeats may be counted into one event (see LineExtractor)
    search: Callable[[str], object] | None = field(default=None, compare=False)  # Python's, None: Rust only
    in_full: bool = False  # searched over the whole batch, not through literals (see TextScanner.__init__)

    def matches(self, line: str) -> bool:
        """Whether Python's regex matches `line`; a pattern only Rust reads, or a rule's regex that times out,
        counts as matched (the handler, or the rule, reads the line again and says)."""
        try:
            return self.search is None or self.search(line) is not None
        except TimeoutError:
            return True


def _rule_pattern(rule: Rule, index: int) -> _Pattern:
    """A rule clause's regex; a clause that reads other lines (followed_by, extract_window) never folds."""
    clause = rule.match[index]
    folds = _ANY_LINE if clause.followed_by is None and not rule.extract_window else None
    search = _first_use_search(clause)
    literals = required_literals(clause.regex)
    if literals is not None and literals.weak:  # " -> " is in lines of every kind: search in full
        return _Pattern(prefilter_form(clause.regex), rule, None, None, folds, search, in_full=True)
    return _Pattern(prefilter_form(clause.regex), rule, None, literals, folds, search)


def _first_use_search(clause: MatchClause) -> Callable[[str], object]:
    """The clause's search, its regex compiled when a line first reaches it (a run's lines reach few rules), with
    a time limit (a user's regex may backtrack)."""

    def search(line: str) -> object:
        return clause.compiled.search(line, timeout=USER_REGEX_TIMEOUT_S)

    return search


def _extractor_pattern(extractor: LineExtractor) -> _Pattern:
    literals = required_literals(extractor.trigger) if extractor.literal_prefilter else None
    folds = re.compile(extractor.folds) if extractor.folds is not None else None
    search = _python_search(extractor.trigger)
    if extractor.requires is not None:  # Python tells a few lines apart with both (or leaves them to the handler)
        search = _both(search, _python_search(extractor.requires))
    in_full = not extractor.literal_prefilter
    return _Pattern(prefilter_form(extractor.trigger), None, extractor, literals, folds, search, in_full)


def _both(
    first: Callable[[str], object] | None, second: Callable[[str], object] | None
) -> Callable[[str], object] | None:
    """A search that finds a line when both do; None (Rust reads it) when either is Rust's only."""
    if first is None or second is None:
        return None

    def search(line: str) -> object:
        return True if first(line) is not None and second(line) is not None else None

    return search


def _python_search(pattern: str) -> Callable[[str], object] | None:
    """The pattern's search in Python; None when only Rust reads it."""
    for compile_ in (re.compile, regex.compile):
        try:
            return compile_(pattern).search
        except (re.error, regex.error, ValueError, OverflowError):
            continue
    return None


class TextScanner:
    """Scans text logs with the rules and the line extractors of every source module."""

    def __init__(self, rules: list[Rule], extractors: list[LineExtractor]):
        patterns: list[_Pattern] = [_extractor_pattern(e) for e in extractors]
        for rule in rules:
            patterns.extend(_rule_pattern(rule, i) for i in range(len(rule.match)))
        self.patterns = patterns
        self.rules = rules
        self.families = [r for r in rules if r.is_family]
        self._class_of = {r.id: r.cls for r in rules}
        keys = {(s, p.literals.icase) for p in patterns if p.literals is not None for s in p.literals.strings}
        self.finder = literal_finder(keys)
        # literal -> indexes of the patterns that need it; patterns without literals are tried on every line
        # their alternation matches
        needed_by: dict[tuple[str, bool], list[int]] = {}
        for i, p in enumerate(patterns):
            for s in p.literals.strings if p.literals else ():
                needed_by.setdefault((s, p.literals.icase), []).append(i)
        self._patterns_of = [needed_by[key] for key in self.finder.literals]
        self._also = {i: p.literals for i, p in enumerate(patterns) if p.literals is not None and p.literals.also}
        self._checks_also = set(self._also)
        # extractors whose trigger Rust searches over the whole batch (LineExtractor.literal_prefilter), then
        # the lines it finds for what they require: (pattern, trigger, required regex or None)
        # patterns searched in full, without literals: extractors whose words are in most lines
        # (LineExtractor.literal_prefilter False) and rules whose only literals are punctuation (_Pattern.in_full)
        searched_ = [i for i, p in enumerate(patterns) if p.in_full]
        requires = {i: prefilter_form(e.requires) for i in searched_ if (e := patterns[i].extractor) and e.requires}
        self._line_regexes = line_regex_finder([(patterns[i].rust, requires.get(i)) for i in searched_])
        self._searched_patterns = searched_  # LineRegexFinder's pattern n is pattern searched_[n]
        self._searched_all = [
            (i, f"(?m){patterns[i].rust}", f"(?m){requires[i]}" if i in requires else None) for i in searched_
        ]
        # those Hyperscan cannot compile (or without Hyperscan), Rust searches over each batch
        self._searched = [self._searched_all[n] for n in self._line_regexes.fallback]
        searched = set(searched_)
        self._always = [i for i, p in enumerate(patterns) if p.literals is None and i not in searched]
        self.unfiltered = "(?m)" + "|".join(f"(?:{patterns[i].rust})" for i in self._always) if self._always else None
        self._regexes = pl.Series("regex", [f"(?m){p.rust}" for p in patterns], dtype=pl.String)
        self._requires = {  # pattern -> the second regex its lines must match (LineExtractor.requires)
            i: f"(?m){prefilter_form(p.extractor.requires)}"
            for i, p in enumerate(patterns)
            if p.extractor is not None and p.extractor.requires is not None
        }
        self._reads_batches = [p.extractor is not None and p.extractor.handle_batch is not None for p in patterns]
        self._rule_seconds: dict[str, float] = {}
        self.disabled: dict[str, tuple[str, str]] = {}  # rule id -> (file that tripped it, warning)
        self._off: tuple[int, set[int]] = (0, set())  # (rules switched off, their patterns)

    def scan(self, path: Path, rel: str, sink: Sink, *, read_ahead: bool = False) -> tuple[int, list[str]]:
        """Read one text file into the sink; returns its line count and any warnings.

        `read_ahead` reads the next batch in a helper thread while this one is scanned: worth it for a
        file too large for the thread pool to balance against the others.
        """
        fctx = _with_year(file_context(rel), path)
        warnings: list[str] = []
        lines = 0
        file = _FileScan(rel, fctx, sink)
        last: LineBatch | None = None
        try:
            with open_binary(path) as stream:
                batches = iter_line_batches(stream)
                for batch in prefetched(batches) if read_ahead else batches:
                    lines = batch.first_line + len(batch.lines) - 1
                    last = batch
                    if file.handled < MAX_HITS_PER_FILE + MAX_ERROR_HITS_PER_FILE:
                        capped = file.handled >= MAX_HITS_PER_FILE
                        self._scan_batch(batch, file)
                        if not capped and file.handled >= MAX_HITS_PER_FILE:
                            warnings.append(
                                f"{rel}: over {MAX_HITS_PER_FILE:,} distinct matching lines; after them only the "
                                "lines of error rules were read"
                            )
                        if file.handled >= MAX_HITS_PER_FILE + MAX_ERROR_HITS_PER_FILE:
                            warnings.append(
                                f"{rel}: over {MAX_ERROR_HITS_PER_FILE:,} more error lines; the rest "
                                "were counted, not read"
                            )
                if last is not None:
                    self._traceback_cut_at_end(last, rel, fctx, sink)
                problem = read_problem(stream)
                if problem:
                    warnings.append(f"{rel}: {problem}; the {lines:,} lines before it were read")
        except (OSError, EOFError, ValueError) as exc:
            warnings.append(f"{rel}: read stopped at line {lines}: {type(exc).__name__}: {exc}")
        warnings.extend(message for owner, message in self.disabled.values() if owner == rel)
        return lines, warnings

    def hits(self, batch: LineBatch) -> Iterator[tuple[int, str, list[_Pattern]]]:
        """(index into batch.lines, text, matching patterns) of each owned line that some pattern matches."""
        for row, found in self.matches(batch):
            yield row, batch.text(row), [self.patterns[i] for i in found]

    def matches(self, batch: LineBatch) -> list[tuple[int, list[int]]]:
        """(index into batch.lines, indexes of the patterns that match it) of each owned line some pattern
        matches, in line order; decided in Rust, or in Python for a few short lines (see the module doc)."""
        if batch.own_end <= batch.own_start:
            return []
        rows, tried = self._candidates(batch)
        if not len(rows):
            return []
        order = np.lexsort((rows, tried))  # by pattern, so that each regex is compiled once
        rows, tried = rows[order], tried[order]
        lengths = batch.offsets[rows + 1] - batch.offsets[rows]
        if len(rows) <= PAIRS_IN_PYTHON_MAX and int(lengths.max()) <= SHORT_LINE_BYTES:
            texts = {row: batch.text(row) for row in set(rows.tolist())}
            tries = zip(rows.tolist(), tried.tolist(), strict=True)
            matched = np.array([self.patterns[i].matches(texts[row]) for row, i in tries], dtype=bool)
        else:
            pairs = pl.DataFrame({"line": batch.lines.gather(rows), "regex": self._regexes.gather(tried)})
            matched = pairs.select(pl.col("line").str.contains(pl.col("regex"))).to_series().to_numpy()
            for index, regex_ in self._requires.items():  # and, for an extractor that requires more, that too
                picked = np.flatnonzero(matched & (tried == index))
                if len(picked):
                    matched[picked] = batch.lines.gather(rows[picked]).str.contains(regex_).to_numpy()
        found: dict[int, list[int]] = {}
        for row, pattern in zip(rows[matched].tolist(), tried[matched].tolist(), strict=True):
            found.setdefault(row, []).append(pattern)
        return sorted(found.items())

    def may_match(self, texts: list[bytes]) -> list[bool]:
        """For each whole text, whether any pattern may match a line of it (False: none can).

        A search can only match more of a whole text than of its lines one by one, so none is missed.
        """
        found = [hit or _may_end_in_traceback(text) for hit, text in zip(self.finder.any_in(texts), texts, strict=True)]
        if self.unfiltered is not None and texts:
            unfiltered = text_column(texts).str.contains(self.unfiltered).to_list()
            found = [a or b for a, b in zip(found, unfiltered, strict=True)]
        column = text_column(texts) if self._searched_all and texts else None
        for _, trigger, requires in self._searched_all if column is not None else ():
            hit = column.str.contains(trigger)  # both anywhere in a whole text: true of it when true of a line
            if requires is not None:
                hit = hit & column.str.contains(requires)
            found = [a or b for a, b in zip(found, hit.to_list(), strict=True)]
        return found

    def _candidates(self, batch: LineBatch) -> tuple[np.ndarray, np.ndarray]:
        """(row, pattern) pairs worth trying: the patterns whose literals each line holds, the patterns
        without literals on the lines their alternation matches; never a rule that was switched off."""
        held = self.finder.lines_holding(batch)
        unfiltered: set[int] = set()
        if self.unfiltered is not None:
            rows = owned_lines(batch).str.contains(self.unfiltered).arg_true() + batch.own_start
            unfiltered = set(rows.to_list())
        searched: dict[int, list[int]] = {  # row -> the patterns searched in full found it for
            row: [self._searched_patterns[n] for n in found]
            for row, found in self._line_regexes.lines_matching(batch).items()
        }
        for index, trigger, requires in self._searched:
            lines = owned_lines(batch)
            rows = lines.str.contains(trigger).arg_true()
            if requires is not None and len(rows):
                rows = rows.filter(lines.gather(rows).str.contains(requires))
            for row in (rows + batch.own_start).to_list():
                searched.setdefault(row, []).append(index)
        off = self._switched_off()
        rows_out: list[int] = []
        tried_out: list[int] = []
        for row in sorted(held.keys() | unfiltered | searched.keys()):
            tried = set().union(*(self._patterns_of[literal] for literal in held.get(row, ())))
            if row in unfiltered:
                tried.update(self._always)
            tried.update(searched.get(row, ()))
            tried -= off
            rows_out.extend([row] * len(tried))
            tried_out.extend(tried)
        rows, tried_ = np.array(rows_out, dtype=np.int64), np.array(tried_out, dtype=np.int64)
        keep = self._holding_further_literals(batch, rows, tried_)
        return (rows, tried_) if keep is None else (rows[keep], tried_[keep])

    def _holding_further_literals(self, batch: LineBatch, rows: np.ndarray, tried: np.ndarray) -> np.ndarray | None:
        """Which (row, pattern) pairs hold the pattern's further literals too (Literals.also), None for all:
        Rust tests the many lines of a pattern at once, Python the few."""
        keep: np.ndarray | None = None
        for index in self._checks_also.intersection(np.unique(tried).tolist()):
            picked = np.flatnonzero(tried == index)
            literals = self._also[index]
            if len(picked) > ALSO_IN_PYTHON_MAX:
                lines = batch.lines.gather(rows[picked])
                holds = np.ones(len(picked), dtype=bool)
                for strings in literals.also:
                    holds &= lines.str.contains_any(list(strings), ascii_case_insensitive=literals.icase).to_numpy()
            else:
                texts = [batch.text(row) for row in rows[picked].tolist()]
                holds = np.array([literals.also_in(t, t.lower() if literals.icase else t) for t in texts], dtype=bool)
            if not holds.all():
                keep = np.ones(len(rows), dtype=bool) if keep is None else keep
                keep[picked[~holds]] = False
        return keep

    def _switched_off(self) -> set[int]:
        """The patterns of the rules switched off so far (worked out again only when one more is)."""
        if self._off[0] != len(self.disabled):
            off = {i for i, p in enumerate(self.patterns) if p.rule is not None and p.rule.id in self.disabled}
            self._off = (len(self.disabled), off)
        return self._off[1]

    def _scan_batch(self, batch: LineBatch, file: _FileScan) -> None:
        """Hand the batch's matching lines over: whole columns to batch extractors, repeats to one event each,
        the rest line by line, in line order (undated lines borrow the time of an earlier one)."""
        one_by_one: list[tuple[int, list[int], str | None, _Preset | None]] = []
        by_extractor: dict[int, list[tuple[int, list[int]]]] = {}
        repeatable: list[tuple[int, list[int]]] = []
        for row, found in self.matches(batch):
            reader = next((i for i in found if self._reads_batches[i]), None)
            if reader is not None:
                by_extractor.setdefault(reader, []).append((row, found))
            elif self._repeats_fold(batch, row, found):
                repeatable.append((row, found))
            else:
                one_by_one.append((row, found, None, None))
        for index, rows in by_extractor.items():
            one_by_one.extend(self._read_in_bulk(batch, file, index, rows))
        lasts: list[tuple[int, str]] = []
        for first, found, key, count, last in self._repeat_groups(batch, repeatable):
            if key in file.silent:
                continue
            if file.sink.knows_repeat(key):
                file.pending[key] = count
            else:
                one_by_one.append((first, found, key, None))
                file.pending[key] = count - 1
            if file.pending[key]:
                lasts.append((last, key))
        earlier = _EarlierTimestamps(batch, file.fctx)
        for row, found, key, preset in sorted(one_by_one, key=lambda item: item[0]):
            if file.handled >= MAX_HITS_PER_FILE + MAX_ERROR_HITS_PER_FILE:
                break
            if file.handled >= MAX_HITS_PER_FILE and not self._serious(found):
                continue  # past the cap a file's flood is left out; its errors (the failure at its end) are not
            file.handled += 1
            text = batch.text(row)
            hit = Hit(file.rel, batch.line_number(row), text, attribute(text, file.fctx), batch, row, file.fctx)
            patterns = [self.patterns[i] for i in found]
            if not self._handle(hit, patterns, file.sink, earlier, key, preset) and key:
                file.silent.add(key)
        for row, key in lasts:
            self._count_repeats(batch, row, key, file)

    def _serious(self, found: list[int]) -> bool:
        """Whether one of these patterns is a rule of severity error or critical."""
        return any((rule := self.patterns[i].rule) is not None and rule.severity in SERIOUS for i in found)

    def _repeats_fold(self, batch: LineBatch, row: int, found: list[int]) -> bool:
        """Whether every pattern the line matched lets its repeats be counted into one event (and none reads
        the line above it, as it stands there)."""
        conditions = [self.patterns[i].folds for i in found]
        if any(c is None for c in conditions):
            return False
        text = batch.text(row) if any(c.pattern for c in conditions) else ""  # type: ignore[union-attr]
        if not all(c.match(text) for c in conditions):  # type: ignore[union-attr]
            return False
        readers = [e.reads_line_above for i in found if (e := self.patterns[i].extractor) and e.reads_line_above]
        if not readers:
            return True
        if row == 0:  # the first line of the file has none above; else the line above is not in this batch
            return batch.first_line == 1
        above = batch.text(row - 1)
        return not any(reads(above) for reads in readers)

    def _read_in_bulk(
        self, batch: LineBatch, file: _FileScan, index: int, rows: list[tuple[int, list[int]]]
    ) -> list[tuple[int, list[int], None, _Preset | None]]:
        """Give an extractor its lines as a column; returns the lines left to read one by one: those it did
        not read (with all their patterns), those it read that other patterns matched too (with those)."""
        extractor = self.patterns[index].extractor
        assert extractor is not None and extractor.handle_batch is not None
        others = {row: [i for i in patterns if i != index and not self._yields(i, extractor)] for row, patterns in rows}
        shared = np.array([row for row, _ in rows if others[row]], dtype=np.int64)
        found = BatchLines(file.rel, batch, np.array([row for row, _ in rows], dtype=np.int64), file.fctx, shared)
        read = extractor.handle_batch(found, file.sink)
        left = set(read.left.tolist())
        out: list[tuple[int, list[int], None, _Preset | None]] = []
        for row, patterns in rows:
            if row in left:
                out.append((row, patterns, None, None))
            elif others[row]:
                out.append((row, others[row], None, _Preset(extractor, read.fields.get(row, {}))))
        return out

    def _yields(self, index: int, reader: LineExtractor) -> bool:
        """Whether pattern `index` is an extractor that reads nothing of the lines `reader` reads in bulk."""
        extractor = self.patterns[index].extractor
        return extractor is not None and reader.name in extractor.yields_to

    def _repeat_groups(
        self, batch: LineBatch, lines: list[tuple[int, list[int]]]
    ) -> list[tuple[int, list[int], str, int, int]]:
        """(first row, patterns, key, lines, last row) of each group of repeats among `lines`, in line order.

        The key holds what the line's event depends on: the patterns it matched, who printed it (Ray and
        torchrun prefixes, NCCL's host:pid, a rank named in the text) and its text with every number masked.
        """
        groups: dict[str, list] = {}
        for (row, found), shape in zip(lines, _shapes(batch, [row for row, _ in lines]), strict=True):
            key = f"{found}\x1f{shape}"
            group = groups.get(key)
            if group is None:
                groups[key] = [row, found, key, 1, row]
            else:
                group[3] += 1
                group[4] = row
        return [tuple(group) for group in groups.values()]  # type: ignore[misc]

    def _count_repeats(self, batch: LineBatch, row: int, key: str, file: _FileScan) -> None:
        """The repeats of an event in this batch, the last of them at `row` (its own time, when it has one)."""
        count = file.pending.pop(key, 0)
        if file.sink.knows_repeat(key):  # else the first line made no event: nothing to count into
            file.sink.repeat(key, count, batch.line_number(row), attribute(batch.text(row), file.fctx).ts)

    def _handle(
        self,
        hit: Hit,
        patterns: list[_Pattern],
        sink: Sink,
        earlier: _EarlierTimestamps,
        key: str | None = None,
        preset: _Preset | None = None,
    ) -> bool:
        """Read one matching line into the sink; returns whether it became an event."""
        rec = LineRecord(hit)
        if preset is not None:  # a batch extractor read the line already: what its event says of it
            rec.kind, rec.source, rec.notable = preset.extractor.name, preset.extractor.source, False
            rec.fields.update(preset.fields)
        seen_rules: set[str] = set()
        for pattern in patterns:
            if pattern.extractor is not None:
                pattern.extractor.handle(rec, sink)
            elif pattern.rule is not None and pattern.rule.id not in seen_rules | self.disabled.keys():
                seen_rules.add(pattern.rule.id)
                where = (hit.file, hit.line)
                try:
                    self._within_budget(pattern.rule, where, lambda rule=pattern.rule: self._apply_rule(rule, rec))
                except TimeoutError:
                    self._disable(pattern.rule, where, f"its regex timed out (over {USER_REGEX_TIMEOUT_S:g} s) on")
        if rec.kind == "exception" and self.families and not rec.fields.get("retried"):
            self._apply_families(rec)
        if hit.ctx.ts is not None:
            earlier.seen(hit.index, hit.ctx.ts)
        elif rec.rules or rec.level in ("error", "critical"):
            # a traceback line has no time; the logging line printed just before it has one
            hit.ctx.ts = earlier.before(hit.index)
            rec.ts_inferred = hit.ctx.ts is not None
        if rec.rules or (rec.kind and rec.notable):
            sink.record(rec, repeat_key=key)
            return True
        return False

    def _traceback_cut_at_end(self, batch: LineBatch, rel: str, fctx: FileContext, sink: Sink) -> None:
        """A file that ends inside a traceback (a paste cut short, a process killed while printing) still says an
        exception was raised, and where: its last frames become an exception event of unknown class, which the
        exception families whose frames alone are telling may claim, and the diagnosis's fallback may name."""
        end = len(batch.lines)
        if not any(FRAME_TEXT in batch.text(i) for i in range(max(batch.own_start, end - CUT_LAST_FRAME_LINES), end)):
            return  # the last frame of a cut traceback is among the last lines: its source, carets, a cut name follow
        start = max(batch.own_start, end - CUT_TRACEBACK_LINES)
        tail = [batch.text(i) for i in range(start, end)]
        cut = cut_traceback(tail, lambda text: attribute(text, fctx).body)
        if cut is None:
            return
        index = start + cut[0]
        text = batch.text(index)
        hit = Hit(rel, batch.line_number(index), text, attribute(text, fctx), batch, index, fctx)
        rec = LineRecord(hit, kind="exception", source="python", level="error")
        frames = cut[1].frames
        rec.fields.update(
            exception="",
            truncated=True,
            raised_at=frames[-1].to_json(),
            frames=[f"{f.file}:{f.func}" for f in frames[-20:]],
        )
        if self.families:
            self._apply_families(rec)
        if hit.ctx.ts is None:
            hit.ctx.ts = _EarlierTimestamps(batch, fctx).before(index)
            rec.ts_inferred = hit.ctx.ts is not None
        sink.record(rec)

    def _within_budget(self, rule: Rule, where: tuple[str, int], work: Callable[[], object]) -> object:
        """Run a rule's Python regex work, switching the rule off once it has used RULE_TIME_BUDGET_S.

        The candidate search runs in Rust's linear-time engine, but telling hits apart and extracting
        values use Python's backtracking engines, where one user rule can cost seconds on every line.
        """
        start = time.perf_counter()
        try:
            return work()
        finally:
            spent = self._rule_seconds.get(rule.id, 0.0) + time.perf_counter() - start
            self._rule_seconds[rule.id] = spent
            if spent > RULE_TIME_BUDGET_S:
                self._disable(rule, where, f"its regex used over {RULE_TIME_BUDGET_S:g} s of matching, last on")

    def _disable(self, rule: Rule, where: tuple[str, int], why: str) -> None:
        message = (
            f"rule {rule.id} ({rule.path or 'no file'}): {why} {where[0]}:{where[1]}; "
            "it was switched off for the rest of this analysis"
        )
        self.disabled.setdefault(rule.id, (where[0], message))

    def _apply_families(self, rec: LineRecord) -> None:
        """The exception families an exception line belongs to (its innermost class, module, message, frames).

        A family whose class a text rule already named on the line adds nothing (the text rule is the more
        specific reading, with the values it extracts). A wrapper (`RayTaskError(X)`) is matched as X, with the
        module and message of X's own line when its printout shows it, and none otherwise: the wrapper's module
        and message say nothing about X.
        """
        named = {self._class_of.get(rule_id) for rule_id in rec.rules}
        f = rec.fields
        cls = f.get("cause") or f["exception"]
        module, message = (
            (f.get("cause_module", ""), f.get("cause_message", ""))
            if f.get("cause")
            else (f.get("exception_module", ""), f.get("exception_message", ""))
        )
        for family in self.families:
            if family.id in rec.rules or family.id in self.disabled or family.cls in named:
                continue
            try:
                hit = family.exception.matches(cls, module, message, f.get("frames", []))
            except TimeoutError:
                self._disable(
                    family, (rec.hit.file, rec.hit.line), f"its regex timed out (over {USER_REGEX_TIMEOUT_S:g} s) on"
                )
                continue
            if hit:
                rec.rules.append(family.id)

    @staticmethod
    def _apply_rule(rule: Rule, rec: LineRecord) -> None:
        body = rec.hit.ctx.body
        clause = rule.matches(body) or rule.matches(rec.hit.text)
        if clause is None:
            return
        if clause.followed_by:
            follow = clause.compiled_followed_by
            ahead = rec.hit.following(clause.window)
            if follow is None or not any(follow.search(line, timeout=USER_REGEX_TIMEOUT_S) for line in ahead):
                return
        rec.rules.append(rule.id)
        window = [body, *rec.hit.following(rule.extract_window)] if rule.extract_window else [body]
        for key, value in rule.extract_fields(window).items():
            rec.fields.setdefault(key, value)


@dataclass(frozen=True)
class _Preset:
    """A line a batch extractor read, that a rule matched too: the event's kind and fields it gave."""

    extractor: LineExtractor
    fields: dict


@dataclass
class _FileScan:
    """What the scan of one file carries from batch to batch."""

    rel: str
    fctx: FileContext
    sink: Sink
    handled: int = 0  # lines handed to Python (repeats counted into an event are not)
    silent: set[str] = field(default_factory=set)  # repeat keys whose first line made no event
    pending: dict[str, int] = field(default_factory=dict)  # repeats of this batch not yet counted


class _EarlierTimestamps:
    """The time of the nearest stamped line before a hit, among the LOOKBACK_LINES lines above it.

    The lines that matched nothing never reach Python, and many carry the only time near a traceback. They
    are read backwards from a hit on demand, each line at most once per batch, so the cost stays bounded
    by the hits that need it.
    """

    def __init__(self, batch: LineBatch, fctx: FileContext):
        self.batch = batch
        self.fctx = fctx
        self.floor = 0  # lines below this index were read already (or are out of reach)
        self.last: tuple[int, datetime] | None = None  # the latest stamped line found so far

    def seen(self, index: int, ts: datetime) -> None:
        self.last = (index, ts)
        self.floor = max(self.floor, index)

    def before(self, index: int) -> datetime | None:
        reach = max(0, index - LOOKBACK_LINES)
        for i in range(index - 1, max(self.floor, reach) - 1, -1):
            ts = attribute(self.batch.text(i), self.fctx).ts
            if ts is not None:
                self.last = (i, ts)
                break
        self.floor = max(self.floor, index)
        if self.last is not None and self.last[0] >= reach:
            return self.last[1]
        return None


def _may_end_in_traceback(text: bytes) -> bool:
    """Whether a text's last lines hold a traceback frame (it may end in a traceback cut before its exception)."""
    return FRAME_MARK in text[-CUT_TAIL_BYTES:]


def _with_year(fctx: FileContext, path: Path) -> FileContext:
    """Month-day timestamps (c10, vLLM) get the year the file was last written."""
    try:
        year = datetime.fromtimestamp(os.stat(path).st_mtime, tz=timezone.utc).year
    except OSError:
        year = None
    return FileContext(fctx.rank, fctx.pid, fctx.host, fctx.role, year)
