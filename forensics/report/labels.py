"""Words for what the reports show: finding classes, extracted fields with their units, rank lists, times.

A reader of the verdict box should see "Timeout: 30 s", not `timeout_ms: 30000`, and "ranks 0–63 except 41",
not a list of 63 numbers. Field names come from the rules' named groups and the detectors; a name not listed
here is still made readable from its shape (underscores, a unit suffix).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

CLASS_LABELS = {
    "cuda_oom": "CUDA out of memory",
    "kv_cache_insufficient": "KV cache too small",
    "host_oom": "host out of memory",
    "process_killed": "process killed",
    "nccl_timeout": "NCCL timeout",
    "nccl_error": "NCCL error",
    "collective_mismatch": "collective mismatch",
    "ray_actor_died": "Ray actor died",
    "ray_node_died": "Ray node died",
    "weight_key_mismatch": "weight key mismatch",
    "shape_mismatch": "shape mismatch",
    "cuda_error": "CUDA error",
    "gpu_hardware": "GPU hardware fault",
    "env_version_mismatch": "version mismatch",
    "config_error": "configuration error",
    "training_instability": "training instability",
    "straggler": "straggler",
    "hang": "hang",
    "disk_or_io": "disk or I/O error",
    "unknown_crash": "crash (no rule)",
    "healthy": "healthy",
}

# fields whose words are not guessable from the name; the rest are humanised by `field_label`
FIELD_LABELS = {
    "exception": "Exception",
    "exception_module": "Module",
    "cause": "Wrapped exception",
    "tried": "Tried to allocate",
    "gpu": "GPU",
    "capacity": "GPU capacity",
    "free": "Free on the GPU",
    "process_in_use": "In use by this process",
    "allocated": "Allocated by PyTorch",
    "reserved_unallocated": "Reserved by PyTorch, unallocated",
    "reserved_total": "Reserved by PyTorch in total",
    "other_processes": "Other processes",
    "oom_case": "Kind of OOM",
    "memory_trend": "Memory before the OOM",
    "seq": "Collective sequence number",
    "op": "Operation",
    "ops": "Operations by rank",
    "pg": "Process group",
    "numel_in": "Elements in",
    "numel_out": "Elements out",
    "timeout_ms": "Timeout",
    "ran_ms": "Ran for",
    "stall_start": "Stalled since",
    "last_enqueued": "Last enqueued collective",
    "last_completed": "Last completed collective",
    "missing_ranks": "Ranks that never joined",
    "present_ranks": "Ranks that joined",
    "candidate_ranks": "Candidate ranks",
    "lagging_ranks": "Lagging ranks",
    "straggler_ranks": "Straggler ranks",
    "who": "Rank at fault",
    "nccl_version": "NCCL version",
    "nccl_error": "NCCL error",
    "nccl_result": "NCCL result",
    "nccl_call": "NCCL call",
    "where": "Raised in",
    "cuda_error": "CUDA error",
    "cuda_code": "CUDA error code",
    "assertion": "Failed assertion",
    "fatal": "Fatal signal",
    "exitcode": "Exit code",
    "local_rank": "Local rank",
    "pid": "Process ID",
    "torchrun_root_cause": "Named first by torchrun",
    "metric": "Metric",
    "metrics": "Metrics",
    "non_finite": "Non-finite metrics",
    "non_finite_steps": "Steps with non-finite values",
    "steps": "Steps",
    "spans": "Episodes (steps)",
    "growth_gib_per_step": "Growth per step",
    "leads_to": "Leads to",
    "capacity_gib": "GPU capacity",
    "projected_step": "Projected to run out at step",
    "max_rise": "Largest rise",
    "drop": "Drop",
    "before": "Before",
    "after": "After",
    "node_ip": "Node IP",
    "node_id": "Node ID",
    "node_used_gb": "Node memory used",
    "node_total_gb": "Node memory total",
    "node_fraction": "Node memory used (share)",
    "killed_count": "Workers killed",
    "killed_task": "Killed task",
    "usage_bytes": "Memory used",
    "threshold_bytes": "Kill threshold",
    "limit_bytes": "Memory limit",
    "threshold": "Kill threshold (share)",
    "task": "Ray task",
    "task_pid": "Task process ID",
    "task_ip": "Task node IP",
    "task_actor_id": "Task actor ID",
    "actor_id": "Actor ID",
    "actor_name": "Actor",
    "actor_class": "Actor class",
    "actors_lost": "Actors lost",
    "worker_id": "Worker ID",
    "death_reason": "Why it died",
    "death_message": "Death message",
    "exit_type": "Exit type",
    "exit_detail": "Exit detail",
    "raylet_last_log": "Raylet's last log line",
    "quoted_worker_ids": "Workers named",
    "xid": "Xid",
    "xid_meaning": "Xid meaning",
    "real_train_batch_size": "Real train batch size",
    "minimal_bsz": "Smallest possible batch size",
    "stuck_s": "Stuck for",
    "gap_s": "Gap",
    "step_s": "Step time",
}
METRIC_FIELDS = {"metric", "metrics", "non_finite"}  # detectors name the same metrics under several keys
HIDDEN_FIELDS = {"rules", "detector", "raised_at", "exception_message", "subject", "label", "source_type"}
_WORDS = {"gpu": "GPU", "gpus": "GPUs", "nccl": "NCCL", "cuda": "CUDA", "ip": "IP", "id": "ID", "pid": "process ID"}
_WORDS |= {"oom": "OOM", "kv": "KV", "tp": "TP", "sp": "SP", "pp": "PP", "ppo": "PPO", "fr": "flight recorder"}
_UNIT_SUFFIXES = ("_ms", "_s", "_bytes", "_gb", "_gib", "_mib", "_kb", "_pct", "_fraction")
_DECIMAL = re.compile(r"^-?\d+\.\d+(?:[eE][-+]?\d+)?$")
_ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
MAX_VALUE_CHARS = 300
MAX_LISTED = 12


def class_label(cls: str | None) -> str:
    return CLASS_LABELS.get(cls or "", (cls or "").replace("_", " "))


def field_label(key: str) -> str:
    """A field's name as words: the known label, else the name without its unit suffix, spelled out."""
    if key in FIELD_LABELS:
        return FIELD_LABELS[key]
    stem = next((key[: -len(s)] for s in _UNIT_SUFFIXES if key.endswith(s) and len(key) > len(s)), key)
    words = [_WORDS.get(w, w) for w in stem.split("_") if w]
    text = " ".join(words) or key
    return text[0].upper() + text[1:]


def rank_ranges(ranks: Iterable[int | None]) -> str:
    """Ranks as a reader counts them: `0–63 except 41`, `0–3, 8, 12–15`, `5`; empty when none is known."""
    known = sorted({int(r) for r in ranks if r is not None})
    if not known:
        return ""
    first, last = known[0], known[-1]
    missing = [r for r in range(first, last + 1) if r not in set(known)] if last - first < 100_000 else None
    if missing and len(known) >= 8 and len(missing) <= 3:
        return f"{first}–{last} except {', '.join(map(str, missing))}"
    runs: list[list[int]] = []
    for r in known:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [f"{a}" if a == b else (f"{a}, {b}" if b == a + 1 else f"{a}–{b}") for a, b in runs]
    if len(parts) > MAX_LISTED:
        return ", ".join(parts[:MAX_LISTED]) + f" and {len(parts) - MAX_LISTED} more ranges"
    return ", ".join(parts)


def ranks_phrase(ranks: Iterable[int | None]) -> str:
    """`rank 5`, `ranks 0–7`, or `–` when no rank is known."""
    known = sorted({int(r) for r in ranks if r is not None})
    if not known:
        return "–"
    return f"rank {known[0]}" if len(known) == 1 else f"ranks {rank_ranges(known)}"


def when(value: str | datetime | None) -> str:
    """An ISO time as `2026-11-30 05:17:21.549 UTC` (milliseconds are enough to order a failure)."""
    if value is None or value == "":
        return "–"
    if isinstance(value, datetime):
        value = value.isoformat()
    text = str(value).replace("T", " ").removesuffix("Z").removesuffix("+00:00")
    date, _, rest = text.partition(" ")
    clock, dot, frac = rest.partition(".")
    return f"{date} {clock}{dot + frac[:3] if dot else ''} UTC" if rest else text


def duration_ms(ms: float) -> str:
    """A duration in the unit a person would say it in."""
    if abs(ms) < 1000:
        return f"{ms:,.0f} ms"
    s = ms / 1000
    if abs(s) < 120:
        return f"{s:,.1f} s".replace(".0 s", " s")
    if abs(s) < 7200:
        return f"{s / 60:,.1f} min".replace(".0 min", " min")
    return f"{s / 3600:,.1f} h".replace(".0 h", " h")


def byte_size(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _plain_number(x: float) -> str:
    if abs(x) >= 1e15:
        return f"{x:.3g}"
    if x == int(x) or abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) >= 1e-3 else f"{x:.3g}"


def _with_unit(key: str, value: Any) -> str | None:
    """The value with the unit its name carries, or None when the name says none."""
    x = _number(value)
    if x is None:
        return None
    if key.endswith("_ms"):
        return duration_ms(x)
    if key.endswith("_s"):
        return duration_ms(x * 1000)
    if key.endswith("_bytes"):
        return byte_size(x)
    if key.endswith(("_gb", "_gib")):
        return f"{x:,.2f} GiB"
    if key.endswith("_mib"):
        return f"{x:,.0f} MiB"
    if key.endswith("_kb"):
        return byte_size(x * 1024)
    if key.endswith("_pct"):
        return f"{x:.1f}%"
    if key.endswith("_fraction") or key in ("threshold", "drop"):
        return f"{x * 100:.1f}%"
    if key == "growth_gib_per_step":
        return f"{x:,.2f} GiB per step"
    return None


def _frame(value: dict[str, Any]) -> str | None:
    if "file" in value and "line" in value:
        func = f" in {value['func']}" if value.get("func") else ""
        return f"{value['file']}:{value['line']}{func}"
    return None


def _as_list(value: Any) -> list[Any] | None:
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, list) else None
    return None


def field_value(key: str, value: Any) -> str:
    """A field's value as text a person reads: units, ranges, lists and times, never a Python repr."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool) or value in ("True", "False"):
        return "yes" if value in (True, "True") else "no"
    unit = _with_unit(key, value)
    if unit is not None:
        return unit
    items = _as_list(value)
    if items is not None:
        return _list_value(key, items)
    if isinstance(value, dict):
        return _frame(value) or "; ".join(f"{field_label(str(k))}: {field_value(str(k), v)}" for k, v in value.items())
    if isinstance(value, int | float):
        return _plain_number(float(value))
    text = str(value)
    if _ISO_TIME.match(text):
        return when(text)
    if _DECIMAL.match(text):  # a measured value read from a line; whole numbers may be ids and stay as written
        return _plain_number(float(text))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _list_value(key: str, items: list[Any]) -> str:
    if key in ("steps",) and len(items) == 2 and all(_number(i) is not None for i in items):
        a, b = (int(float(i)) for i in items)
        return f"{a}" if a == b else f"{a}–{b}"
    if key == "spans":
        return ", ".join(_list_value("steps", s) if isinstance(s, list) else str(s) for s in items)
    if (key.endswith("ranks") or key == "who") and all(_number(i) is not None for i in items):
        return rank_ranges(int(float(i)) for i in items)
    shown = [field_value(key, i) if not isinstance(i, str) else i for i in items[:MAX_LISTED]]
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(shown) + more if shown else "none"


def fact_rows(fields: dict[str, Any]) -> list[tuple[str, str]]:
    """The fields of a finding as (label, value) rows: plumbing, the step (the verdict box says it) and values
    repeated under a second name left out."""
    rows: list[tuple[str, str]] = []
    named: set[str] = set()  # what the metric fields said already
    shown: set[tuple[str, str]] = set()
    for key, value in fields.items():
        if key in HIDDEN_FIELDS or key == "step" or value in (None, "", [], {}):
            continue
        text = field_value(key, value)
        if key in METRIC_FIELDS:
            if text in named:
                continue
            named.add(text)
        row = (field_label(key), text)
        if row not in shown:  # two sources of one number (threshold and threshold_pct)
            shown.add(row)
            rows.append(row)
    return rows
