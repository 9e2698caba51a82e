"""The JSON result, schema `forensics.report/v1`."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

from forensics.model import Analysis, iso
from forensics.redact import redact_tree

SCHEMA = "forensics.report/v1"
CHECK_SCHEMA = "forensics.check/v1"
NO_VALUE = "–"  # what the checklist writes for a value it could not measure; JSON says null


def _run_section(a: Analysis) -> dict[str, Any]:
    ev = a.events
    ts_all = pl.concat([ev.select("ts"), a.series.select("ts")]).drop_nulls()
    ranks = pl.concat([ev.select("rank"), a.series.filter(pl.col("source") != "nvidia_smi").select("rank")])
    hosts = ev.get_column("host").drop_nulls().unique().to_list()
    steps = a.series.get_column("step").drop_nulls()
    return {
        "path": a.run_path,
        "name": a.run_name,
        "files": [f.to_json() for f in a.files],
        "ranks": ranks.get_column("rank").drop_nulls().n_unique(),
        "hosts": len(hosts),
        "first_ts": iso(ts_all.get_column("ts").min()) if ts_all.height else None,
        "last_ts": iso(ts_all.get_column("ts").max()) if ts_all.height else None,
        "steps": int(steps.max()) if steps.len() else 0,
    }


def _finite(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(value, 6)


def metric_summary(series: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """first/last/min/max and non-finite counts of every metric that was logged by step."""
    by_step = series.filter(pl.col("step").is_not_null())
    if by_step.is_empty():
        return {}
    summary = (
        by_step.sort("step")
        .group_by("metric", maintain_order=True)
        .agg(
            pl.len().alias("samples"),
            pl.col("step").min().alias("first_step"),
            pl.col("step").max().alias("last_step"),
            pl.col("value").first().alias("first"),
            pl.col("value").last().alias("last"),
            pl.col("value").filter(pl.col("value").is_finite()).min().alias("min"),
            pl.col("value").filter(pl.col("value").is_finite()).max().alias("max"),
            (~pl.col("value").is_finite()).sum().alias("non_finite"),
        )
        .sort("metric")
    )
    out = {}
    for row in summary.iter_rows(named=True):
        metric = row.pop("metric")
        out[metric] = {k: (_finite(v) if isinstance(v, float) else v) for k, v in row.items()}
    return out


def to_json_dict(a: Analysis, redact_secrets: bool = True) -> dict[str, Any]:
    doc = {
        "schema": SCHEMA,
        "run": _run_section(a),
        "verdict": a.verdict.to_json(),
        "findings": [f.to_json() for f in a.findings],
        "checks": checks_json(a.checks),
        "metrics": metric_summary(a.series),
        "config": a.config,
        "environment": a.environment,
        "warnings": a.warnings,
    }
    if a.ray:
        doc["ray"] = a.ray
    if a.traces:
        doc["traces"] = a.traces
    return redact_tree(doc) if redact_secrets else doc


def checks_json(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checklist with `null` for a value that could not be measured."""
    return [{**c, "value": None if c["value"] in (NO_VALUE, "") else c["value"]} for c in checks]


def check_json(a: Analysis, redact_secrets: bool = True) -> dict[str, Any]:
    """`forensics check --json` (schema `forensics.check/v1`): the run, whether anything was read, the checklist."""
    doc = {
        "schema": CHECK_SCHEMA,
        "run": {"path": a.run_path, "name": a.run_name, "files": len(a.files)},
        "status": a.verdict.status,
        "reason": a.verdict.reason.to_json() if a.verdict.reason else None,
        "checks": checks_json(a.checks),
        "warnings": a.warnings,
    }
    return redact_tree(doc) if redact_secrets else doc


def dumps(a: Analysis, redact_secrets: bool = True) -> str:
    return format_json(to_json_dict(a, redact_secrets))


def format_json(doc: dict[str, Any]) -> str:
    """The JSON report's text, from `to_json_dict`."""
    return json.dumps(doc, indent=2, default=str)
