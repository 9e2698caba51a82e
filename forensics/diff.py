"""Did a change fix the problem? Two runs side by side: key numbers, metrics at matching steps,
findings in one and not the other, configuration and environment differences, and a verdict line.

Run A is the "before" (usually the failed run), run B the "after"; every change is B relative to A.
Pure: takes two Analysis objects, returns a plain dict (schema `forensics.diff/v1`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.fingerprint import root_fingerprint
from forensics.metric_semantics import bundled, panel
from forensics.model import Analysis, Finding
from forensics.redact import redact_tree

SCHEMA = "forensics.diff/v1"
MAX_POINTS = 60
HOST_MEMORY_NOTABLE_PCT = 10.0


@dataclass(frozen=True)
class KeyNumber:
    """A number that says whether a run got better, and where to read it from (first source found in both)."""

    name: str
    label: str
    unit: str
    better: str  # "lower" | "higher"
    sources: tuple[tuple[str, str, float], ...]  # (metric, how to reduce over steps, scale)


KEY_NUMBERS = (
    KeyNumber(
        "peak_memory_gb",
        "peak memory",
        "GiB",
        "lower",
        (
            ("perf/max_memory_allocated_gb", "max", 1.0),
            ("perf/max_memory_reserved_gb", "max", 1.0),
            ("gpu/memory_used_mib", "max", 1 / 1024),
        ),
    ),
    KeyNumber("throughput", "throughput", "tokens/s", "higher", (("perf/throughput", "median", 1.0),)),
    KeyNumber(
        "step_time_s",
        "step time",
        "s",
        "lower",
        (("timing_s/step", "median", 1.0), ("perf/time_per_step", "median", 1.0)),
    ),
    KeyNumber("host_memory_gb", "host memory", "GiB", "lower", (("perf/cpu_memory_used_gb", "max", 1.0),)),
)
# the curves the report plots, less the clip fractions (their scale says little across runs)
COMPARED_METRICS = tuple(m for m in panel("training") if bundled().kind(m) != "clip_fraction")
FAILURE_NAMES = {
    "cuda_oom": "the OOM",
    "host_oom": "the host OOM",
    "kv_cache_insufficient": "the KV-cache shortage",
    "nccl_timeout": "the NCCL timeout",
    "nccl_error": "the NCCL error",
    "process_killed": "the killed process",
    "ray_actor_died": "the Ray actor death",
    "ray_node_died": "the Ray node death",
    "training_instability": "the training instability",
    "unknown_crash": "the unrecognised crash",
}


def failure_name(cls: str) -> str:
    return FAILURE_NAMES.get(cls, f"the {cls.replace('_', ' ')}")


def _number(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return float(f"{value:.6g}")  # six significant digits: enough to compare, short to read


def per_step(series: pl.DataFrame, metric: str) -> pl.DataFrame:
    """(step, value): the mean over ranks and duplicate lines of one metric at each step."""
    return (
        series.filter((pl.col("metric") == metric) & pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("value").mean())
        .sort("step")
    )


def _reduce(series: pl.DataFrame, metric: str, how: str) -> float | None:
    if how == "max" and metric.startswith("gpu/"):  # nvidia-smi samples have no step
        values = series.filter(pl.col("metric") == metric).get_column("value")
    else:
        values = per_step(series, metric).get_column("value")
    values = values.filter(values.is_finite())
    if values.is_empty():
        return None
    return float(values.max() if how == "max" else values.median())


def change_pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / abs(a) * 100


def format_pct(pct: float) -> str:
    """+19%, -38%, +0.6%: one decimal only where the change is small."""
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def _pick(key: KeyNumber, a: Analysis, b: Analysis) -> tuple[str, float | None, float | None] | None:
    """The first source that both runs logged, else the first that one of them logged."""
    found = []
    for metric, how, scale in key.sources:
        va, vb = _reduce(a.series, metric, how), _reduce(b.series, metric, how)
        va, vb = (v * scale if v is not None else None for v in (va, vb))
        if va is not None and vb is not None:
            return metric, va, vb
        if va is not None or vb is not None:
            found.append((metric, va, vb))
    return found[0] if found else None


def key_numbers(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    out = []
    for key in KEY_NUMBERS:
        picked = _pick(key, a, b)
        if picked is None:
            continue
        metric, va, vb = picked
        pct = change_pct(va, vb)
        improved = None if not pct else (pct < 0) == (key.better == "lower")
        out.append(
            {
                "name": key.name,
                "label": key.label,
                "unit": key.unit,
                "source": metric,
                "a": _number(va),
                "b": _number(vb),
                "change_pct": _number(pct),
                "better": key.better,
                "improved": improved,
            }
        )
    return out


def matched_series(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    """Loss, reward and friends compared where both runs logged the same step."""
    out = []
    for metric in COMPARED_METRICS:
        joined = per_step(a.series, metric).join(per_step(b.series, metric), on="step", suffix="_b").drop_nulls()
        if joined.is_empty():
            continue
        va, vb = joined.get_column("value"), joined.get_column("value_b")
        diff = (vb - va).abs()
        diff = diff.filter(diff.is_finite())
        stride = max(1, math.ceil(joined.height / MAX_POINTS))
        points = joined.gather_every(stride)
        last = joined.row(-1)
        out.append(
            {
                "metric": metric,
                "steps": joined.height,
                "first_step": int(joined.get_column("step").min()),
                "last_step": int(last[0]),
                "a_last": _number(last[1]),
                "b_last": _number(last[2]),
                "a_mean": _number(va.filter(va.is_finite()).mean()),
                "b_mean": _number(vb.filter(vb.is_finite()).mean()),
                "max_abs_diff": _number(diff.max()) if not diff.is_empty() else None,
                "points": [[int(s), _number(x), _number(y)] for s, x, y in points.iter_rows()],
            }
        )
    return out


def _finding_summary(findings: list[Finding]) -> dict[str, dict[str, Any]]:
    by_rule: dict[str, dict[str, Any]] = {}
    for f in findings:
        entry = by_rule.setdefault(
            f.rule, {"rule": f.rule, "class": f.cls, "title": f.title, "severity": f.severity, "ranks": [], "count": 0}
        )
        entry["count"] += f.count
        if f.rank is not None and f.rank not in entry["ranks"]:
            entry["ranks"].append(f.rank)
    return by_rule


def compare_findings(a: Analysis, b: Analysis) -> dict[str, list[dict[str, Any]]]:
    fa, fb = _finding_summary(a.findings), _finding_summary(b.findings)
    both = [{**fa[r], "count_b": fb[r]["count"], "ranks_b": fb[r]["ranks"]} for r in fa if r in fb]
    return {
        "only_a": [fa[r] for r in fa if r not in fb],
        "only_b": [fb[r] for r in fb if r not in fa],
        "both": both,
    }


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`)."""
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: tree} if prefix else {}


def compare_mappings(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    fa, fb = flatten(a), flatten(b)
    if not (fa and fb):  # one side read none: listing every key of the other would hide nothing useful
        return {"read": [bool(fa), bool(fb)], "changed": [], "only_a": [], "only_b": []}
    return {
        "read": [bool(fa), bool(fb)],
        "changed": [{"key": k, "a": fa[k], "b": fb[k]} for k in sorted(fa.keys() & fb.keys()) if fa[k] != fb[k]],
        "only_a": [{"key": k, "value": fa[k]} for k in sorted(fa.keys() - fb.keys())],
        "only_b": [{"key": k, "value": fb[k]} for k in sorted(fb.keys() - fa.keys())],
    }


def _side(a: Analysis) -> dict[str, Any]:
    root = a.verdict.root_cause
    steps = a.series.get_column("step").drop_nulls()
    side: dict[str, Any] = {
        "name": a.run_name,
        "path": a.run_path,
        "status": a.verdict.status,
        "summary": a.verdict.summary,
        "reason": a.verdict.reason.to_json() if a.verdict.reason else None,
        "steps": int(steps.max()) if steps.len() else 0,
        "files": len(a.files),
        "root_cause": None,
    }
    if root is not None:
        side["root_cause"] = {
            "class": root.cls,
            "rule": root.rule,
            "title": root.title,
            "rank": root.rank,
            "host": root.host,
            "step": root.step,
            "fingerprint": root_fingerprint(a)[0],
            "evidence": root.evidence[0].to_json() if root.evidence else None,
        }
    return side


def _failure_clause(a: dict[str, Any], b: dict[str, Any]) -> str:
    ra, rb = a["root_cause"], b["root_cause"]
    unsure = [
        f"{label} ({side['reason']['code'].replace('_', ' ')})"
        for label, side in (("A", a), ("B", b))
        if side["reason"]
    ]
    if unsure:  # nothing read is not healthy: no comparison of failures can stand on it
        return f"no verdict for {' and '.join(unsure)}"
    if ra is None and rb is None:
        return "both runs are healthy"
    if ra is None:
        return f"B fails with {failure_name(rb['class'])} ({rb['rule']}) that A did not have"
    if rb is None:
        return f"{failure_name(ra['class'])} is gone"
    if ra["class"] != rb["class"]:
        return f"{failure_name(ra['class'])} is gone, but B fails with {failure_name(rb['class'])} ({rb['rule']})"
    same = "same fingerprint" if ra["fingerprint"] == rb["fingerprint"] else "different evidence"
    return f"still fails with {failure_name(ra['class'])} ({same})"


def _in_verdict(name: str, pct: float, numbers: list[dict[str, Any]]) -> bool:
    """Peak memory and throughput always (step time when there is no throughput); host memory when it moved."""
    if name in ("peak_memory_gb", "throughput"):
        return True
    if name == "step_time_s":
        return not any(n["name"] == "throughput" for n in numbers)
    return abs(pct) >= HOST_MEMORY_NOTABLE_PCT


def verdict_line(doc: dict[str, Any]) -> str:
    """`peak memory -38%, throughput +19%, the OOM is gone`: the numbers that moved, then the failure."""
    parts = []
    for number in doc["numbers"]:
        pct = number["change_pct"]
        if isinstance(pct, float) and _in_verdict(number["name"], pct, doc["numbers"]):
            parts.append(f"{number['label']} {format_pct(pct)}")
    a, b = doc["a"], doc["b"]
    if a["steps"] != b["steps"] and (a["steps"] or b["steps"]):
        parts.append(f"B reached step {b['steps']} (A: {a['steps']})")
    parts.append(_failure_clause(a, b))
    return ", ".join(parts)


def compare(a: Analysis, b: Analysis, redact_secrets: bool = True) -> dict[str, Any]:
    """Everything `forensics diff` shows, as plain data."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "a": _side(a),
        "b": _side(b),
        "numbers": key_numbers(a, b),
        "series": matched_series(a, b),
        "findings": compare_findings(a, b),
        "config": compare_mappings(a.config, b.config),
        "environment": compare_mappings(a.environment, b.environment),
        "warnings": [f"A: {w}" for w in a.warnings[:20]] + [f"B: {w}" for w in b.warnings[:20]],
    }
    doc["verdict"] = verdict_line(doc)
    return redact_tree(doc) if redact_secrets else doc
