"""torchrun / torchelastic: the ChildFailedError summary block and the agent's own lines.

The summary's "Root Cause (first observed failure)" is the first process to *exit*, which is often a
symptom (a rank that timed out waiting for the one that failed). It is read as evidence, never as
the verdict.
"""

from __future__ import annotations

import re

from forensics.line_prefixes import FileContext, attribute, parse_timestamp
from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "torchrun"
EXITCODE = re.compile(r"exitcode\s*:\s*(?P<code>-?\d+)(?:\s*\((?:pid:\s*(?P<pid>\d+))?\))?")
FIELD = re.compile(r"^\s*(?P<key>time|host|rank|error_file|traceback)\s*:\s*(?P<value>.*)$")
RANK_FIELD = re.compile(r"(?P<rank>\d+)(?:\s*\(local_rank:\s*(?P<local>\d+)\))?")
SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG\w+)\)")
AGENT_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\) of binary"
)
CLOSING = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG\w+)")
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


ENTRY_HEADER = re.compile(r"^\s*\[\d+\]:\s*$")


def _body(text: str) -> str:
    """A neighbouring line without the wrappers in front of it (`stderr: `, `[1,0]<stderr>:`, `> `, a Ray prefix)."""
    return attribute(text, FileContext()).body


def _block_fields(rec: LineRecord) -> dict[str, str]:
    """The key/value lines of the failure entry around an `exitcode :` line."""
    found: dict[str, str] = {}
    before = [_body(t) for t in rec.hit.preceding(8)]
    header_at = None
    for i in range(len(before) - 1, -1, -1):
        text = before[i].strip()
        if ENTRY_HEADER.match(text):
            header_at = i
            break
        m = FIELD.match(text)
        if m:
            found.setdefault(m["key"], m["value"].strip())
    for text in rec.hit.following(3):
        m = FIELD.match(_body(text).strip())
        if not m:
            break
        found.setdefault(m["key"], m["value"].strip())
    if header_at is not None:
        found["root_cause"] = str(any("Root Cause" in t for t in before[max(0, header_at - 2) : header_at]))
    return found


def _apply_block(rec: LineRecord, block: dict[str, str]) -> None:
    rank = RANK_FIELD.match(block.get("rank", ""))
    if rank:
        rec.hit.ctx.rank = int(rank["rank"])
        if rank["local"]:
            rec.fields["local_rank"] = int(rank["local"])
    if block.get("host"):
        rec.hit.ctx.host = block["host"]
        rec.fields["host"] = block["host"]
    if block.get("time"):
        rec.hit.ctx.ts = parse_timestamp(block["time"]) or rec.hit.ctx.ts


def _handle_exitcode(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = EXITCODE.search(body)
    if not m:
        sig = SIGNAL.search(body)
        if sig and FIELD.match(body.strip()):  # the `traceback : Signal 9 (SIGKILL) received by PID` line
            block = _block_fields(rec)
            _apply_block(rec, block)
            rec.kind = "torchrun_signal"
            rec.source = SOURCE
            rec.level = "error"
            rec.fields["signal"] = sig["name"]
        return
    block = _block_fields(rec)
    if "rank" not in block and "host" not in block:
        return
    code = int(m["code"])
    rec.kind = "torchrun_failure"
    rec.source = SOURCE
    rec.level = "error"
    rec.fields["exitcode"] = code
    if m["pid"]:
        rec.fields["pid"] = int(m["pid"])
        rec.hit.ctx.pid = int(m["pid"])
    _apply_block(rec, block)
    sig = SIGNAL.search(block.get("traceback", ""))
    if sig:
        rec.fields["signal"] = sig["name"]
    elif code < 0:
        rec.fields["signal"] = SIGNAL_NAMES.get(-code, f"signal {-code}")
    rec.fields["torchrun_root_cause"] = block.get("root_cause") == "True"


def _handle_agent(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = AGENT_FAILED.search(body)
    if m:
        code = int(m["code"])
        rec.kind = "torchrun_child_failed"
        rec.source = SOURCE
        rec.level = "error"
        rec.fields.update(exitcode=code, local_rank=int(m["local"]), pid=int(m["pid"]))
        rec.hit.ctx.pid = int(m["pid"])  # the agent's own pid is in the prefix; the child's rank comes from the pid map
        if code < 0:
            rec.fields["signal"] = SIGNAL_NAMES.get(-code, f"signal {-code}")
        return
    m = CLOSING.search(body)
    if m:
        rec.kind = "torchrun_closing_signal"
        rec.source = SOURCE
        rec.level = "warning"
        rec.fields.update(pid=int(m["pid"]), signal=m["sig"])


EXTRACTORS = [
    LineExtractor(
        "torchrun_failure", SOURCE, r"exitcode\s*:\s*-?\d+|traceback\s*:\s*Signal \d+ \(SIG", _handle_exitcode
    ),
    LineExtractor(
        "torchrun_agent",
        SOURCE,
        r"failed \(exitcode: -?\d+\) local_rank|Sending process \d+ closing signal",
        _handle_agent,
    ),
]
