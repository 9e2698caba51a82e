"""Cross-rank reading of PyTorch's NCCL watchdog lines: who waited, since when, in which collective.

- "ran for N ms": the wait began N ms before the line, so the stall start is known even when every rank's
  watchdog fired at the same moment.
- "last enqueued / last completed NCCL work" per rank: a rank whose enqueued sequence lags never reached
  the collective that the others wait in.
- One SeqNum with different OpTypes on ranks of one process group, or one OpType with different input sizes
  where every rank must give the same: the ranks called different collectives.
- Ranks of the group that logged but never timed out while the others did are the candidates for the rank
  that hung or died; when nothing tells them apart, the explanation says so and lists them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl

from forensics.model import Evidence

PG_TAG = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)")
# each rank gives these the same number of input elements (all_to_all, send/recv and the list forms of
# all_gather may take uneven ones)
SAME_INPUT_OPS = frozenset({"ALLREDUCE", "BROADCAST", "REDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"})


@dataclass
class RankWait:
    """What one rank's watchdog lines say about the collective it waited in."""

    rank: int
    host: str | None = None
    seqs: dict[int, str] = field(default_factory=dict)  # SeqNum -> the timed-out work (`collective_called`)
    pgs: dict[int, str] = field(default_factory=dict)  # SeqNum -> process group id, where a line shows it
    last_enqueued: int | None = None
    last_completed: int | None = None
    stall_start: datetime | None = None
    first_timeout: datetime | None = None  # when its watchdog first fired
    first_seq: int | None = None  # and in which collective
    timeout_ms: int | None = None
    evidence: list[Evidence] = field(default_factory=list)


@dataclass
class RankVerdict:
    suspect: int | None
    host: str | None
    explanation: str
    candidates: list[int] = field(default_factory=list)
    first_collective_never_completed: bool = False


def collective_called(fields: dict) -> str:
    """What a timed-out work says its rank called: the OpType, and for a collective whose input every rank must
    give the same number of elements (SAME_INPUT_OPS), that number too; two ranks of one group that differ in it
    at one SeqNum called different collectives even under the same name."""
    op = str(fields.get("op"))
    numel = fields.get("numel_in")
    return f"{op} of {numel} elements" if op in SAME_INPUT_OPS and numel is not None else op


def rank_waits(events: pl.DataFrame) -> dict[int, RankWait]:
    """Per rank: the timed-out collectives, the enqueued/completed numbers and the earliest stall start."""
    rows = events.filter(
        pl.col("kind").is_in(["watchdog_timeout", "watchdog_work_state", "fr_rank_state"])
        & pl.col("rank").is_not_null()
    ).sort(["file", "line"])
    waits: dict[int, RankWait] = {}
    for row in rows.iter_rows(named=True):
        fields = json.loads(row["fields"] or "{}")
        w = waits.setdefault(row["rank"], RankWait(row["rank"]))
        w.host = w.host or row["host"]
        pg = PG_TAG.search(row["message"] or "")
        if pg and fields.get("seq") is not None:
            w.pgs.setdefault(int(fields["seq"]), pg["pg"])
        if row["kind"] == "watchdog_timeout":
            if fields.get("seq") is not None:  # Gloo's timeouts name no collective
                w.seqs.setdefault(int(fields["seq"]), collective_called(fields))
            w.evidence.append(Evidence(row["file"], row["line"], row["message"]))
            if row["ts"] is not None and fields.get("ran_ms") is not None:
                start = row["ts"] - timedelta(milliseconds=int(fields["ran_ms"]))
                w.stall_start = min(w.stall_start or start, start)
            if row["ts"] is not None and (w.first_timeout is None or row["ts"] < w.first_timeout):
                w.first_timeout, w.first_seq = row["ts"], fields.get("seq")
                w.timeout_ms = fields.get("timeout_ms")
        if fields.get("last_enqueued") is not None:  # a rule's field is text, a reader's a number
            w.last_enqueued = max(-1 if w.last_enqueued is None else w.last_enqueued, int(fields["last_enqueued"]))
            w.last_completed = max(
                -1 if w.last_completed is None else w.last_completed, int(fields.get("last_completed", -1))
            )
    return waits


def op_mismatches(waits: dict[int, RankWait]) -> list[tuple[int, dict[str, list[int]]]]:
    """(SeqNum, {collective: ranks}) where ranks of one process group wait in different collectives.

    A rank whose process group is not shown is compared with every group (old logs print no PG).
    """
    found: list[tuple[int, dict[str, list[int]]]] = []
    for seq in sorted({s for w in waits.values() for s in w.seqs}):
        holders = [(w.pgs.get(seq), w.rank, w.seqs[seq]) for w in waits.values() if seq in w.seqs]
        for pg in {p for p, _, _ in holders if p is not None} or {None}:
            ops: dict[str, list[int]] = defaultdict(list)
            for holder_pg, rank, op in holders:
                if holder_pg in (None, pg) or pg is None:
                    ops[op].append(rank)
            if len(ops) > 1:
                found.append((seq, {op: sorted(ranks) for op, ranks in sorted(ops.items())}))
    return found


def world_size(events: pl.DataFrame) -> int | None:
    """The largest communicator size NCCL reported, when NCCL init lines are in the logs."""
    init = events.filter(pl.col("kind") == "nccl_init")
    if init.is_empty():
        return None
    sizes = init.select(pl.col("fields").str.json_path_match("$.nranks").cast(pl.Int64, strict=False)).to_series()
    return int(sizes.max()) if sizes.max() is not None else None


def _host_of(events: pl.DataFrame, rank: int) -> str | None:
    hosts = events.filter((pl.col("rank") == rank) & pl.col("host").is_not_null())["host"]
    return hosts[0] if len(hosts) else None


def late_joiners(waits: dict[int, RankWait]) -> tuple[list[int], str]:
    """Ranks whose watchdog fired well after the first one, in a later collective: they joined the first
    rank's collective late (stuck elsewhere), and timed out only once the first rank had given up."""
    timed = sorted((w.first_timeout, r) for r, w in waits.items() if w.first_timeout and w.first_seq is not None)
    if len(timed) < 2:
        return [], ""
    t0, r0 = timed[0]
    first = waits[r0]
    window = timedelta(milliseconds=max(10_000, 0.25 * (first.timeout_ms or 0)))
    early = [r for t, r in timed if t - t0 <= window]
    late = [r for t, r in timed if t - t0 > window and waits[r].first_seq > (first.first_seq or 0)]
    if not late:
        return [], ""
    gap = (waits[late[0]].first_timeout - t0).total_seconds()
    seqs = sorted({waits[r].first_seq for r in late})
    why = (
        f"rank(s) {early} timed out first ({t0:%H:%M:%S}) waiting in collective {first.first_seq}; rank(s) {late} "
        f"timed out only {gap:.0f} s later, in collective(s) {seqs} beyond it: they reached collective "
        f"{first.first_seq} late (stuck elsewhere - data loading, a long CPU step, a slow GPU) and then waited for "
        f"rank(s) {early}, which had already given up"
    )
    return late, why


def judge_ranks(events: pl.DataFrame, waits: dict[int, RankWait]) -> RankVerdict:
    """Which rank the others waited for, or why the logs cannot tell."""
    if not waits:
        return RankVerdict(None, None, "")
    notes: list[str] = []
    late, why = late_joiners(waits)
    if late:
        suspect = late[0] if len(late) == 1 else None
        host = _host_of(events, suspect) if suspect is not None else None
        return RankVerdict(suspect, host, why + ".", late)
    starts = sorted((w.stall_start, r) for r, w in waits.items() if w.stall_start is not None)
    if starts:
        first, rank = starts[0]
        notes.append(
            f"rank {rank} has waited since {first:%Y-%m-%d %H:%M:%S} (the watchdog's 'ran for' before it fired)"
        )
    never = [r for r, w in waits.items() if w.last_completed == -1 and w.last_enqueued is not None]
    enqueued = {r: w.last_enqueued for r, w in waits.items() if w.last_enqueued is not None}
    if len(set(enqueued.values())) > 1:
        laggard = min(enqueued, key=lambda r: (enqueued[r], r))
        why = (
            f"rank {laggard} enqueued only up to collective {enqueued[laggard]} while others reached "
            f"{max(enqueued.values())}: it never joined the collective the others waited in"
        )
        return RankVerdict(laggard, _host_of(events, laggard), "; ".join([why, *notes]) + ".", [laggard])
    size = world_size(events)
    logged = set(events.filter(pl.col("rank").is_not_null())["rank"].unique().to_list())
    waiting = set(waits)
    silent = sorted(r for r in logged - waiting if size is None or r < size)
    unseen = sorted(set(range(size)) - logged) if size else []
    if bool(never) and all(min(w.seqs, default=0) <= 1 for w in waits.values()):
        notes.insert(
            0,
            "no collective ever completed on this process group (last completed -1): the ranks never connected "
            "(network interface, firewall, or a rank that did not start)",
        )
        first_never = True
    else:
        first_never = False
    if len(silent) == 1 and not unseen:
        suspect = silent[0]
        why = (
            f"rank {suspect} logged but never timed out while ranks {sorted(waiting)} waited: "
            "it is the one they waited for"
        )
        return RankVerdict(suspect, _host_of(events, suspect), "; ".join([why, *notes]) + ".", [suspect], first_never)
    candidates = silent + unseen
    who = (
        f"only rank {min(waiting)}'s timeout is in these logs"
        if len(waiting) == 1
        else f"ranks {sorted(waiting)} all timed out"
    )
    if len(waiting) > 1 and enqueued:
        who += " with the same enqueued/completed numbers"
    why = f"the logs cannot tell which rank is at fault: {who}"
    if candidates:
        why += f"; candidates are the ranks that did not time out: {candidates}"
        if unseen:
            why += f" (no lines at all from {unseen})"
    else:
        why += "; the rank the others waited for is not in these logs"
    return RankVerdict(None, None, "; ".join([*notes, why]) + ".", candidates, first_never)
