"""The text-log scanner: one vectorised pass per batch, Python only for the lines that may match.

Per batch of lines, in Rust (polars): one search for the literals that every rule regex and extractor
trigger needs (see prefilter.py; a pattern without such literals is searched in full). The few candidate
lines then go to Python, where the literals each one holds pick the patterns worth trying on it. The
alternation of all the patterns is never run: past a few dozen patterns its automaton stops fitting the
regex engine's cache and it slows down a thousandfold, while a literal search stays flat.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import regex

from forensics.attribution import FileContext, attribute, file_context
from forensics.prefilter import Literals, literal_searches, required_literals
from forensics.rules.model import Rule
from forensics.sources.base import Hit, LineExtractor, LineRecord, Sink
from forensics.textio import LineBatch, ReadLimitExceeded, iter_line_batches, open_binary, prefetched

_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")
MAX_HITS_PER_FILE = 200_000  # a flood of matches stops being read, with a warning
# The literals each candidate line holds are found in Rust in one call (Aho-Corasick, ~0.7 ms to build)
# when the candidates are more than this many line-literal tests (~60 ns each in Python) would cost.
LITERAL_TESTS_IN_PYTHON_MAX = 12_000
LOOKBACK_LINES = 64  # how far above an undated error its time is looked for (a long traceback fits)


def prefilter_form(pattern: str) -> str:
    """The pattern without group names, so that patterns without literals can share one alternation."""
    return _NAMED_GROUP.sub("(?:", pattern)


def _python_search(pattern: str) -> Callable[[str], object] | None:
    """The pattern's search in Python (for telling hits apart); None when only Rust can read it."""
    for compile_ in (re.compile, regex.compile):
        try:
            return compile_(pattern).search
        except (re.error, regex.error, ValueError, OverflowError):
            continue
    return None


@dataclass(frozen=True)
class _Pattern:
    rust: str
    rule: Rule | None = None
    extractor: LineExtractor | None = None
    literals: Literals | None = field(default=None, compare=False)
    search: Callable[[str], object] | None = field(default=None, compare=False)

    def matches(self, line: str) -> bool:
        # a pattern Python cannot compile counts as matched: its handler or rule checks the line again
        return self.search is None or self.search(line) is not None


def _pattern(source: str, rule: Rule | None = None, extractor: LineExtractor | None = None) -> _Pattern:
    return _Pattern(prefilter_form(source), rule, extractor, required_literals(source), _python_search(source))


class TextScanner:
    """Scans text logs with the rules and the line extractors of every source module."""

    def __init__(self, rules: list[Rule], extractors: list[LineExtractor]):
        patterns: list[_Pattern] = [_pattern(e.trigger, extractor=e) for e in extractors]
        for rule in rules:
            patterns.extend(_pattern(c.regex, rule=rule) for c in rule.match)
        self.patterns = patterns
        self.rules = rules
        self.searches = literal_searches([p.literals for p in patterns if p.literals is not None])
        unfiltered = [f"(?:{p.rust})" for p in patterns if p.literals is None]
        if unfiltered:
            self.searches.append("(?m)" + "|".join(unfiltered))
        # literal -> indexes of the patterns that need it; patterns without literals are tried on every candidate
        self._plain: dict[str, list[int]] = {}
        self._folded: dict[str, list[int]] = {}
        for i, p in enumerate(patterns):
            for s in p.literals.strings if p.literals else ():
                (self._folded if p.literals.icase else self._plain).setdefault(s, []).append(i)
        self._plain_list = list(self._plain)
        self._always = [i for i, p in enumerate(patterns) if p.literals is None]
        self._python_lookup_max = LITERAL_TESTS_IN_PYTHON_MAX // max(1, len(self._plain_list))

    def scan(self, path: Path, rel: str, sink: Sink, *, read_ahead: bool = False) -> tuple[int, list[str]]:
        """Read one text file into the sink; returns its line count and any warnings.

        `read_ahead` reads the next batch in a helper thread while this one is scanned: worth it for a
        file too large for the thread pool to balance against the others.
        """
        fctx = _with_year(file_context(rel), path)
        warnings: list[str] = []
        lines = 0
        hits = 0
        try:
            with open_binary(path) as stream:
                batches = iter_line_batches(stream)
                for batch in prefetched(batches) if read_ahead else batches:
                    lines = batch.first_line + len(batch.lines) - 1
                    if hits < MAX_HITS_PER_FILE:
                        hits += self._scan_batch(batch, rel, fctx, sink)
                        if hits >= MAX_HITS_PER_FILE:
                            warnings.append(
                                f"{rel}: over {MAX_HITS_PER_FILE} matching lines; the rest were counted, not read"
                            )
        except ReadLimitExceeded as exc:
            warnings.append(f"{rel}: decompressed size limit reached ({exc}); the rest was not read")
        except (OSError, EOFError, ValueError) as exc:
            warnings.append(f"{rel}: read stopped at line {lines}: {type(exc).__name__}: {exc}")
        return lines, warnings

    def hits(self, batch: LineBatch) -> Iterator[tuple[int, str, list[_Pattern]]]:
        """(index into batch.lines, text, matching patterns) of each owned line that some pattern matches."""
        lines = batch.lines
        if batch.own_start or batch.own_end != lines.len():
            lines = lines.slice(batch.own_start, batch.own_end - batch.own_start)
        if lines.len() == 0:
            return
        rows = np.flatnonzero(self._candidates(lines))
        if len(rows) == 0:
            return
        found: list[list[str]] | list[None] = [None] * len(rows)
        if len(rows) > self._python_lookup_max and self._plain_list:
            found = lines.gather(rows).str.extract_many(self._plain_list, overlapping=True).to_list()
        for pos, present in zip((rows + batch.own_start).tolist(), found, strict=True):
            text = batch.text(pos)
            patterns = self.patterns_matching(text, present)
            if patterns:
                yield pos, text, patterns

    def _candidates(self, lines: pl.Series) -> np.ndarray:
        """A mask of the lines that may match some pattern: the literal searches, in Rust."""
        if not self.searches:
            return np.zeros(lines.len(), dtype=bool)
        if len(self.searches) == 1:
            return lines.str.contains(self.searches[0]).to_numpy()
        found = pl.DataFrame({"line": lines}).select(
            pl.any_horizontal([pl.col("line").str.contains(s) for s in self.searches])
        )
        return found.to_series().to_numpy()

    def patterns_matching(self, line: str, present: list[str] | None = None) -> list[_Pattern]:
        """The patterns that match one line, in registration order (extractors before rules).

        `present`: the plain literals the line holds, when already found in Rust.
        """
        tried = set(self._always)
        if present is None:
            present = [s for s in self._plain_list if s in line]
        for s in present:
            tried.update(self._plain[s])
        if self._folded:
            lowered = line.lower()
            for s, indexes in self._folded.items():
                if s in lowered:
                    tried.update(indexes)
        return [self.patterns[i] for i in sorted(tried) if self.patterns[i].matches(line)]

    def _scan_batch(self, batch: LineBatch, rel: str, fctx: FileContext, sink: Sink) -> int:
        found = 0
        earlier = _EarlierTimestamps(batch, fctx)
        for pos, text, patterns in self.hits(batch):
            found += 1
            hit = Hit(rel, batch.line_number(pos), text, attribute(text, fctx), batch, pos, fctx)
            self._handle(hit, patterns, sink, earlier)
        return found

    def _handle(self, hit: Hit, patterns: list[_Pattern], sink: Sink, earlier: _EarlierTimestamps) -> None:
        rec = LineRecord(hit)
        seen_rules: set[str] = set()
        for pattern in patterns:
            if pattern.extractor is not None:
                pattern.extractor.handle(rec, sink)
            elif pattern.rule is not None and pattern.rule.id not in seen_rules:
                seen_rules.add(pattern.rule.id)
                self._apply_rule(pattern.rule, rec)
        if hit.ctx.ts is not None:
            earlier.seen(hit.index, hit.ctx.ts)
        elif rec.rules or rec.level in ("error", "critical"):
            # a traceback line has no time; the logging line printed just before it has one
            hit.ctx.ts = earlier.before(hit.index)
            rec.ts_inferred = hit.ctx.ts is not None
        if rec.rules or (rec.kind and rec.notable):
            sink.record(rec)

    @staticmethod
    def _apply_rule(rule: Rule, rec: LineRecord) -> None:
        body = rec.hit.ctx.body
        clause = rule.matches(body) or rule.matches(rec.hit.text)
        if clause is None:
            return
        if clause.followed_by:
            follow = clause.compiled_followed_by
            ahead = rec.hit.following(clause.window)
            if follow is None or not any(follow.search(line) for line in ahead):
                return
        rec.rules.append(rule.id)
        window = [body, *rec.hit.following(rule.extract_window)] if rule.extract_window else [body]
        for key, value in rule.extract_fields(window).items():
            rec.fields.setdefault(key, value)


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


def _with_year(fctx: FileContext, path: Path) -> FileContext:
    """Month-day timestamps (c10, vLLM) get the year the file was last written."""
    try:
        year = datetime.fromtimestamp(os.stat(path).st_mtime, tz=timezone.utc).year
    except OSError:
        year = None
    return FileContext(fctx.rank, fctx.pid, fctx.host, fctx.role, year)
