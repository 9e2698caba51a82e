"""PyTorch ProcessGroupNCCL: watchdog timeouts, "last enqueued/completed" numbers, heartbeat monitor; Gloo's
timeouts, which name no collective.

The numbers let the diagnosis order ranks: a watchdog that "ran for N ms" began N ms earlier, and a
rank whose last enqueued collective lags the others never reached the collective they wait in.
"""

from __future__ import annotations

import re
from datetime import timedelta

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "torch_distributed"
WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, NumelIn=(?P<nin>-?\d+), NumelOut=(?P<nout>-?\d+))?, Timeout\(ms\)=(?P<timeout>\d+)\)"
    r" ran for (?P<ran>\d+) milliseconds before timing out"
)
WORK_STATE = re.compile(
    r"(?:Exception \(either an error or timeout\)|NCCL error is|Work timeout is|Timeout at NCCL work)"
    r"(?: detected by watchdog at work)?:? (?P<seq>\d+), last enqueued NCCL work: (?P<enq>-?\d+),"
    r" last completed NCCL work: (?P<done>-?\d+)"
    r"|failure detected by watchdog at work sequence id: (?P<seq2>\d+) PG status: "
    r"last enqueued work: (?P<enq2>-?\d+), last completed work: (?P<done2>-?\d+)"
)
DUMP_SIGNAL = re.compile(
    r"Received a dump signal due to a collective timeout from\s+(?P<src>this local rank|rank \d+).*?"
    r"Last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)"
)
GLOO_TIMEOUT = re.compile(
    r"gloo/transport/\w+/\S+:\d+\] Timed out waiting (?P<timeout>\d+) ?ms for (?P<op>recv|send) operation"
)
RANK_TAG = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\]")


def _rank_from_tag(rec: LineRecord) -> None:
    m = RANK_TAG.search(rec.hit.ctx.body)
    if m:
        rec.hit.ctx.rank = int(m["rank"])


def _handle_watchdog(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = WATCHDOG.search(body)
    if m:
        rec.kind = "watchdog_timeout"
        rec.source = SOURCE
        rec.level = "error"
        ran_ms = int(m["ran"])
        rec.fields.update(
            seq=int(m["seq"]),
            op=m["op"],
            timeout_ms=int(m["timeout"]),
            ran_ms=ran_ms,
        )
        if m["nin"] is not None:
            rec.fields.update(numel_in=int(m["nin"]), numel_out=int(m["nout"]))
        if rec.hit.ctx.ts is not None:
            rec.fields["stall_start"] = (rec.hit.ctx.ts - timedelta(milliseconds=ran_ms)).isoformat()
        _rank_from_tag(rec)
        return
    m = GLOO_TIMEOUT.search(body)
    if m:  # Gloo names no collective: the wait alone, for the cross-rank reading of who never came
        rec.kind = "watchdog_timeout"
        rec.source = SOURCE
        rec.level = "error"
        rec.fields.update(op=f"gloo {m['op']}", timeout_ms=int(m["timeout"]))
        return
    m = WORK_STATE.search(body) or DUMP_SIGNAL.search(body)
    if m:
        rec.kind = "watchdog_work_state"
        rec.source = SOURCE
        rec.level = "error"
        g = m.groupdict()
        seq = g.get("seq") or g.get("seq2")  # torch >= 2.9 words it "failure detected ... sequence id"
        if seq:
            rec.fields["seq"] = int(seq)
        enq, done = g.get("enq") or g.get("enq2"), g.get("done") or g.get("done2")
        rec.fields.update(last_enqueued=int(enq), last_completed=int(done))
        _rank_from_tag(rec)


def _handle_heartbeat(rec: LineRecord, sink: Sink) -> None:
    rec.kind = "heartbeat_monitor"
    rec.source = SOURCE
    rec.level = "error"
    _rank_from_tag(rec)


EXTRACTORS = [
    LineExtractor(
        "watchdog",
        SOURCE,
        r"Watchdog caught collective operation timeout|last enqueued NCCL work: -?\d+, last completed NCCL work|"
        r"Last enqueued NCCL work: -?\d+, last completed NCCL work|failure detected by watchdog at work sequence id|"
        r"gloo/transport/\w+/\S+:\d+\] Timed out waiting",
        _handle_watchdog,
    ),
    LineExtractor(
        "heartbeat",
        SOURCE,
        r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds",
        _handle_heartbeat,
    ),
]
