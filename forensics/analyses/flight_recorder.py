"""Cross-rank reading of flight-recorder dumps: who never joined, and who called something else.

Collectives are matched by process group and collective sequence number, as PyTorch's own
`fr_trace` does. Two findings come out: a rank that stopped issuing collectives the others entered
(class `hang`, usually a consequence of that rank's own crash), and ranks that issued different
operations or sizes at the same sequence number (class `collective_mismatch`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from forensics.catalogue import Detection
from forensics.model import Evidence


def _ts(ns: Any) -> datetime | None:
    if not isinstance(ns, int) or ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def _by_seq(dumps: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    table: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for dump in dumps:
        for entry in dump["entries"]:
            if entry.get("is_p2p") or entry.get("seq") is None:
                continue
            table[(entry["pg"], int(entry["seq"]))][dump["rank"]] = entry
    return table


def _missing_ranks(dumps: list[dict[str, Any]]) -> Detection | None:
    """The first collective that some ranks entered and others never issued."""
    ranks = {d["rank"] for d in dumps}
    if len(ranks) < 2:
        return None
    files = {d["rank"]: d["file"] for d in dumps}
    newest = {
        d["rank"]: max((int(e["seq"]) for e in d["entries"] if e.get("seq") is not None), default=-1) for d in dumps
    }
    for (pg, seq), present in sorted(_by_seq(dumps).items(), key=lambda kv: kv[0][1]):
        missing = sorted(r for r in ranks - set(present) if newest[r] < seq)
        if not missing:
            continue
        entry = next(iter(present.values()))
        op = entry.get("op")
        evidence = [
            Evidence(files[r], 1, f"rank {r}: newest collective {newest[r]}; never issued #{seq} ({op})")
            for r in missing
        ]
        evidence += [
            Evidence(files[r], 1, f"rank {r}: #{seq} {present[r].get('op')} {present[r].get('state')}")
            for r in sorted(present)
        ]
        who = ", ".join(map(str, missing))
        return Detection(
            id="fr-rank-never-joined",
            rank=missing[0],
            ts=_ts(entry.get("time_created_ns")),
            order=(0, 0, 0),
            evidence=evidence,
            fields={
                "pg": pg,
                "seq": seq,
                "op": op,
                "missing_ranks": missing,
                "present_ranks": sorted(present),
                "who": who,
            },
            explanation=(
                f"flight recorder: rank(s) {who} never issued collective #{seq} ({op}) on process group {pg}, "
                f"which rank(s) {', '.join(map(str, sorted(present)))} entered and waited in."
            ),
        )
    return None


def _mismatches(dumps: list[dict[str, Any]]) -> Detection | None:
    files = {d["rank"]: d["file"] for d in dumps}
    for (pg, seq), present in sorted(_by_seq(dumps).items(), key=lambda kv: kv[0][1]):
        if len(present) < 2:
            continue
        ops = {r: e.get("op") for r, e in present.items()}
        sizes = {r: e.get("input_sizes") for r, e in present.items()}
        kind = (
            "operation" if len(set(ops.values())) > 1 else "size" if len({str(s) for s in sizes.values()}) > 1 else ""
        )
        if not kind:
            continue
        evidence = [Evidence(files[r], 1, f"rank {r}: #{seq} {ops[r]} input sizes {sizes[r]}") for r in sorted(present)]
        return Detection(
            id="fr-collective-mismatch",
            ts=_ts(next(iter(present.values())).get("time_created_ns")),
            order=(0, 0, 0),
            evidence=evidence,
            fields={"pg": pg, "seq": seq, "ops": {str(r): o for r, o in ops.items()}, "kind": kind},
            explanation=(
                f"flight recorder: at collective #{seq} of process group {pg} the ranks disagree on the {kind}: "
                + "; ".join(f"rank {r} {ops[r]} {sizes[r]}" for r in sorted(present))
            ),
        )
    return None


def flight_recorder_detections(dumps: list[dict[str, Any]]) -> list[Detection]:
    """What every rank's dump of one run shows, for the catalogue's `fr-*` entries."""
    found = [_mismatches(dumps), _missing_ranks(dumps)]
    return [f for f in found if f is not None]
