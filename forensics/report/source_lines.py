"""The lines around an evidence line, read back from the run's files when the report is written.

The analysis keeps one line per finding; a reader wants the few around it (the traceback above an exception,
what the process printed next). Reading is as careful as the analysis itself: only regular files inside the
run folder (no link out of it), compressed files through the same bomb-safe decompression, a byte budget per
file and per report, long lines cut, and every failure a note instead of an exception. Nothing is written.
"""

from __future__ import annotations

import lzma
import os
import stat
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from forensics.line_prefixes import ANSI
from forensics.textio import open_binary

CHUNK_BYTES = 1024 * 1024
MAX_SCAN_BYTES_PER_FILE = 256 * 1024**2  # a line further into a file than this is not looked for
MAX_SCAN_BYTES_PER_REPORT = 1024**3
MAX_FILES = 64
MAX_LINE_CHARS = 1000
MAX_CARRY_BYTES = 64 * 1024  # of one over-long line, only this much is kept while looking for its end


@dataclass
class Window:
    """Lines of one file by number (1-based), or why they could not be read."""

    lines: dict[int, str] = field(default_factory=dict)
    note: str = ""


@dataclass
class _Budget:
    left: int = MAX_SCAN_BYTES_PER_REPORT


def run_roots(run_path: str) -> list[Path]:
    """The folders and files the run was read from (the analysis joins several with ', ')."""
    if not run_path:
        return []
    whole = Path(run_path)
    if whole.exists():
        return [whole]
    return [Path(p) for p in run_path.split(", ") if p]


def locate(roots: list[Path], rel: str) -> tuple[Path | None, str]:
    """The file a report path names, checked to lie inside the run; (None, why) otherwise."""
    if roots and not any(root.exists() for root in roots):
        return None, "the run is no longer where it was analysed"
    for root in roots:
        prefix = f"{root.name}/" if len(roots) > 1 else ""
        if root.is_dir():
            if not rel.startswith(prefix):
                continue
            candidate = root / rel[len(prefix) :]
            try:
                inside = candidate.resolve(strict=True).is_relative_to(root.resolve(strict=True))
            except (OSError, RuntimeError):
                return None, "the file is no longer where the analysis read it"
            if not inside:
                return None, "the path leads out of the run folder; not read"
            return candidate, ""
        if root.name == rel:
            return root, ""
    return None, "the file is not in the run folder (an archive member, or moved since)"


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _text(raw: bytes) -> str:
    text = ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r")
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def _scan(path: Path, wanted: set[int], budget: _Budget) -> Window:
    """One pass over the file, keeping the wanted line numbers; newlines are counted a chunk at a time."""
    window = Window()
    last = max(wanted)
    line_no, carry, scanned = 1, b"", 0
    limit = min(MAX_SCAN_BYTES_PER_FILE, budget.left)
    with open_binary(path) as fh:
        while line_no <= last:
            chunk = fh.read(CHUNK_BYTES)
            if not chunk:
                if carry and line_no in wanted:
                    window.lines[line_no] = _text(carry)
                break
            scanned += len(chunk)
            data = carry + chunk
            newlines = data.count(b"\n")
            if any(line_no <= n < line_no + newlines for n in wanted):
                parts = data.split(b"\n")
                carry = parts.pop()
                for i, part in enumerate(parts):
                    if line_no + i in wanted:
                        window.lines[line_no + i] = _text(part)
            else:
                carry = data[data.rfind(b"\n") + 1 :]
            carry = carry[:MAX_CARRY_BYTES]
            line_no += newlines
            if scanned >= limit and line_no <= last:
                window.note = f"line {last:,} lies past the first {scanned // 2**20:,} MiB read for this report"
                break
    budget.left -= scanned
    return window


def read_windows(
    run_path: str, wanted: dict[str, Iterable[int]], budget_bytes: int = MAX_SCAN_BYTES_PER_REPORT
) -> dict[str, Window]:
    """For each run-relative file, the wanted lines that could be read, or a note saying why not."""
    roots = run_roots(run_path)
    budget = _Budget(budget_bytes)
    out: dict[str, Window] = {}
    for i, (rel, numbers) in enumerate(wanted.items()):
        lines = {n for n in numbers if n >= 1}
        if not lines:
            continue
        if i >= MAX_FILES or budget.left <= 0:
            out[rel] = Window(note="not read: the report's budget for reading lines back was spent")
            continue
        path, why = locate(roots, rel)
        if path is None:
            out[rel] = Window(note=why)
        elif not _regular(path):
            out[rel] = Window(note="not a regular file; not read")
        else:
            try:
                out[rel] = _scan(path, lines, budget)
            except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError, ImportError) as exc:
                out[rel] = Window(note=f"could not be read back ({type(exc).__name__})")
    return out
