"""The shapes every stage agrees on: table schemas, findings and the analysis result."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import polars as pl

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "ts_inferred": pl.Boolean(),
    "file": pl.String(),
    "line": pl.Int64(),
    "source": pl.String(),
    "host": pl.String(),
    "pid": pl.Int64(),
    "rank": pl.Int64(),
    "role": pl.String(),
    "level": pl.String(),
    "kind": pl.String(),
    "message": pl.String(),
    "fields": pl.String(),  # JSON object of extracted values
}

SERIES_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "step": pl.Int64(),
    "rank": pl.Int64(),
    "source": pl.Categorical(),
    "metric": pl.Categorical(),
    "value": pl.Float64(),
}

MESSAGE_CAP = 2000
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.utc)  # where a finding without a time sorts
SEVERITIES = ("info", "warning", "error", "critical")
# `inconclusive`: too little was read to say (empty, unreadable, no training output, stopped without a cause)
STATUSES = ("failed", "degraded", "healthy", "inconclusive")
# empty: nothing to read; unreadable: no file could be opened (exit status 2); not_run_output: only
# documentation, source code or binaries; interrupted: stopped by hand with no failure in the logs
INCONCLUSIVE_CODES = ("empty", "unreadable", "not_run_output", "interrupted")


def severity_rank(severity: str) -> int:
    """Order severities so that a larger number is worse."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


@dataclass(frozen=True)
class Evidence:
    """One input line that supports a finding; `facts` are the values its readers extracted (not in the JSON)."""

    file: str
    line: int
    text: str
    facts: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text}


@dataclass
class Finding:
    """A rule or detector that fired, grouped per rank (and host) with its first occurrence."""

    rule: str
    cls: str
    title: str
    severity: str
    layer: str
    rank: int | None
    host: str | None
    role: str | None
    ts: datetime | None
    ts_inferred: bool
    order: tuple[int, int, int]  # (file index, line, seq) for ordering when times are missing
    count: int
    evidence: list[Evidence]
    fields: dict[str, Any] = field(default_factory=dict)
    remediation: list[str] = field(default_factory=list)
    symptom_of: tuple[str, ...] = ()
    step: int | None = None
    explanation: str = ""
    strength: str = "direct"  # what the evidence is: direct (a crash line), measured (a NaN), statistical

    def sort_key(self) -> tuple[datetime, int, int, int]:
        """Time order, then the position in the input (file, line, sequence) where times are missing."""
        return (self.ts or FAR_FUTURE, *self.order)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "class": self.cls,
            "title": self.title,
            "severity": self.severity,
            "layer": self.layer,
            "rank": self.rank,
            "host": self.host,
            "role": self.role,
            "ts": iso(self.ts),
            "ts_inferred": self.ts_inferred,
            "step": self.step,
            "count": self.count,
            "evidence_strength": self.strength,
            "fields": self.fields,
            "explanation": self.explanation,
            "evidence": [e.to_json() for e in self.evidence],
            "remediation": self.remediation,
        }


@dataclass
class Symptom:
    """Findings of one class explained by the root cause, across ranks."""

    cls: str
    rule: str
    ranks: list[int]
    first_ts: datetime | None
    count: int
    evidence: list[Evidence]

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "rule": self.rule,
            "ranks": self.ranks,
            "first_ts": iso(self.first_ts),
            "count": self.count,
            "evidence": [e.to_json() for e in self.evidence[:3]],
        }


@dataclass(frozen=True)
class Inconclusive:
    """Why a run gets no verdict: `code` for gates and tables, `text` for people."""

    code: str  # one of INCONCLUSIVE_CODES
    text: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "text": self.text}


@dataclass
class Verdict:
    status: str  # one of STATUSES
    root_cause: Finding | None
    confidence: float
    symptoms: list[Symptom]
    candidates: list[Finding]
    summary: str
    reason: Inconclusive | None = None  # set exactly when the status is `inconclusive`
    ranking: str = ""  # why the root cause outranked another candidate, when one was earlier or stronger

    def to_json(self) -> dict[str, Any]:
        root = None
        if self.root_cause is not None:
            f = self.root_cause
            root = {
                "class": f.cls,
                "rule": f.rule,
                "title": f.title,
                "rank": f.rank,
                "host": f.host,
                "role": f.role,
                "ts": iso(f.ts),
                "ts_inferred": f.ts_inferred,
                "step": f.step,
                "confidence": round(self.confidence, 2),
                "explanation": f.explanation,
                "fields": f.fields,
                "evidence": [e.to_json() for e in f.evidence],
                "remediation": f.remediation,
            }
        return {
            "status": self.status,
            "summary": self.summary,
            "reason": self.reason.to_json() if self.reason else None,
            "ranking": self.ranking,
            "root_cause": root,
            "symptoms": [s.to_json() for s in self.symptoms],
            "candidates": [{"class": c.cls, "rule": c.rule, "rank": c.rank, "host": c.host} for c in self.candidates],
        }


@dataclass
class FileReport:
    """What was read from one input file."""

    path: str
    kind: str
    bytes: int
    lines: int = 0
    events: int = 0
    samples: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "bytes": self.bytes,
            "lines": self.lines,
            "events": self.events,
            "samples": self.samples,
            "note": self.note,
        }


@dataclass
class Analysis:
    """Everything `forensics analyze` learned about one run."""

    run_path: str
    run_name: str
    files: list[FileReport]
    events: pl.DataFrame
    series: pl.DataFrame
    findings: list[Finding]
    verdict: Verdict
    checks: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)  # the process's peak memory once each stage ended
    extras: dict[str, list[Any]] = field(default_factory=dict)  # per-kind structured results of file readers
    ray: dict[str, Any] = field(default_factory=dict)  # Ray nodes and actors, who died why (analyses/ray_cluster.py)
    traces: dict[str, Any] = field(default_factory=dict)  # GPU trace summaries (analyses/traces.py)


def iso(ts: datetime | None) -> str | None:
    return ts.isoformat().replace("+00:00", "Z") if ts is not None else None


def empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def empty_series() -> pl.DataFrame:
    return pl.DataFrame(schema=SERIES_SCHEMA)
