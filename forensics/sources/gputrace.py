"""What the two GPU trace readers (Nsight Systems SQLite, Kineto JSON) both produce: one summary per device.

Times are integer nanoseconds. The breakdown is exclusive so that it adds up to the span: `compute` is
the union of compute kernels; `communication` the NCCL time not hidden under compute (exposed); `memory`
the memcpy/memset time under neither; `idle` the rest. `overlap` is the NCCL time that ran under compute.
Kernel classes follow HTA (hta/common/types.py), with NCCL >= 2.19's `ncclDevKernel_*` names as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from forensics.model import iso
from forensics.sources.base import Sink

COMPUTE = "compute"
COMMUNICATION = "communication"
MEMORY = "memory"
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)")
RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
TOP_KERNELS = 10
TOP_GAPS = 5
SLOWEST_NCCL = 5


def is_nccl_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


def nccl_op(name: str) -> str:
    """The collective in a NCCL kernel name (`AllReduce` from both namings); the name itself otherwise."""
    m = NCCL_KERNEL.match(name)
    return m["op"] if m else name.split("(", 1)[0]


def rank_from_file_name(rel: str) -> int | None:
    m = RANK_IN_NAME.search(rel.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def _ms(ns: float | int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _us(ns: float | int | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 2)


@dataclass
class KernelStat:
    name: str
    cls: str
    count: int
    total_ns: int
    max_ns: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "class": self.cls,
            "count": self.count,
            "total_ms": _ms(self.total_ns),
            "mean_us": _us(self.total_ns / self.count) if self.count else None,
            "max_us": _us(self.max_ns),
        }


@dataclass
class NcclStat:
    op: str
    count: int
    total_ns: int
    median_ns: int
    max_ns: int

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "count": self.count,
            "total_ms": _ms(self.total_ns),
            "median_us": _us(self.median_ns),
            "max_us": _us(self.max_ns),
        }


@dataclass
class DeviceTrace:
    """Where one GPU's time went during the profiled window."""

    file: str
    source: str  # nsys | kineto
    device: int
    rank: int | None
    host: str | None
    start: datetime | None  # wall clock of the first GPU activity, when the trace says it
    span_ns: int  # first GPU activity to last
    busy_ns: int  # union of every kernel, memcpy and memset
    compute_ns: int  # union of compute kernels
    comm_ns: int  # union of NCCL kernels
    memory_ns: int  # union of memcpy and memset
    kernels_ns: int  # union of compute and NCCL kernels
    kernel_count: int
    nccl_count: int
    nccl_median_ns: int | None
    steps: int | None = None  # ProfilerStep#N windows, when the trace has them
    top_kernels: list[KernelStat] = field(default_factory=list)
    nccl_ops: list[NcclStat] = field(default_factory=list)
    slowest_nccl: list[dict[str, Any]] = field(default_factory=list)  # op, offset_ms, us
    idle_gaps: list[tuple[int, int]] = field(default_factory=list)  # (offset from start, length) ns

    @property
    def overlap_ns(self) -> int:
        return max(0, self.compute_ns + self.comm_ns - self.kernels_ns)

    @property
    def comm_exposed_ns(self) -> int:
        return max(0, self.kernels_ns - self.compute_ns)

    @property
    def memory_exposed_ns(self) -> int:
        return max(0, self.busy_ns - self.kernels_ns)

    @property
    def idle_ns(self) -> int:
        return max(0, self.span_ns - self.busy_ns)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"{self.file} GPU {self.device}"

    def per_step_ns(self, value: int) -> float:
        return value / self.steps if self.steps else float(value)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "source": self.source,
            "label": self.label,
            "rank": self.rank,
            "device": self.device,
            "host": self.host,
            "start": iso(self.start),
            "steps": self.steps,
            "span_ms": _ms(self.span_ns),
            "busy_ms": _ms(self.busy_ns),
            "compute_ms": _ms(self.compute_ns),
            "communication_ms": _ms(self.comm_ns),
            "memory_ms": _ms(self.memory_ns),
            "breakdown_ms": {
                COMPUTE: _ms(self.compute_ns),
                COMMUNICATION: _ms(self.comm_exposed_ns),
                MEMORY: _ms(self.memory_exposed_ns),
                "idle": _ms(self.idle_ns),
            },
            "overlap_ms": _ms(self.overlap_ns),
            "overlap_pct": round(100 * self.overlap_ns / self.comm_ns, 1) if self.comm_ns else None,
            "kernels": self.kernel_count,
            "nccl_kernels": self.nccl_count,
            "nccl_latency_ms": _ms(self.nccl_median_ns),
            "top_kernels": [k.to_json() for k in self.top_kernels],
            "nccl": [n.to_json() for n in self.nccl_ops],
            "slowest_nccl": self.slowest_nccl,
            "idle_gaps": [{"offset_ms": _ms(o), "ms": _ms(d)} for o, d in self.idle_gaps],
        }


@dataclass
class TraceFile:
    """One trace file: its devices and the file-wide tables (NVTX ranges, CUDA API calls)."""

    file: str
    source: str
    rank: int | None
    devices: list[DeviceTrace]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "source": self.source,
            "rank": self.rank,
            "devices": [d.to_json() for d in self.devices],
            **self.tables,
        }


EXTRAS_KEY = "gpu_trace"  # FileResult.extras[EXTRAS_KEY] holds the file's TraceFile


def record_samples(sink: Sink, devices: list[DeviceTrace]) -> None:
    """The breakdown as series rows (ms over the trace, by rank), so ranks and times count like any metric."""
    for d in devices:
        if d.rank is None:
            continue
        values = {
            "trace/compute_ms": d.compute_ns,
            "trace/communication_ms": d.comm_ns,
            "trace/memory_ms": d.memory_ns,
            "trace/idle_ms": d.idle_ns,
            "trace/nccl_latency_ms": d.nccl_median_ns,
        }
        for metric, ns in values.items():
            if ns is not None:
                sink.sample(metric, ns / 1e6, source=d.source, rank=d.rank, ts=d.start)
