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

from forensics.model import Evidence, Finding

CRASH_CLASSES = (
    "cuda_oom",
    "host_oom",
    "process_killed",
    "cuda_error",
    "gpu_hardware",
    "nccl_error",
    "config_error",
    "shape_mismatch",
    "weight_key_mismatch",
    "kv_cache_insufficient",
    "disk_or_io",
    "unknown_crash",
    "ray_node_died",
    "ray_actor_died",
    "env_version_mismatch",
    "training_instability",
    "collective_mismatch",
)


def _ts(ns: Any) -> datetime | None:
    if not isinstance(ns, int) or ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def _finding(
    rule: str,
    cls: str,
    title: str,
    severity: str,
    rank: int | None,
    ts: datetime | None,
    evidence: list[Evidence],
    fields: dict[str, Any],
    explanation: str,
    symptom_of: tuple[str, ...],
    remediation: list[str],
) -> Finding:
    return Finding(
        rule=rule,
        cls=cls,
        title=title,
        severity=severity,
        layer="infrastructure",
        rank=rank,
        host=None,
        role=None,
        ts=ts,
        ts_inferred=False,
        order=(0, 0, 0),
        count=1,
        evidence=evidence,
        fields=fields,
        remediation=remediation,
        symptom_of=symptom_of,
        explanation=explanation,
    )


def _by_seq(dumps: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    table: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for dump in dumps:
        for entry in dump["entries"]:
            if entry.get("is_p2p") or entry.get("seq") is None:
                continue
            table[(entry["pg"], int(entry["seq"]))][dump["rank"]] = entry
    return table


def _missing_ranks(dumps: list[dict[str, Any]]) -> Finding | None:
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
        return _finding(
            "fr-rank-never-joined",
            "hang",
            f"Rank {who} stopped issuing collectives",
            "error",
            missing[0],
            _ts(entry.get("time_created_ns")),
            evidence,
            {"pg": pg, "seq": seq, "op": op, "missing_ranks": missing, "present_ranks": sorted(present)},
            f"flight recorder: rank(s) {who} never issued collective #{seq} ({op}) on process group {pg}, "
            f"which rank(s) {', '.join(map(str, sorted(present)))} entered and waited in.",
            CRASH_CLASSES,
            [
                "Look at what the missing rank was doing (its own log and stack) when the others entered the "
                "collective: a crash, a hang in data loading or I/O, or a code path that skips the collective.",
                "If it was only slow (long rollout, checkpoint save), raise the process-group timeout "
                "(verl actor_rollout_ref.nccl_timeout).",
            ],
        )
    return None


def _mismatches(dumps: list[dict[str, Any]]) -> Finding | None:
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
        return _finding(
            "fr-collective-mismatch",
            "collective_mismatch",
            f"Ranks issued different collectives ({kind})",
            "critical",
            None,
            _ts(next(iter(present.values())).get("time_created_ns")),
            evidence,
            {"pg": pg, "seq": seq, "ops": {str(r): o for r, o in ops.items()}},
            f"flight recorder: at collective #{seq} of process group {pg} the ranks disagree on the {kind}: "
            + "; ".join(f"rank {r} {ops[r]} {sizes[r]}" for r in sorted(present)),
            (),
            [
                "Every rank must issue the same collectives in the same order with the same shapes: look for "
                "rank-dependent branches (if rank == 0: ...) around the collective at that step."
            ],
        )
    return None


def flight_recorder_findings(dumps: list[dict[str, Any]]) -> list[Finding]:
    """Findings from every rank's dump of one run."""
    found = [_mismatches(dumps), _missing_ranks(dumps)]
    return [f for f in found if f is not None]
