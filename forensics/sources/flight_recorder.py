"""PyTorch NCCL flight-recorder dumps (`TORCH_FR_DUMP_TEMP_FILE` / `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`).

One pickle per rank, named `<prefix><rank>`, holding plain containers: `pg_status` (last enqueued,
started and completed collective per process group) and `entries` (one record per collective). They
are decoded with forensics.safe_pickle, never with `pickle.load`.

Each dump becomes one `fr_rank_state` event per process group (the same sequence numbers the
watchdog prints, so the diagnosis can name the rank that lags) and its recent entries go to the
FileResult for the cross-rank comparison in forensics.analyses.flight_recorder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from forensics.safe_pickle import MAX_PICKLE_BYTES, UnsafePickle, loads_plain
from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

SOURCE = "flight_recorder"
KIND = "flight_recorder"
RANK_SUFFIX = re.compile(r"(?P<rank>\d+)(?:\.pkl|\.pickle)?$")
KEPT_ENTRIES = 200


def _sniff(name: str, head: bytes) -> bool:
    """A pickle named like `<prefix><rank>` (the flight recorder's own naming)."""
    return head[:1] == b"\x80" and RANK_SUFFIX.search(name) is not None


def _entry_summary(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": entry.get("collective_seq_id"),
        "p2p_seq": entry.get("p2p_seq_id"),
        "pg": str(entry.get("pg_id")),
        "op": entry.get("profiling_name"),
        "state": entry.get("state"),
        "input_sizes": entry.get("input_sizes"),
        "output_sizes": entry.get("output_sizes"),
        "dtypes": entry.get("input_dtypes"),
        "output_dtypes": entry.get("output_dtypes"),
        "record_id": entry.get("record_id"),
        "is_p2p": bool(entry.get("is_p2p")),
        "time_created_ns": entry.get("time_created_ns"),
        "timeout_ms": entry.get("timeout_ms"),
    }


def _group_members(pg_config: Any, entries: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Process group (the name entries carry) -> its global ranks, from pg_config."""
    out: dict[str, list[int]] = {}
    if not isinstance(pg_config, dict):
        return out
    for key, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            continue
        ranks = _ranks(cfg.get("ranks"))
        name = str(cfg.get("name") or key)
        if ranks and name:
            out[name] = ranks
    named = {str(e.get("pg_id")) for e in entries} | {str((e.get("process_group") or ("",))[0]) for e in entries}
    return {pg: ranks for pg, ranks in out.items() if pg in named} or out


def _ranks(value: Any) -> list[int]:
    """`ranks` as the recorder writes it: text (`'[0, 1]'`) or a list."""
    if isinstance(value, str):
        value = [v for v in re.split(r"[^\d]+", value) if v]
    try:
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else []
    except (TypeError, ValueError):
        return []


def _status(pg_status: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(pg_status, dict):
        return {}
    keys = {"last_enqueued": "last_enqueued_collective", "last_completed": "last_completed_collective"}
    return {
        str(pg): {ours: s.get(theirs) for ours, theirs in keys.items()}
        for pg, s in pg_status.items()
        if isinstance(s, dict)
    }


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    with open_binary(path) as fh:
        data = fh.read(MAX_PICKLE_BYTES + 1)  # loads_plain refuses anything larger: never hold more in memory
    try:
        dump = loads_plain(data)
    except UnsafePickle as exc:
        result.warnings.append(f"{rel}: flight-recorder dump not decoded: {exc}")
        result.note = "not decoded (unsafe or damaged pickle)"
        return result
    if not isinstance(dump, dict) or "entries" not in dump:
        result.warnings.append(f"{rel}: a pickle without flight-recorder entries")
        return result
    rank = int(RANK_SUFFIX.search(path.name)["rank"])
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    pg_config = dump.get("pg_config") or {}
    result.lines = len(entries)
    result.environment.update({"flight_recorder_version": dump.get("version")})
    if dump.get("comm_lib_version"):
        result.environment["nccl_version"] = dump["comm_lib_version"]
    for pg, status in (dump.get("pg_status") or {}).items():
        if not isinstance(status, dict):
            continue
        desc = (pg_config.get(pg) or {}).get("desc", "") if isinstance(pg_config, dict) else ""
        last_entry = next((e for e in reversed(entries) if str(e.get("pg_id")) == str(pg)), {})
        fields = {
            "pg": str(pg),
            "pg_desc": desc,
            "last_enqueued": status.get("last_enqueued_collective"),
            "last_started": status.get("last_started_collective"),
            "last_completed": status.get("last_completed_collective"),
            "last_op": last_entry.get("profiling_name"),
            "last_state": last_entry.get("state"),
        }
        text = (
            f"flight recorder rank {rank} pg {pg} ({desc}): last enqueued collective {fields['last_enqueued']}, "
            f"last completed {fields['last_completed']}; newest entry {fields['last_op']} {fields['last_state']}"
        )
        sink.event(
            file=rel, line=1, source=SOURCE, kind="fr_rank_state", message=text, rank=rank, level="info", fields=fields
        )
    result.extras["flight_recorder"] = {
        "rank": rank,
        "file": rel,
        "entries": [_entry_summary(e) for e in entries[-KEPT_ENTRIES:]],
        "groups": _group_members(pg_config, entries),
        "status": _status(dump.get("pg_status")),
    }
    result.note = f"flight recorder, rank {rank}, {len(entries)} entries"
    return result


FILE_SOURCES = [FileSource(KIND, _sniff, _read)]
