"""The text-log scanner: one vectorised pass per batch, Python only for the lines that matched.

Every rule regex and every extractor trigger is joined into one alternation that polars evaluates
in Rust over a whole batch of lines. Only the matching lines are then told apart, again in Rust
(one `contains` per pattern over the few hits), before Python reads their values.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from forensics.attribution import FileContext, attribute, file_context
from forensics.rules.model import Rule
from forensics.sources.base import Hit, LineExtractor, LineRecord, Sink
from forensics.textio import LineBatch, ReadLimitExceeded, iter_line_batches, open_binary

_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")
MAX_HITS_PER_FILE = 200_000  # a flood of matches stops being read, with a warning


def prefilter_form(pattern: str) -> str:
    """The pattern without group names, so that many patterns can share one alternation."""
    return _NAMED_GROUP.sub("(?:", pattern)


@dataclass(frozen=True)
class _Pattern:
    rust: str
    rule: Rule | None = None
    extractor: LineExtractor | None = None


class TextScanner:
    """Scans text logs with the rules and the line extractors of every source module."""

    def __init__(self, rules: list[Rule], extractors: list[LineExtractor]):
        patterns: list[_Pattern] = [_Pattern(prefilter_form(e.trigger), extractor=e) for e in extractors]
        for rule in rules:
            patterns.extend(_Pattern(prefilter_form(c.regex), rule=rule) for c in rule.match)
        self.patterns = patterns
        self.rules = rules
        self.combined = "(?m)" + "|".join(f"(?:{p.rust})" for p in patterns)
        self._each = [f"(?m){p.rust}" for p in patterns]

    def scan(self, path: Path, rel: str, sink: Sink) -> tuple[int, list[str]]:
        """Read one text file into the sink; returns its line count and any warnings."""
        fctx = _with_year(file_context(rel), path)
        warnings: list[str] = []
        lines = 0
        hits = 0
        try:
            with open_binary(path) as stream:
                for batch in iter_line_batches(stream):
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

    def _scan_batch(self, batch: LineBatch, rel: str, fctx: FileContext, sink: Sink) -> int:
        own = batch.lines.slice(batch.own_start, batch.own_end - batch.own_start)
        if own.len() == 0:
            return 0
        index = own.str.contains(self.combined).arg_true()
        if index.len() == 0:
            return 0
        hit_lines = own.gather(index)
        positions = (index + batch.own_start).to_list()
        matched: dict[int, list[_Pattern]] = {}
        frame = pl.DataFrame({"l": hit_lines})
        masks = frame.select([pl.col("l").str.contains(p).alias(str(i)) for i, p in enumerate(self._each)])
        for i, pattern in enumerate(self.patterns):
            for row in masks.get_column(str(i)).arg_true().to_list():
                matched.setdefault(row, []).append(pattern)
        for row, patterns in sorted(matched.items()):
            pos = positions[row]
            text = batch.text(pos)
            hit = Hit(rel, batch.line_number(pos), text, attribute(text, fctx), batch, pos, fctx)
            self._handle(hit, patterns, sink)
        return len(matched)

    def _handle(self, hit: Hit, patterns: list[_Pattern], sink: Sink) -> None:
        rec = LineRecord(hit)
        seen_rules: set[str] = set()
        for pattern in patterns:
            if pattern.extractor is not None:
                pattern.extractor.handle(rec, sink)
            elif pattern.rule is not None and pattern.rule.id not in seen_rules:
                seen_rules.add(pattern.rule.id)
                self._apply_rule(pattern.rule, rec)
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


def _with_year(fctx: FileContext, path: Path) -> FileContext:
    """Month-day timestamps (c10, vLLM) get the year the file was last written."""
    try:
        year = datetime.fromtimestamp(os.stat(path).st_mtime, tz=timezone.utc).year
    except OSError:
        year = None
    return FileContext(fctx.rank, fctx.pid, fctx.host, fctx.role, year)
