"""Evidence as an issue tracker groups it: one entry per distinct message, wherever and however often it was printed.

The same OOM line printed by torchrun's stderr file and by the driver's tee, or one watchdog message from 63
ranks, is one entry with its count, ranks, files and first and last time seen (Sentry's issue page). Each entry
carries the lines around its first occurrence, read back from the run (see `source_lines`), the traceback
frames above it with the raise site marked, and commands that open the line in a terminal pager or editor.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.fingerprint import normalise, run_hosts
from forensics.line_prefixes import RAY_PREFIX, TORCHRUN_PREFIX
from forensics.model import FAR_FUTURE, Analysis, Finding, iso
from forensics.report import source_lines
from forensics.report.labels import ranks_phrase

MAX_ENTRIES = 40
MAX_OCCURRENCES_PER_RULE = 5000  # lines of one rule grouped into messages; a flood beyond is counted, not read
MAX_LOCATIONS = 6  # file:line places listed per file of an entry
MAX_FILES_LISTED = 8  # files listed per entry; a message printed by every rank's log names the rest by count
MAX_FINDINGS_LISTED = 6  # findings linked per entry (one per rank: a watchdog message can belong to hundreds)
LINES_BEFORE, LINES_AFTER = 4, 3  # shown around the line
TRACEBACK_LOOKBACK = 60  # lines read above an exception to find its frames
FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
TRACEBACK_START = re.compile(r"^\s*Traceback \(most recent call last\):")
_CARET_LINE = re.compile(r"^\s*[\^~\s]+$")
_ANCHOR_UNSAFE = re.compile(r"[^a-z0-9-]+")
NOT_LINE_KINDS = {"flight_recorder", "nsys_sqlite", "kineto_trace", "skipped"}  # no lines to show around


@dataclass
class _Occurrence:
    file: str
    line: int
    text: str
    rank: int | None
    ts: datetime | None
    order: tuple[int, int]
    repeats: int = 1  # lines this one stands for: the scanner counts repeats of a line into its first event
    last_ts: datetime | None = None  # the time of the last of them


@dataclass
class _Group:
    signature: str
    occurrences: list[_Occurrence] = field(default_factory=list)
    places: set[tuple[str, int]] = field(default_factory=set)
    findings: list[int] = field(default_factory=list)  # indexes into the analysis' findings
    uncounted: int = 0  # lines of a flood past MAX_OCCURRENCES_PER_RULE


def finding_anchors(findings: list[Finding]) -> list[str]:
    """A stable anchor per finding, `finding-<rule>-rank-<n>` (or `-run`), unique on the page."""
    seen: dict[str, int] = {}
    anchors = []
    for f in findings:
        base = _ANCHOR_UNSAFE.sub(
            "-", f"finding-{f.rule}-" + (f"rank-{f.rank}" if f.rank is not None else "run").lower()
        )
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.append(base if n == 0 else f"{base}-{n + 1}")
    return anchors


def _rule_rows(events: pl.DataFrame, rule: str) -> tuple[dict[int | None, list[dict[str, Any]]], int]:
    """The event rows a rule matched (capped), by rank, and how many there were in all."""
    tagged = events.filter(pl.col("fields").str.contains(f'"{rule}"', literal=True))
    by_rank: dict[int | None, list[dict[str, Any]]] = {}
    total = 0
    for row in tagged.iter_rows(named=True):
        try:
            fields = json.loads(row["fields"] or "{}")
        except ValueError:
            continue
        if rule in (fields.get("rules") or []):
            row["repeats"] = fields.get("repeats")
            total += 1
            if total <= MAX_OCCURRENCES_PER_RULE:
                by_rank.setdefault(row["rank"], []).append(row)
    return by_rank, total


def _occurrences(
    f: Finding, by_rank: dict[int | None, list[dict[str, Any]]], file_order: dict[str, int]
) -> list[_Occurrence]:
    """The lines behind one finding: the rule's event rows on its rank and those of no rank (or all, when the
    finding has none), then any evidence line not among them (detector findings cite lines no rule tagged)."""
    rows = [r for rank in ([f.rank, None] if f.rank is not None else list(by_rank)) for r in by_rank.get(rank, [])]
    out = [
        _Occurrence(
            r["file"],
            r["line"],
            r["message"] or "",
            r["rank"],
            r["ts"],
            (file_order.get(r["file"], 0), r["line"]),
            *_repeated(r.get("repeats")),
        )
        for r in rows
    ]
    seen = {(o.file, o.line) for o in out}
    for e in f.evidence:
        if (e.file, e.line) not in seen:
            out.append(_Occurrence(e.file, e.line, e.text, f.rank, f.ts, (file_order.get(e.file, 0), e.line)))
    return out


def _repeated(repeats: dict[str, Any] | None) -> tuple[int, datetime | None]:
    """How many lines an event stands for, and the time of its last one (see `Sink.repeat`)."""
    if not repeats:
        return 1, None
    last = repeats.get("last_ts")
    return int(repeats.get("count") or 1), datetime.fromisoformat(last) if last else None


_HOST_TOKEN = re.compile(r"(?<![\w.-])[\w-][\w.-]*")  # where a host name may start, to the end of its word
_HOST_NAME = re.compile(r"[\w-][\w.-]*")


class _Signatures:
    """Normalised messages, each text worked out once; host names replaced where a word of the line is one.

    A host is replaced where nothing of [\\w.-] is before it and nothing of [\\w-] after it (a domain may
    follow): the whole word, or the longest part of it before a dot, is looked up in a set, not searched
    for one host at a time (a run of a thousand nodes names a thousand hosts).
    """

    def __init__(self, hosts: list[str]):
        self._hosts = {h for h in hosts if h and len(h) > 1 and _HOST_NAME.fullmatch(h)}
        others = sorted({h for h in hosts if h and len(h) > 1} - self._hosts, key=len, reverse=True)
        self._others = (
            re.compile("(?<![\\w.-])(?:" + "|".join(map(re.escape, others)) + ")(?![\\w-])") if others else None
        )
        self._seen: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        if text not in self._seen:
            plain = _HOST_TOKEN.sub(self._host_word, text) if self._hosts else text
            plain = self._others.sub("<host>", plain) if self._others else plain
            self._seen[text] = normalise(plain) or text
        return self._seen[text]

    def _host_word(self, m: re.Match[str]) -> str:
        word = m[0]
        end = len(word)
        while end > 0:
            if word[:end] in self._hosts:
                return "<host>" + word[end:]
            end = word.rfind(".", 0, end)
        return word


def _groups(a: Analysis, order: list[int]) -> list[_Group]:
    """Every finding's lines, grouped by their normalised text across findings, files and ranks."""
    signature = _Signatures(run_hosts(a))
    file_order = {fr.path: i for i, fr in enumerate(a.files)}
    by_rule: dict[str, tuple[dict[int | None, list[dict[str, Any]]], int]] = {}
    groups: dict[str, _Group] = {}
    for index in order:
        f = a.findings[index]
        if f.rule not in by_rule:
            by_rule[f.rule] = _rule_rows(a.events, f.rule)
        by_rank, total = by_rule[f.rule]
        for occ in _occurrences(f, by_rank, file_order):
            group = groups.setdefault(signature(occ.text), _Group(signature(occ.text)))
            if (occ.file, occ.line) not in group.places:
                group.places.add((occ.file, occ.line))
                group.occurrences.append(occ)
            if index not in group.findings:
                group.findings.append(index)
        if total > MAX_OCCURRENCES_PER_RULE and f.evidence:
            first = signature(f.evidence[0].text)
            if first in groups:
                groups[first].uncounted = max(groups[first].uncounted, total - MAX_OCCURRENCES_PER_RULE)
    return list(groups.values())


def _first(group: _Group) -> _Occurrence:
    return min(group.occurrences, key=lambda o: (o.ts or FAR_FUTURE, o.order))


def _locations(group: _Group) -> list[tuple[str, list[int]]]:
    files: dict[str, list[int]] = {}
    for o in sorted(group.occurrences, key=lambda o: o.order):
        files.setdefault(o.file, []).append(o.line)
    return list(files.items())


def _origin(text: str) -> str:
    """Who printed a line (a torchrun `[default1]:` or Ray `(Actor pid=…)` prefix); empty when nobody says."""
    for prefix in (TORCHRUN_PREFIX, RAY_PREFIX):
        m = prefix.match(text)
        if m:
            return m.group(0)
    return ""


def traceback_frames(lines: dict[int, str], hit: int) -> list[dict[str, Any]]:
    """The frames of the traceback that ends at line `hit`, innermost last and marked as the raise site.

    Only lines printed by the same process as the exception line are read (interleaved rank output is skipped).
    """
    origin = _origin(lines.get(hit, ""))
    own = [
        (n, lines[n][len(origin) :])
        for n in range(hit - 1, hit - TRACEBACK_LOOKBACK - 1, -1)
        if n in lines and lines[n].startswith(origin) and (origin or not _origin(lines[n]))
    ]
    block: list[tuple[int, str]] = []
    for n, text in own:  # upwards from the exception line
        if TRACEBACK_START.match(text):
            break
        if not text.strip():
            break
        if FRAME_LINE.match(text) or text.startswith((" ", "\t")) or _CARET_LINE.match(text):
            block.append((n, text))
            continue
        break
    block.reverse()
    frames: list[dict[str, Any]] = []
    for n, text in block:
        m = FRAME_LINE.match(text)
        if m:
            frame = {"file": m["file"], "line": int(m["line"]), "func": m["func"], "code": "", "log_line": n}
            frames.append(frame | {"raise_site": False})
        elif frames and not frames[-1]["code"] and not _CARET_LINE.match(text):
            frames[-1]["code"] = text.strip()
    if frames:
        frames[-1]["raise_site"] = True
    return frames


def commands(path: str, line: int) -> list[dict[str, str]]:
    """Shell commands that open a file at a line: a pager, a log navigator and an editor."""
    quoted = shlex.quote(path)
    return [
        {"tool": "less", "text": f"less +{line} {quoted}"},
        {"tool": "lnav", "text": f"lnav -c ':goto {line}' {quoted}"},
        {"tool": "vim", "text": f"vim +{line} {quoted}"},
    ]


def _shown_path(roots: list[Path], rel: str) -> str:
    """The path to type in a shell: the run folder as given, joined with the file's path in the run."""
    if len(roots) == 1:
        root = roots[0]
        return str(root if not root.is_dir() else root / rel)
    for root in roots:
        if rel.startswith(f"{root.name}/"):
            return str(root / rel[len(root.name) + 1 :])
        if root.name == rel:
            return str(root)
    return rel


def _place(rel: str, lines: list[int], roots: list[Path], kinds: dict[str, str]) -> dict[str, Any]:
    """Where a message was printed in one file: its first lines, each with a command that opens it there."""
    path = shlex.quote(_shown_path(roots, rel))
    readable = kinds.get(rel) not in NOT_LINE_KINDS
    shown = [{"line": n, "command": f"less +{n} {path}" if readable else ""} for n in lines[:MAX_LOCATIONS]]
    return {"file": rel, "lines": shown, "more": max(0, len(lines) - MAX_LOCATIONS)}


def _finding_name(f: Finding) -> str:
    return f.title + (f" (rank {f.rank})" if f.rank is not None else "")


def _context(window: source_lines.Window | None, hit: int) -> list[dict[str, Any]]:
    if window is None:
        return []
    return [
        {"line": n, "text": window.lines[n], "hit": n == hit}
        for n in range(hit - LINES_BEFORE, hit + LINES_AFTER + 1)
        if n in window.lines
    ]


def _ordered_findings(a: Analysis) -> list[int]:
    """Indexes of findings, root cause first, then its symptoms' findings, then the rest in time order."""
    root = a.verdict.root_cause
    first = [i for i, f in enumerate(a.findings) if f is root]
    symptom_classes = {s.cls for s in a.verdict.symptoms}
    second = [i for i, f in enumerate(a.findings) if f is not root and f.cls in symptom_classes]
    rest = [i for i in range(len(a.findings)) if i not in first and i not in second]
    return first + second + rest


@dataclass
class EvidenceView:
    entries: list[dict[str, Any]]
    hidden: int  # distinct messages left out
    anchor_of: dict[str, str]  # `file:line` of every grouped line -> its entry's anchor


def evidence_entries(a: Analysis) -> EvidenceView:
    """Entries for the report, the root cause's first."""
    if not a.findings:
        return EvidenceView([], 0, {})
    order = _ordered_findings(a)
    rank_of = {index: position for position, index in enumerate(order)}
    groups = sorted(_groups(a, order), key=lambda g: (min(rank_of[i] for i in g.findings), _first(g).ts or FAR_FUTURE))
    shown, hidden = groups[:MAX_ENTRIES], max(0, len(groups) - MAX_ENTRIES)
    kinds = {fr.path: fr.kind for fr in a.files}
    wanted: dict[str, set[int]] = {}
    for g in shown:
        o = _first(g)
        if kinds.get(o.file) in NOT_LINE_KINDS:
            continue
        wanted.setdefault(o.file, set()).update(range(max(1, o.line - TRACEBACK_LOOKBACK), o.line + LINES_AFTER + 1))
    windows = source_lines.read_windows(a.run_path, wanted)
    roots = source_lines.run_roots(a.run_path)
    anchors = finding_anchors(a.findings)
    entries = [_entry(a, g, n, windows, roots, anchors, kinds) for n, g in enumerate(shown, start=1)]
    anchor_of: dict[str, str] = {}
    for entry, g in zip(entries, shown, strict=True):
        for place in sorted(g.places):
            anchor_of.setdefault(f"{place[0]}:{place[1]}", entry["anchor"])
    return EvidenceView(entries, hidden, anchor_of)


def _entry(
    a: Analysis,
    g: _Group,
    n: int,
    windows: dict[str, source_lines.Window],
    roots: list[Path],
    anchors: list[str],
    kinds: dict[str, str],
) -> dict[str, Any]:
    o = _first(g)
    window = windows.get(o.file)
    stamped = [t for x in g.occurrences for t in (x.ts, x.last_ts) if t is not None]
    frames = traceback_frames(window.lines, o.line) if window else []
    path = _shown_path(roots, o.file)
    return {
        "anchor": f"evidence-{n}",
        "text": o.text,
        "signature": g.signature,
        "count": sum(x.repeats for x in g.occurrences) + g.uncounted,
        "ranks": sorted({x.rank for x in g.occurrences if x.rank is not None}),
        "ranks_text": ranks_phrase(x.rank for x in g.occurrences),
        "files": [_place(f, lines, roots, kinds) for f, lines in _locations(g)[:MAX_FILES_LISTED]],
        "more_files": max(0, len(_locations(g)) - MAX_FILES_LISTED),
        "first_seen": iso(min(stamped)) if stamped else None,
        "last_seen": iso(max(stamped)) if stamped else None,
        "file": o.file,
        "line": o.line,
        "path": path,
        "commands": commands(path, o.line) if kinds.get(o.file) not in NOT_LINE_KINDS else [],
        "context": _context(window, o.line),
        "context_note": window.note if window else "",
        "frames": frames,
        "findings": [
            {"anchor": anchors[i], "title": _finding_name(a.findings[i]), "rule": a.findings[i].rule}
            for i in g.findings[:MAX_FINDINGS_LISTED]
        ],
        "more_findings": max(0, len(g.findings) - MAX_FINDINGS_LISTED),
        "root": a.verdict.root_cause is not None and any(a.findings[i] is a.verdict.root_cause for i in g.findings),
    }
