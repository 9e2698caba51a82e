"""GPU traces across ranks: where the time went per rank, and which rank the others wait for.

In synchronous data parallelism every rank's collective ends together, so a rank that arrives late makes
the others sit in NCCL kernels: their NCCL time grows by about the time the straggler spends on extra
work. The verdict needs both halves — one rank's compute per step exceeds the others' by a clear margin
*and* the others' NCCL time rises by a comparable amount — so a balanced run (or one where everybody is
slow) names nobody. Launch skew alone (one host a few ms late each step, GPU idle rather than busy) is
common on healthy runs too (seen on our 2-GPU captures): it shows in the breakdown, not as a finding.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from forensics.catalogue import Detection
from forensics.model import Evidence
from forensics.sources.gputrace import EXTRAS_KEY, DeviceTrace, TraceFile

RULE_ID = "trace-straggler"
REL_MARGIN = 0.2  # the straggler's extra compute: at least this fraction of the others' ...
ABS_MARGIN_NS = 1_000_000  # ... and at least 1 ms per step (or over the window when there are no steps)
WAIT_SHARE = 0.5  # the others' extra NCCL time must cover at least half of the straggler's extra compute


def rank_units(files: list[TraceFile]) -> tuple[list[DeviceTrace], list[str]]:
    """The devices to compare: one per rank when ranks are known (else every device), with warnings."""
    devices = [d for f in files for d in f.devices]
    ranked = [d for d in devices if d.rank is not None]
    if not ranked:
        return devices, []
    by_rank: dict[int, DeviceTrace] = {}
    warnings = []
    for d in ranked:
        kept = by_rank.get(d.rank)  # type: ignore[arg-type]
        if kept is not None:
            warnings.append(f"rank {d.rank} has several traces ({kept.file}, {d.file}); the longest is compared")
        if kept is None or d.span_ns > kept.span_ns:
            by_rank[d.rank] = d  # type: ignore[index]
    return [by_rank[r] for r in sorted(by_rank)], warnings


def _basis(units: list[DeviceTrace]) -> str:
    return "per step" if units and all(u.steps for u in units) else "over the window"


def _per(u: DeviceTrace, value: int, basis: str) -> float:
    return u.per_step_ns(value) if basis == "per step" else float(value)


@dataclass
class Straggler:
    """The rank the others wait for, with the numbers that show it (ns, per step or over the window)."""

    unit: DeviceTrace
    basis: str
    own_compute: float
    others_compute: float
    own_nccl: float
    others_nccl: float

    @property
    def excess(self) -> float:
        return self.own_compute - self.others_compute

    @property
    def wait(self) -> float:
        return self.others_nccl - self.own_nccl

    def explanation(self) -> str:
        unit = "ms per step" if self.basis == "per step" else "ms over the profiled window"
        return (
            f"{self.unit.label} computes {self.excess / 1e6:.1f} {unit} longer than the others "
            f"({self.own_compute / 1e6:.1f} vs {self.others_compute / 1e6:.1f}); the others spend "
            f"{self.wait / 1e6:.1f} {unit} more in NCCL kernels ({self.others_nccl / 1e6:.1f} vs "
            f"{self.own_nccl / 1e6:.1f}): they wait for it in every collective."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.unit.label,
            "rank": self.unit.rank,
            "file": self.unit.file,
            "basis": self.basis,
            "own_compute_ms": round(self.own_compute / 1e6, 3),
            "others_compute_ms": round(self.others_compute / 1e6, 3),
            "own_nccl_ms": round(self.own_nccl / 1e6, 3),
            "others_nccl_ms": round(self.others_nccl / 1e6, 3),
            "excess_ms": round(self.excess / 1e6, 3),
            "wait_ms": round(self.wait / 1e6, 3),
            "explanation": self.explanation(),
        }


def find_straggler(units: list[DeviceTrace]) -> Straggler | None:
    """The rank whose extra compute the other ranks wait out in NCCL; None when the ranks are balanced."""
    if len(units) < 2 or not any(u.comm_ns for u in units):
        return None
    basis = _basis(units)
    suspect = max(units, key=lambda u: _per(u, u.compute_ns, basis))
    others = [u for u in units if u is not suspect]
    straggler = Straggler(
        unit=suspect,
        basis=basis,
        own_compute=_per(suspect, suspect.compute_ns, basis),
        others_compute=statistics.median(_per(u, u.compute_ns, basis) for u in others),
        own_nccl=_per(suspect, suspect.comm_ns, basis),
        others_nccl=statistics.median(_per(u, u.comm_ns, basis) for u in others),
    )
    clear = straggler.excess > max(REL_MARGIN * straggler.others_compute, ABS_MARGIN_NS)
    waited = straggler.wait >= WAIT_SHARE * straggler.excess
    return straggler if clear and waited else None


def _evidence_line(u: DeviceTrace, basis: str) -> str:
    unit = f"ms/step over {u.steps} steps" if basis == "per step" else "ms over the profiled window"
    return (
        f"{u.label} ({u.source}, GPU {u.device}): compute {_per(u, u.compute_ns, basis) / 1e6:.2f}, "
        f"NCCL {_per(u, u.comm_ns, basis) / 1e6:.2f}, memory {_per(u, u.memory_exposed_ns, basis) / 1e6:.2f}, "
        f"idle {_per(u, u.idle_ns, basis) / 1e6:.2f} {unit}"
    )


def straggler_detection(s: Straggler, units: list[DeviceTrace], file_order: dict[str, int]) -> Detection:
    ordered = [s.unit] + [u for u in units if u is not s.unit]
    return Detection(
        id=RULE_ID,
        rank=s.unit.rank,
        host=s.unit.host,
        ts=s.unit.start,
        order=(file_order.get(s.unit.file, 0), 0, 0),
        evidence=[Evidence(u.file, 0, _evidence_line(u, s.basis)) for u in ordered],
        fields={k: v for k, v in s.to_json().items() if k not in ("explanation", "label", "rank", "file")},
        explanation=s.explanation(),
    )


def nccl_latency_ms(units: list[DeviceTrace]) -> float | None:
    """The run's typical NCCL kernel time: the median over ranks of each rank's median NCCL kernel."""
    medians = [u.nccl_median_ns for u in units if u.nccl_median_ns is not None]
    return round(statistics.median(medians) / 1e6, 4) if medians else None


@dataclass
class TraceReview:
    """What the traces add to a run's analysis."""

    summary: dict[str, Any] = field(default_factory=dict)  # the report's traces section
    detections: list[Detection] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def review_traces(extras: dict[str, list[Any]], file_order: dict[str, int]) -> TraceReview:
    """The straggler, `nccl_latency_ms` and the per-rank breakdown of the run's GPU traces."""
    files = [f for f in extras.get(EXTRAS_KEY, []) if isinstance(f, TraceFile)]
    if not files:
        return TraceReview()
    units, duplicates = rank_units(files)
    straggler = find_straggler(units)
    latency = nccl_latency_ms(units)
    summary = {
        "basis": _basis(units),
        "compared": [u.label for u in units],
        "devices": [d.to_json() for f in files for d in f.devices],
        "files": [
            {"file": f.file, "source": f.source, "rank": f.rank, **f.tables} for f in files if any(f.tables.values())
        ],
        "straggler": straggler.to_json() if straggler else None,
        "nccl_latency_ms": latency,
    }
    return TraceReview(
        summary=summary,
        detections=[straggler_detection(straggler, units, file_order)] if straggler else [],
        environment={"nccl_latency_ms": latency} if latency is not None else {},
        warnings=duplicates,
    )
