"""Python exceptions as printed: the exception line and the frames of the traceback above it.

Shared by the traceback reader (sources/traceback.py), which turns each exception line of a log into an event,
and by the catalogue, whose exception families are tested on example tracebacks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from forensics.line_prefixes import ANSI_ESC, ANSI_ESCLESS, ANY_PREFIX

# Python prints the exception line at the start of a line; loggers may put a `... file.py:N] ` header first.
# Exception names in the middle of other text (C++ component logs quoting an `RpcError:`) are not exceptions, nor
# is a bare `Error:` (every kind of tool prints that); a bare `Exception: ...` is Python's `raise Exception(...)`.
# pytest's short summary puts the test first: `FAILED tests/test_x.py::test_y - AssertionError: ...`.
# IPython (notebooks) prints the class alone in the traceback's head line: `OutOfMemoryError    Traceback (...)`.
EXCEPTION_LINE = re.compile(
    r"^\s*(?:`?\s*|\S[^\]]*\]\s+|(?:FAILED|ERROR) \S+ - )(?P<cls>(?:[A-Za-z_]\w*\.)*"
    r"(?:_?[A-Z]\w*Error|(?:_?[A-Z]\w*)?Exception|KeyboardInterrupt|SystemExit))"
    r"(?:\((?P<cause>[\w.]+)\))?(?::\s?(?P<msg>.*)|\s*$|\s{2,}Traceback \(most recent call last\))"
)
FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\)|^\s*During handling of|^\s*The above exception")
# Ray's report of a failed attempt that it retries: "Task f failed. There are 2 retries remaining, so the task
# will be retried. Error: User exception:", then the `ray::f()` line and the attempt's traceback.
RETRY_REPORT = re.compile(r"\bthe task will be retried\b")
RAY_TASK_LINE = re.compile(r"^\s*(?:\x1b\[[\d;]*m)?ray::[\w.]+\(")
_DIGIT_RUNS = re.compile(r"(\d+)")
CUT_NAME = re.compile(r"^\s*[A-Za-z_][\w.]*$")  # an exception line cut inside the class name
MAX_FRAMES = 40
_IN_PRINTOUT = re.compile(r"Traceback \(most recent call last\)|During handling of|The above exception|ray::|\^+\s*$")
# What marks a raw line (prefixes and all) as part of a traceback's printout or of Ray's report of a retried
# attempt, wherever it stands in the line; and the prefixes before a line's text (see may_be_printout).
_PRINTOUT_TEXT = re.compile(
    r'File "[^"]+", line \d+, in |Traceback \(most recent call last\)|During handling of|The above exception'
    r"|ray::[\w.]+\(|\bthe task will be retried\b"
)
_PREFIX_RUN = re.compile(rf"(?:{ANSI_ESC}|{ANSI_ESCLESS}|{ANY_PREFIX})*")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def to_json(self) -> dict[str, str | int]:
        return {"file": self.file, "line": self.line, "func": self.func}


@dataclass(frozen=True)
class RaisedException:
    """One exception line: its class (without module), module, wrapped cause, message and raising frames."""

    cls: str
    module: str = ""
    cause: str = ""  # the X of a wrapper's `RayTaskError(X)`
    message: str = ""
    frames: tuple[Frame, ...] = field(default=())  # outermost first, as printed
    cause_module: str = ""  # a wrapper's: the module and message of the X line its printout ends with, if seen
    cause_message: str = ""

    @property
    def innermost(self) -> str:
        """The class that says what failed: the wrapped cause of a wrapper, else the class itself."""
        return self.cause or self.cls

    @property
    def innermost_module(self) -> str:
        """The module of the innermost exception; "" for a wrapper whose cause's own line was not seen (the
        wrapper's module, `ray.exceptions`, says nothing about what it wraps)."""
        return self.cause_module if self.cause else self.module

    @property
    def innermost_message(self) -> str:
        return self.cause_message if self.cause else self.message


def parse_exception_line(body: str) -> RaisedException | None:
    """The exception a line states, or None (warnings are not exceptions)."""
    m = EXCEPTION_LINE.search(body)
    if not m or m["cls"].endswith("Warning"):
        return None
    return RaisedException(
        cls=m["cls"].rsplit(".", 1)[-1],
        module=m["cls"].rpartition(".")[0],
        cause=(m["cause"] or "").rsplit(".", 1)[-1],
        message=(m["msg"] or "").strip(),
    )


def wrapped_exception(
    cause: str, lines_after: list[str], strip: Callable[[str], str] = str.rstrip
) -> RaisedException | None:
    """The line of the `cause` exception that a wrapper's printout (the lines after `RayTaskError(cause)`) ends
    with: Ray prints the remote traceback below the wrapper, down to the task's own exception line. The printout
    is frames, code and caret lines, chained exceptions and nested task headers; any other line ends it.
    `strip` removes a line's prefixes (Ray, torchrun, ...) and keeps the indentation after them."""
    for text in lines_after:
        body = strip(text)
        raised = parse_exception_line(body)
        if raised is not None:
            if raised.cls == cause and not raised.cause:
                return raised
        elif body and not body[0].isspace() and not _IN_PRINTOUT.match(body):
            return None
    return None


def frames_above(lines: list[str]) -> tuple[Frame, ...]:
    """The frames of the traceback that ends just below `lines` (the lines above an exception line, nearest last),
    up to its `Traceback (most recent call last):` head or an earlier exception of a chain."""
    found: list[Frame] = []
    for text in reversed(lines):
        m = FRAME_LINE.search(text)
        if m:
            found.append(Frame(m["file"], int(m["line"]), m["func"]))
            if len(found) >= MAX_FRAMES:
                break
        elif TRACEBACK_HEAD.search(text) or parse_exception_line(text) is not None:
            break
    return tuple(reversed(found))


def may_be_printout(line: str) -> bool:
    """Whether a raw line may belong to a traceback's printout or to Ray's report of a retried attempt: a frame, a
    Traceback head or chain line, a `ray::` task line, the report, or a line whose text after its prefixes is blank
    or indented (code, carets). An exception line right below any other line reads nothing of what is above it
    that its repeats would not: `reported_as_retried` stops at that line, and `frames_above` finds no frame in it
    (it may look further up past ordinary lines; a repeat counted into the first one's event has its frames).
    """
    if not line.strip() or line[:1].isspace() or _PRINTOUT_TEXT.search(line):
        return True
    rest = line[_PREFIX_RUN.match(line).end() :]  # type: ignore[union-attr]
    return not rest.strip() or rest[:1].isspace()


def _unchanged(text: str) -> str:
    return text


def reported_as_retried(lines: list[str], strip: Callable[[str], str] = _unchanged) -> bool:
    """Whether the traceback that ends just below `lines` (nearest last) is one Ray reports as a failed attempt
    it retries: not a failure of the run unless the retries run out (then the caller gets the error itself).

    `strip` removes a line's prefixes; the report's lines are read back from the exception to their header.
    """
    for text in reversed(lines):
        body = strip(text)
        if RETRY_REPORT.search(body):
            return True
        if FRAME_LINE.search(body) or RAY_TASK_LINE.match(body) or not body.strip() or body[:1].isspace():
            continue
        return False
    return False


def cut_traceback(lines: list[str], strip: Callable[[str], str] = _unchanged) -> tuple[int, RaisedException] | None:
    """The traceback `lines` end in when they stop before its exception line (a paste cut short, a process killed
    while printing): the index of its last frame line and an exception of unknown class raised from its frames.

    The lines after the last frame may only be its source and caret lines, blank lines, and a last line cut
    mid-way (an exception name without its message); a complete traceback ends in its exception line instead.
    """
    bodies = _without_logger_header([strip(text) for text in lines])
    end = len(bodies)
    while end and not bodies[end - 1].strip():
        end -= 1
    if end >= 2 and _cut_inside_prefix(lines[end - 1], lines[end - 2]):
        end -= 1  # `(Trainer pid`: the last line stops inside the prefix the line above it starts with
    if end and parse_exception_line(bodies[end - 1]) is not None:
        return None
    if end and CUT_NAME.match(bodies[end - 1]):
        end -= 1  # `vllm.v1.engine.exceptions.Engin`: the exception line, cut inside its name
    last_frame = None
    for i in range(end - 1, -1, -1):
        body = bodies[i]
        if FRAME_LINE.search(body):
            last_frame = i
            break
        if body.strip() and not body[:1].isspace():
            return None
    if last_frame is None:
        return None
    return last_frame, RaisedException("", frames=frames_above(bodies[: last_frame + 1]))


def _cut_inside_prefix(line: str, above: str) -> bool:
    """Whether `line` is only the start of the line above it (a paste cut inside a Ray or torchrun prefix)."""
    line = line.rstrip()
    return bool(line) and len(line) < len(above) and above.startswith(line) and 'File "' not in line


def _logger_header(bodies: list[str]) -> re.Pattern[str] | None:
    """The header a logger puts before each line of a traceback it prints (vLLM's `ERROR 02-25 11:11:34
    engine.py:139] `, `2024-01-22 14:32:27 | ERROR | stderr | `), read off the last frame line, as a pattern in
    which runs of digits (times, pids) may differ from line to line; None when frames start their lines."""
    for body in reversed(bodies):
        at = body.find('File "')
        if at >= 0:
            head = body[:at].rstrip()
            if not head:
                return None
            return re.compile(
                "".join(r"\d+" if part.isdigit() else re.escape(part) for part in _DIGIT_RUNS.split(head))
            )
    return None


def _without_logger_header(bodies: list[str]) -> list[str]:
    """The lines with the logger header of their traceback peeled (the indentation after it kept); a last line cut
    inside the header is left blank."""
    header = _logger_header(bodies)
    if header is None:
        return bodies
    matches = [header.match(body) for body in bodies]
    peeled = [body[m.end() :] if m else body for body, m in zip(bodies, matches, strict=True)]
    last = max((i for i, body in enumerate(bodies) if body.strip()), default=-1)
    if last >= 0 and matches[last] is None and _cut_inside_header(bodies[last], matches):
        peeled[last] = ""
    return peeled


def _cut_inside_header(line: str, matches: list[re.Match[str] | None]) -> bool:
    """Whether `line` is the start of a header line cut short (`ERROR 03-31 11:1`)."""
    shape = _DIGIT_RUNS.sub("0", line.strip())
    return any(_DIGIT_RUNS.sub("0", m.group()).startswith(shape) for m in matches if m is not None)


def last_exception(text: str, strip: Callable[[str], str] = str.strip) -> RaisedException | None:
    """The last exception a multi-line text states, with its frames (for testing exception families on examples).

    `strip` removes a line's prefixes (Ray, torchrun, ...) before the exception line is read.
    """
    lines = text.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        raised = parse_exception_line(strip(lines[i]))
        if raised is not None:
            return RaisedException(
                raised.cls, raised.module, raised.cause, raised.message, frames_above(lines[max(0, i - 200) : i])
            )
    return None
