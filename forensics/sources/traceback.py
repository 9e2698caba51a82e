"""Python exceptions, including Ray's `RayTaskError(Cause)` wrapping.

Each exception line becomes an event with its class, module, message and the frames of the traceback above it;
for `ray.exceptions.RayTaskError(OutOfMemoryError)` the wrapped class is kept as `cause`, so the diagnosis can
look through the wrapper to the innermost error, and the catalogue's exception families (`exception:` entries)
can name the class from the exception itself. An exception that Ray reports as a failed attempt it retries is
marked `retried`: it is a failure only when the retries run out, and then the caller raises it again.
"""

from __future__ import annotations

from forensics.line_prefixes import attribute
from forensics.sources.base import LineExtractor, LineRecord, Sink
from forensics.tracebacks import (
    frames_above,
    may_be_printout,
    parse_exception_line,
    reported_as_retried,
    wrapped_exception,
)

SOURCE = "python"
TRIGGER = (
    r"(?:^|[\s:\]|])(?:[A-Za-z_]\w*\.)*(?:_?[A-Z]\w*Error|(?:_?[A-Z]\w*)?Exception|KeyboardInterrupt|SystemExit)"
    r"(?:\([\w.]+\))?(?::|\s*$|\s{2,}Traceback \(most recent call last\))"
)
FRAMES_LOOKBACK = 120  # lines above an exception searched for its traceback's frames
FRAMES_KEPT = 20  # the innermost frames kept in the event
WRAPPED_LOOKAHEAD = 200  # lines below a wrapper searched for the exception line of what it wraps


def _handle_exception(rec: LineRecord, sink: Sink) -> None:
    raised = parse_exception_line(rec.hit.ctx.body)
    if raised is None:
        return
    rec.kind = "exception"
    rec.source = SOURCE
    rec.level = rec.level or "error"
    rec.fields["exception"] = raised.cls
    rec.fields["exception_module"] = raised.module
    if raised.cause:
        rec.fields["cause"] = raised.cause
        inner = wrapped_exception(
            raised.cause, rec.hit.following(WRAPPED_LOOKAHEAD), lambda text: attribute(text, rec.hit.fctx).body
        )
        if inner is not None:
            rec.fields["cause_module"] = inner.module
            rec.fields["cause_message"] = inner.message[:500]
    if raised.message:
        rec.fields["exception_message"] = raised.message[:500]
    above = rec.hit.preceding(FRAMES_LOOKBACK)
    frames = frames_above(above)
    if frames:
        rec.fields["raised_at"] = frames[-1].to_json()
        rec.fields["frames"] = [f"{f.file}:{f.func}" for f in frames[-FRAMES_KEPT:]]
    if reported_as_retried(above, lambda text: attribute(text, rec.hit.fctx).body):
        rec.fields["retried"] = True  # an attempt Ray retried: the run goes on, so it is no failure of its own


# Repeats of an exception line count into one event when nothing around them is read: not a wrapper (it reads the
# lines below, to the exception it wraps), not below a traceback or a retry report (frames, `retried`: see
# may_be_printout). A flood of one error, printed again and again, is one event; raised_at is the first's.
NOT_A_WRAPPER = r"(?!.*?(?:Error|Exception|KeyboardInterrupt|SystemExit)\([\w.]+\))"
EXTRACTORS = [
    LineExtractor(
        "exception", SOURCE, TRIGGER, _handle_exception, folds=NOT_A_WRAPPER, reads_line_above=may_be_printout
    )
]
