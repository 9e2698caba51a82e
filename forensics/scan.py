"""The text-log scanner: one vectorised pass per batch, Python only for the lines that may match.

Per batch of lines, in native code (Hyperscan, or polars' Rust regex): one search for the literals that
every rule regex and extractor trigger needs (see prefilter.py; a pattern without such literals is searched
in full, in polars). The few candidate lines then go to Python, where the literals each one holds pick the
patterns worth trying on it. The alternation of all the patterns is never run: past a few dozen patterns its
automaton stops fitting the regex engine's cache and it slows down a thousandfold, while a literal search
stays flat.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import regex

from forensics.line_prefixes import FileContext, attribute, file_context
from forensics.prefilter import Literals, literal_finder, owned_lines, required_literals, text_column
from forensics.rules.model import USER_REGEX_TIMEOUT_S, Rule
from forensics.sources.base import Hit, LineExtractor, LineRecord, Sink
from forensics.textio import LineBatch, iter_line_batches, open_binary, prefetched, read_problem
from forensics.tracebacks import cut_traceback

_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")
MAX_HITS_PER_FILE = 200_000  # a flood of matches stops being read, with a warning
LOOKBACK_LINES = 64  # how far above an undated error its time is looked for (a long traceback fits)
CUT_TRACEBACK_LINES = 200  # the last lines of a file read for a traceback cut before its exception line
CUT_TAIL_BYTES = 4096  # the end of a small file searched for a frame before it is skipped as matching nothing
FRAME_TEXT = '", line '  # in every traceback frame: `File "x.py", line 12, in f`
FRAME_MARK = FRAME_TEXT.encode()
CUT_LAST_FRAME_LINES = 8  # how close to the end of a file the last frame of a cut traceback is
RULE_TIME_BUDGET_S = 10.0  # Python time one rule may spend on its candidate lines before it is switched off


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


def _rule_search(pattern: str) -> Callable[[str], object] | None:
    """A rule's search in Python, with the time limit: rules may come from users (`--patterns`), and a
    backtracking regex like `(a|aa)+$` takes forever on one long line. Raises TimeoutError."""
    try:
        compiled = regex.compile(pattern)
    except (regex.error, ValueError, OverflowError):
        return None
    return lambda line: compiled.search(line, timeout=USER_REGEX_TIMEOUT_S)


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
    search = _rule_search(source) if rule is not None else _python_search(source)
    return _Pattern(prefilter_form(source), rule, extractor, required_literals(source), search)


class TextScanner:
    """Scans text logs with the rules and the line extractors of every source module."""

    def __init__(self, rules: list[Rule], extractors: list[LineExtractor]):
        patterns: list[_Pattern] = [_pattern(e.trigger, extractor=e) for e in extractors]
        for rule in rules:
            patterns.extend(_pattern(c.regex, rule=rule) for c in rule.match)
        self.patterns = patterns
        self.rules = rules
        self.families = [r for r in rules if r.is_family]
        self._class_of = {r.id: r.cls for r in rules}
        keys = {(s, p.literals.icase) for p in patterns if p.literals is not None for s in p.literals.strings}
        self.finder = literal_finder(keys)
        # literal -> indexes of the patterns that need it; patterns without literals are tried on every line
        # their alternation matches, and on every candidate
        needed_by: dict[tuple[str, bool], list[int]] = {}
        for i, p in enumerate(patterns):
            for s in p.literals.strings if p.literals else ():
                needed_by.setdefault((s, p.literals.icase), []).append(i)
        self._patterns_of = [needed_by[key] for key in self.finder.literals]
        self._always = [i for i, p in enumerate(patterns) if p.literals is None]
        self.unfiltered = "(?m)" + "|".join(f"(?:{patterns[i].rust})" for i in self._always) if self._always else None
        self._rule_seconds: dict[str, float] = {}
        self.disabled: dict[str, tuple[str, str]] = {}  # rule id -> (file that tripped it, warning)

    def scan(self, path: Path, rel: str, sink: Sink, *, read_ahead: bool = False) -> tuple[int, list[str]]:
        """Read one text file into the sink; returns its line count and any warnings.

        `read_ahead` reads the next batch in a helper thread while this one is scanned: worth it for a
        file too large for the thread pool to balance against the others.
        """
        fctx = _with_year(file_context(rel), path)
        warnings: list[str] = []
        lines = 0
        hits = 0
        last: LineBatch | None = None
        try:
            with open_binary(path) as stream:
                batches = iter_line_batches(stream)
                for batch in prefetched(batches) if read_ahead else batches:
                    lines = batch.first_line + len(batch.lines) - 1
                    last = batch
                    if hits < MAX_HITS_PER_FILE:
                        hits += self._scan_batch(batch, rel, fctx, sink)
                        if hits >= MAX_HITS_PER_FILE:
                            warnings.append(
                                f"{rel}: over {MAX_HITS_PER_FILE} matching lines; the rest were counted, not read"
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

    def hits(self, batch: LineBatch, rel: str = "") -> Iterator[tuple[int, str, list[_Pattern]]]:
        """(index into batch.lines, text, matching patterns) of each owned line that some pattern matches."""
        if batch.own_end <= batch.own_start:
            return
        held = self.finder.lines_holding(batch)
        if self.unfiltered is not None:
            rows = owned_lines(batch).str.contains(self.unfiltered).arg_true() + batch.own_start
            for row in rows.to_list():
                held.setdefault(row, [])
        for pos in sorted(held):
            text = batch.text(pos)
            tried = set(self._always).union(*(self._patterns_of[literal] for literal in held[pos]))
            patterns = self._matching(text, tried, (rel, batch.line_number(pos)))
            if patterns:
                yield pos, text, patterns

    def may_match(self, texts: list[bytes]) -> list[bool]:
        """For each whole text, whether any pattern may match a line of it (False: none can).

        A search can only match more of a whole text than of its lines one by one, so none is missed.
        """
        found = [hit or _may_end_in_traceback(text) for hit, text in zip(self.finder.any_in(texts), texts, strict=True)]
        if self.unfiltered is None or not texts:
            return found
        unfiltered = text_column(texts).str.contains(self.unfiltered).to_list()
        return [a or b for a, b in zip(found, unfiltered, strict=True)]

    def _matching(self, line: str, tried: set[int], where: tuple[str, int]) -> list[_Pattern]:
        """The patterns among `tried` that match the line; `where` (file, line) names the line in the
        warning when a rule's regex times out on it and is switched off."""
        return [self.patterns[i] for i in sorted(tried) if self._try(self.patterns[i], line, where)]

    def _try(self, pattern: _Pattern, line: str, where: tuple[str, int]) -> bool:
        if pattern.rule is None:
            return pattern.matches(line)
        if pattern.rule.id in self.disabled:
            return False
        try:
            return self._within_budget(pattern.rule, where, lambda: pattern.matches(line))
        except TimeoutError:
            self._disable(pattern.rule, where, f"its regex timed out (over {USER_REGEX_TIMEOUT_S:g} s) on")
            return False

    def _scan_batch(self, batch: LineBatch, rel: str, fctx: FileContext, sink: Sink) -> int:
        found = 0
        earlier = _EarlierTimestamps(batch, fctx)
        for pos, text, patterns in self.hits(batch, rel):
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
            sink.record(rec)

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
