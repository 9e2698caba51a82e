"""What a batch produces, low in the house so that the batch runner and the reports that print it share it:
the fleet table's columns and files, and the result of one batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from forensics.model import iso

FLEET_FILE = "fleet.parquet"
INDEX_FILE = "index.html"
RUNS_DIR = "runs"
BATCH_SCHEMA = "forensics.batch/v1"

FLEET_SCHEMA: dict[str, pl.DataType] = {
    "run": pl.String(),
    "path": pl.String(),
    "status": pl.String(),  # failed | degraded | healthy | inconclusive | error
    "reason": pl.String(),  # why an inconclusive run has no verdict (model.INCONCLUSIVE_CODES)
    "class": pl.String(),
    "rule": pl.String(),
    "rank": pl.Int64(),
    "host": pl.String(),
    "step": pl.Int64(),
    "first_failure": pl.Datetime("us", "UTC"),
    "started": pl.Datetime("us", "UTC"),
    "ended": pl.Datetime("us", "UTC"),
    "duration_s": pl.Float64(),
    "fingerprint": pl.String(),
    "signature": pl.String(),
    "summary": pl.String(),
    "error": pl.String(),
    "confidence": pl.Float64(),
    "findings": pl.Int64(),
    "ranks": pl.Int64(),
    "hosts": pl.List(pl.String()),
    "failed_hosts": pl.List(pl.String()),
    "files": pl.Int64(),
    "bytes": pl.Int64(),
    "modified": pl.Datetime("us", "UTC"),  # newest input file
    "report_html": pl.String(),  # relative to the batch folder
    "report_json": pl.String(),
    "analysis_s": pl.Float64(),
    "cache_key": pl.String(),
}


@dataclass
class BatchResult:
    """One batch: its fleet table, where it was written, and how much of it was analysed now."""

    fleet: pl.DataFrame
    out: Path
    analysed: int = 0
    cached: int = 0
    seconds: float = 0.0
    new_fingerprints: set[str] = field(default_factory=set)
    interrupted: bool = False  # Ctrl-C: the table and index hold the runs finished before it
    total: int = 0  # runs asked for (the table may hold fewer when interrupted)

    def to_json(self) -> dict[str, Any]:
        """The batch as JSON (schema `forensics.batch/v1`): one object per fleet row, times as ISO 8601."""
        rows = [
            {k: (iso(v) if isinstance(v, datetime) else v) for k, v in row.items()}
            for row in self.fleet.iter_rows(named=True)
        ]
        return {
            "schema": BATCH_SCHEMA,
            "out": str(self.out),
            "runs": self.total,
            "analysed": self.analysed,
            "cached": self.cached,
            "interrupted": self.interrupted,
            "new_fingerprints": sorted(self.new_fingerprints),
            "rows": rows,
        }
