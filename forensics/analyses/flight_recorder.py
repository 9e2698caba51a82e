"""Cross-rank reading of flight-recorder dumps: who left no dump, who never joined, who called something else.

Collectives are matched by process group and collective sequence number, as PyTorch's own `fr_trace`
(`torchfrtrace`) does, and compared with its rules (torch/distributed/flight_recorder/components/types.py,
`Op.match`): the same operation; the same input and output sizes, except all-to-all (legal with uneven
splits: only the element totals over ranks must agree) and the scatter/gather sides that differ by design;
the same dtypes. Entries sharing a sequence number (a coalesced group) are compared one by one.

Findings: a rank of a process group with no dump at all (`fr_trace` refuses to run: "missing dump files");
the first collective that some ranks entered and others never issued (`hang`, usually the consequence of
that rank's own crash); ranks that issued different collectives at one sequence number. The recorder is a
ring buffer that keeps the newest entries: when a rank stopped long before the others, their buffers no
longer hold the collective it missed first, and the finding says so instead of naming a later one.
"""

from __future__ import annotations

import ast
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from forensics.catalogue import Detection
from forensics.model import Evidence

ALL_TO_ALL = ("all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base")
INPUTS_MAY_DIFFER = (*ALL_TO_ALL, "scatter")  # fr_trace: Op.match
OUTPUTS_MAY_DIFFER = (*ALL_TO_ALL, "gather")
NO_INPUT_DTYPE_CHECK = ("scatter", "broadcast")
NO_OUTPUT_DTYPE_CHECK = ("gather",)
COALESCED = "coalesced"


def _ts(ns: Any) -> datetime | None:
    if not isinstance(ns, int) or ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def op_type(entry: dict[str, Any]) -> str:
    """`nccl:all_reduce` -> `all_reduce`; `nccl:send 0->1` -> `send`."""
    name = str(entry.get("op") or "")
    return name.split(":", 1)[-1].split(" ", 1)[0]


def _ranks(value: Any) -> list[int]:
    """pg_config's `ranks`: a list, or its text (`'[0, 1]'`)."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
    return [int(r) for r in value] if isinstance(value, (list, tuple, set)) else []


@dataclass
class _Groups:
    """Process groups, their member ranks (from every dump's pg_config) and which ranks left a dump."""

    members: dict[str, set[int]] = field(default_factory=dict)
    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, dumps: list[dict[str, Any]]) -> _Groups:
        g = cls(dumps={d["rank"]: d for d in dumps})
        for d in dumps:
            for pg, ranks in (d.get("groups") or {}).items():
                if ranks:
                    g.members.setdefault(str(pg), set()).update(ranks)
        return g

    def expected(self, pg: str) -> set[int]:
        return self.members.get(pg) or set(self.dumps)


def _by_seq(dumps: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, list[dict[str, Any]]]]:
    """(pg, collective seq) -> rank -> its entries with that number, in record order (several: coalesced)."""
    table: dict[tuple[str, int], dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for dump in dumps:
        for entry in dump["entries"]:
            if entry.get("is_p2p") or entry.get("seq") is None:
                continue
            table[(entry["pg"], int(entry["seq"]))][dump["rank"]].append(entry)
    return table


def _buffer_span(dumps: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[int, int]]:
    """(rank, pg) -> (oldest, newest) collective sequence number its dump holds."""
    span: dict[tuple[int, str], tuple[int, int]] = {}
    for d in dumps:
        for e in d["entries"]:
            if e.get("is_p2p") or e.get("seq") is None:
                continue
            key, seq = (d["rank"], e["pg"]), int(e["seq"])
            lo, hi = span.get(key, (seq, seq))
            span[key] = (min(lo, seq), max(hi, seq))
    return span


# --- who left no dump ------------------------------------------------------------------------------


def missing_dumps(dumps: list[dict[str, Any]]) -> tuple[list[Detection], list[str]]:
    """Ranks of a process group that left no dump: a finding about each such rank, and a warning."""
    groups = _Groups.of(dumps)
    missing: dict[int, list[str]] = defaultdict(list)
    for pg, members in groups.members.items():
        for r in sorted(members - set(groups.dumps)):
            missing[r].append(pg)
    if not missing or not dumps:
        return [], []
    who = ", ".join(map(str, sorted(missing)))
    warning = (
        f"flight recorder: no dump from rank(s) {who} of {len(set(groups.dumps) | set(missing))} ranks; "
        f"the cross-rank comparison covers only ranks {sorted(groups.dumps)} (torchfrtrace refuses to run without them)"
    )
    detections = []
    for rank, pgs in sorted(missing.items()):
        stuck = _stuck_at(groups, pgs[0])
        where = f"; the others' oldest unfinished collective on process group {pgs[0]} is #{stuck}" if stuck else ""
        evidence = [
            Evidence(d["file"], 1, f"rank {r}: dump present, process group(s) {sorted(d.get('groups') or {})}")
            for r, d in sorted(groups.dumps.items())
        ]
        detections.append(
            Detection(
                id="fr-missing-dump",
                rank=rank,
                order=(0, 0, 0),
                evidence=evidence,
                fields={"rank": rank, "pgs": pgs, "present_ranks": sorted(groups.dumps), "stuck_at": stuck},
                explanation=(
                    f"flight recorder: rank {rank} is a member of process group(s) {', '.join(pgs)} but left no dump, "
                    f"while rank(s) {', '.join(map(str, sorted(groups.dumps)))} did: it died before the dump (killed, "
                    f"crashed) or never reached it{where}."
                ),
            )
        )
    return detections, [warning]


def _stuck_at(groups: _Groups, pg: str) -> int | None:
    """The first collective of the group that some rank with a dump has not completed (pg_status)."""
    firsts = []
    for d in groups.dumps.values():
        status = (d.get("status") or {}).get(pg) or {}
        done, issued = status.get("last_completed"), status.get("last_enqueued")
        if isinstance(done, int) and isinstance(issued, int) and issued > done:
            firsts.append(done + 1)
    return min(firsts) if firsts else None


# --- who never joined ------------------------------------------------------------------------------


def _never_joined(dumps: list[dict[str, Any]]) -> Detection | None:
    """The first collective that some ranks entered and others never issued (with a dump to tell)."""
    ranks = {d["rank"] for d in dumps}
    if len(ranks) < 2:
        return None
    groups = _Groups.of(dumps)
    files = {d["rank"]: d["file"] for d in dumps}
    span = _buffer_span(dumps)
    table = _by_seq(dumps)
    found: list[tuple[int, str, list[int]]] = []
    for pg in sorted({pg for pg, _ in table}):
        members = groups.expected(pg) & ranks
        newest = {r: span.get((r, pg), (0, -1))[1] for r in members}
        top = max(newest.values(), default=-1)
        behind = sorted(r for r in members if newest[r] < top)
        if behind:
            first = min(newest[r] for r in behind) + 1
            found.append((first, pg, [r for r in behind if newest[r] + 1 == first]))
    if not found:
        return None
    first, pg, missing = min(found)
    present = sorted(r for r in groups.expected(pg) & ranks if span.get((r, pg), (0, -1))[1] >= first)
    entries = table.get((pg, first), {})
    op = next((es[0].get("op") for es in entries.values() if es), None)
    oldest = {r: span[(r, pg)][0] for r in present if (r, pg) in span}
    shown = op is not None
    what = f"#{first} ({op})" if shown else f"#{first}"
    evidence = [
        Evidence(files[r], 1, f"rank {r}: newest collective #{span.get((r, pg), (0, -1))[1]}; never issued {what}")
        for r in missing
    ]
    for r in present:
        if entries.get(r):
            e = entries[r][0]
            evidence.append(Evidence(files[r], 1, f"rank {r}: #{first} {e.get('op')} {e.get('state')}"))
        else:
            evidence.append(Evidence(files[r], 1, f"rank {r}: its buffer holds #{oldest.get(r)} onward (ring buffer)"))
    who = ", ".join(map(str, missing))
    if shown:
        told = f"never issued collective #{first} ({op}) on process group {pg}, which rank(s) "
        told += f"{', '.join(map(str, present))} entered and waited in."
    else:
        lo = min(oldest.values(), default=first)
        told = (
            f"never issued collective #{first} on process group {pg} (its newest is #{first - 1}); rank(s) "
            f"{', '.join(map(str, present))} went on to #{max(span[(r, pg)][1] for r in present)}, but their ring "
            f"buffers keep only the newest entries (from #{lo}), so what #{first} was is not in the dumps."
        )
    ts_entry = next((es[0] for es in entries.values() if es), {})
    return Detection(
        id="fr-rank-never-joined",
        rank=missing[0],
        ts=_ts(ts_entry.get("time_created_ns")),
        order=(0, 0, 0),
        evidence=evidence,
        fields={
            "pg": pg,
            "seq": first,
            "op": op,
            "missing_ranks": missing,
            "present_ranks": present,
            "who": who,
            "in_buffers": shown,
        },
        explanation=f"flight recorder: rank(s) {who} {told}",
    )


# --- who called something else ---------------------------------------------------------------------


def _numel(sizes: Any) -> int:
    if not isinstance(sizes, list):
        return 0
    return sum(math.prod(s) for s in sizes if isinstance(s, list))


def entry_mismatch(a: dict[str, Any], b: dict[str, Any], group_size: int) -> str | None:
    """What differs between two ranks' entries of one collective, by fr_trace's rules; None when they match."""
    kind = op_type(a)
    if kind != op_type(b):
        return "operation"
    if kind == COALESCED:
        return None
    if kind not in INPUTS_MAY_DIFFER and a.get("input_sizes") != b.get("input_sizes"):
        return "size"
    if kind not in OUTPUTS_MAY_DIFFER and a.get("output_sizes") != b.get("output_sizes"):
        return "size"
    if kind in ("all_reduce", "allreduce_coalesced") and a.get("input_sizes") != b.get("output_sizes"):
        return "size"
    gathered = kind in ("all_gather", "_all_gather_base", "all_gather_base", "all_gather_into_tensor_coalesced")
    if gathered and b.get("output_sizes") and a.get("input_sizes") and _gathered_numel_differs(a, b, group_size):
        return "size"
    return "dtype" if _dtype_mismatch(kind, a, b) else None


def _gathered_numel_differs(a: dict[str, Any], b: dict[str, Any], group_size: int) -> bool:
    return _numel(b["output_sizes"][:1]) != _numel(a["input_sizes"][:1]) * group_size


def _dtype_mismatch(kind: str, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """fr_trace's Op.dtype_mismatch: inputs vs outputs on one rank, and each against the other rank's."""
    a_in, a_out = set(a.get("dtypes") or []), set(a.get("output_dtypes") or [])
    b_in, b_out = set(b.get("dtypes") or []), set(b.get("output_dtypes") or [])
    has = lambda sizes: bool(sizes) and bool(sizes[0])  # noqa: E731 - fr_trace tests sizes[0]
    if kind not in ("scatter", "gather", "broadcast") and a_in != a_out and has(a.get("input_sizes")):
        return has(a.get("output_sizes"))
    if kind not in NO_INPUT_DTYPE_CHECK and a_in != b_in and has(a.get("input_sizes")) and has(b.get("input_sizes")):
        return True
    return (
        kind not in NO_OUTPUT_DTYPE_CHECK
        and a_out != b_out
        and has(a.get("output_sizes"))
        and has(b.get("output_sizes"))
    )


def _collective_mismatch(present: dict[int, list[dict[str, Any]]], group_size: int) -> tuple[str, int, int] | None:
    """(kind, the differing rank, index in a coalesced group) for one sequence number, against the lowest rank."""
    ranks = sorted(present)
    base = present[ranks[0]]
    for r in ranks[1:]:
        other = present[r]
        if len(other) != len(base):
            return "operation", r, min(len(base), len(other))
        for i, (a, b) in enumerate(zip(base, other, strict=True)):
            kind = entry_mismatch(a, b, group_size)
            if kind:
                return kind, r, i
    if all(op_type(es[0]) in ALL_TO_ALL for es in present.values() if es) and len(ranks) == group_size:
        inputs = sum(_numel(es[0].get("input_sizes")) for es in present.values())
        outputs = sum(_numel(es[0].get("output_sizes")) for es in present.values())
        if inputs != outputs:
            return "size", ranks[0], 0
    return None


def _describe(entry: dict[str, Any]) -> str:
    return f"{entry.get('op')} input sizes {entry.get('input_sizes')} dtypes {entry.get('dtypes')}"


def _mismatches(dumps: list[dict[str, Any]]) -> Detection | None:
    files = {d["rank"]: d["file"] for d in dumps}
    groups = _Groups.of(dumps)
    for (pg, seq), present in sorted(_by_seq(dumps).items(), key=lambda kv: kv[0][1]):
        if len(present) < 2:
            continue
        found = _collective_mismatch(present, len(groups.expected(pg)))
        if not found:
            continue
        kind, culprit, index = found
        where = f" (entry {index + 1} of its coalesced group)" if max(len(es) for es in present.values()) > 1 else ""
        lines = {r: es[min(index, len(es) - 1)] if es else {} for r, es in present.items()}
        evidence = [Evidence(files[r], 1, f"rank {r}: #{seq}{where} {_describe(lines[r])}") for r in sorted(present)]
        return Detection(
            id="fr-collective-mismatch",
            ts=_ts(next(iter(lines.values())).get("time_created_ns")),
            order=(0, 0, 0),
            evidence=evidence,
            fields={
                "pg": pg,
                "seq": seq,
                "ops": {str(r): e.get("op") for r, e in lines.items()},
                "kind": kind,
                "rank": culprit,
                "coalesced_index": index if where else None,
            },
            explanation=(
                f"flight recorder: at collective #{seq}{where} of process group {pg} the ranks disagree on the "
                f"{kind}: " + "; ".join(f"rank {r} {_describe(lines[r])}" for r in sorted(present))
            ),
        )
    return None


def flight_recorder_detections(dumps: list[dict[str, Any]]) -> list[Detection]:
    """What every rank's dump of one run shows, for the catalogue's `fr-*` entries."""
    found = [_mismatches(dumps), _never_joined(dumps)]
    return [f for f in found if f is not None]


def review_flight_recorder(dumps: list[dict[str, Any]]) -> tuple[list[Detection], list[str]]:
    """Every `fr-*` detection and the warnings (missing dumps) of a run's flight-recorder dumps."""
    if not dumps:
        return [], []
    missing, warnings = missing_dumps(dumps)
    return [*flight_recorder_detections(dumps), *missing], warnings
