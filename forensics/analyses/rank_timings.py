"""One measurement, once per rank, far apart: the per-rank timing tables people print to find a straggler.

The rows come from sources/rank_measurements.py. Rows of one table have the same text and the same other
numbers (step, size, iteration count) and come close together in one file, each rank once. When a
measurement (a time or a bandwidth) differs by SPREAD times or more between the ranks of such a table, the
ranks do not run in step. Which end is the straggler depends on what was timed: a rank's own compute is
longest on the slow rank, while a collective's time is shortest on the rank that arrived last (the others
waited for it in the collective). The finding says so rather than guess.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import polars as pl

from forensics.catalogue import Detection
from forensics.model import Evidence
from forensics.sources.rank_measurements import KIND

SPREAD = 4.0  # max / min of one measurement across the ranks of a table
MIN_RANKS = 3  # with two ranks a spread is as likely one rank's start-up as the other's slowness
MAX_GAP_LINES = 50  # rows of one table further apart than this belong to different tables
COLLECTIVE = re.compile(
    r"(?i)all[_-]?reduce|all[_-]?gather|reduce[_-]?scatter|broadcast|all[_-]?to[_-]?all|\bbarrier\b|collective|\bnccl\b"
)


@dataclass
class _Table:
    file: str
    template: str
    shared: tuple[str, ...]
    rows: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> measurements
    rates: set[str] = field(default_factory=set)  # the measurements that are bandwidths (higher is faster)
    evidence: list[Evidence] = field(default_factory=list)
    first_line: int = 0
    last_line: int = 0
    order: int = 0

    def takes(self, rank: int, line: int) -> bool:
        return rank not in self.rows and line - self.last_line <= MAX_GAP_LINES


def _tables(events: pl.DataFrame) -> list[_Table]:
    rows = events.filter((pl.col("kind") == KIND) & pl.col("rank").is_not_null()).sort(["file", "line"])
    open_tables: dict[tuple[str, str, tuple[str, ...]], _Table] = {}
    done: list[_Table] = []
    for row in rows.iter_rows(named=True):
        fields = json.loads(row["fields"] or "{}")
        key = (row["file"], fields.get("template", ""), tuple(fields.get("shared", [])))
        table = open_tables.get(key)
        if table is None or not table.takes(row["rank"], row["line"]):
            if table is not None:
                done.append(table)
            table = open_tables[key] = _Table(*key, first_line=row["line"], order=len(done) + len(open_tables))
        table.rows[row["rank"]] = fields.get("measures", {})
        table.rates.update(fields.get("rates", []))
        table.last_line = row["line"]
        table.evidence.append(Evidence(row["file"], row["line"], row["message"]))
    return [*done, *open_tables.values()]


def _widest(table: _Table) -> tuple[str, float, dict[int, float]] | None:
    """The measurement that differs most across the table's ranks: (label, max/min, value by rank); a time
    before a bandwidth derived from it."""
    best = None
    labels = {label for measures in table.rows.values() for label in measures}
    for label in sorted(labels, key=lambda lb: (lb in table.rates, lb)):
        values = {r: m[label] for r, m in table.rows.items() if label in m}
        if len(values) < MIN_RANKS or min(values.values()) <= 0:
            continue
        spread = max(values.values()) / min(values.values())
        if spread >= SPREAD and (best is None or spread > best[1] * 1.5):
            best = (label, spread, values)
    return best


def rank_timing_spread(events: pl.DataFrame, file_order: dict[str, int]) -> list[Detection]:
    """The per-rank table whose ranks differ most in one measurement, when they differ SPREAD times or more."""
    if events.is_empty():
        return []
    found = [(t, w) for t in _tables(events) if (w := _widest(t)) is not None]
    if not found:
        return []
    table, (label, spread, values) = max(found, key=lambda tw: tw[1][1])
    rate = label in table.rates
    slowest = (min if rate else max)(values, key=lambda r: values[r])  # the most time taken
    quickest = (max if rate else min)(values, key=lambda r: values[r])
    listed = ", ".join(f"rank {r}: {v:.4g}" for r, v in sorted(values.items()))
    what = (
        f"One {'rate' if rate else 'time'} printed once per rank ({label}) differs {spread:.1f}x across "
        f"{len(values)} ranks ({listed}): the ranks do not run in step."
    )
    rank = quickest if COLLECTIVE.search(table.template) else None
    if rank is not None:
        why = (
            f"It times a collective, which ends on every rank at once: rank {rank}, with the least time in it, "
            f"arrived last and the others waited for it. Rank {rank} is the straggler."
        )
    else:
        why = (
            f"If it measures a rank's own work, rank {slowest} is the slow one; if it measures a collective, rank "
            f"{quickest} arrived last and the others waited for it."
        )
    explanation = f"{what} {why}"
    return [
        Detection(
            id="rank-timing-spread",
            explanation=explanation,
            fields={
                "measure": label,
                "spread": round(spread, 1),
                "values": values,
                "slowest": slowest,
                "quickest": quickest,
            },
            evidence=table.evidence[:5],
            order=(file_order.get(table.file, 0), table.first_line, 0),
            count=len(table.rows),
            rank=rank,
        )
    ]
