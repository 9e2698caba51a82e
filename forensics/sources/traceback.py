"""Python exceptions, including Ray's `RayTaskError(Cause)` wrapping.

Each exception line becomes an event with its class, message and the frame it was raised in; for
`ray.exceptions.RayTaskError(OutOfMemoryError)` the wrapped class is kept as `cause`, so the
diagnosis can look through the wrapper to the innermost error.
"""

from __future__ import annotations

import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "python"
# Python prints the exception line at the start of a line; loggers may put a `... file.py:N] ` header first.
# Exception names in the middle of other text (C++ component logs quoting an `RpcError:`) are not exceptions.
EXCEPTION_LINE = re.compile(
    r"^\s*(?:`?\s*|\S[^\]]*\]\s+)(?P<cls>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception)|KeyboardInterrupt|SystemExit))"
    r"(?:\((?P<cause>[\w.]+)\))?(?::\s?(?P<msg>.*)|\s*$)"
)
FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
TRIGGER = (
    r"(?:^|[\s:\]|])(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception)|KeyboardInterrupt|SystemExit)"
    r"(?:\([\w.]+\))?(?::|\s*$)"
)


def _last_frame(lines: list[str]) -> dict[str, str] | None:
    for text in reversed(lines):
        m = FRAME_LINE.search(text)
        if m:
            return {"file": m["file"], "line": m["line"], "func": m["func"]}
    return None


def _handle_exception(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = EXCEPTION_LINE.search(body)
    if not m:
        return
    cls = m["cls"]
    if cls.endswith("Warning"):
        return
    rec.kind = "exception"
    rec.source = SOURCE
    rec.level = rec.level or "error"
    rec.fields["exception"] = cls.rsplit(".", 1)[-1]
    rec.fields["exception_module"] = cls.rpartition(".")[0]
    if m["cause"]:
        rec.fields["cause"] = m["cause"].rsplit(".", 1)[-1]
    if m["msg"]:
        rec.fields["exception_message"] = m["msg"][:500]
    frame = _last_frame(rec.hit.preceding(12))
    if frame:
        rec.fields["raised_at"] = frame


EXTRACTORS = [LineExtractor("exception", SOURCE, TRIGGER, _handle_exception, folds="")]  # raised_at: the first's
