"""What the two GPU trace readers (Nsight Systems SQLite, Kineto JSON) both produce: one summary per device.

Times are integer nanoseconds. The breakdown is exclusive so that it adds up to the span: `compute` is
the union of compute kernels; `communication` the NCCL time not hidden under compute (exposed); `memory`
the memcpy/memset time under neither; `idle` the rest. `overlap` is the NCCL time that ran under compute.
Which kernels are communication is data (`kernel_classes.yaml`: NCCL of both namings, DeepEP, NVSHMEM, custom
all-reduces); collective names are normalised (`allreduce` from the kernel's args and `AllReduce` from its name
are one collective). Each device also keeps a `SyncTimeline`, the input of the what-if (analyses/whatif.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from forensics.model import iso
from forensics.sources.base import Sink

COMPUTE = "compute"
COMMUNICATION = "communication"
MEMORY = "memory"
RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
TOP_KERNELS = 10
TOP_GAPS = 5
SLOWEST_NCCL = 5
KERNEL_CLASSES = Path(__file__).with_name("kernel_classes.yaml")
# torch's collective names (`Collective name`, `_allgather_base`, ...) and NCCL's kernel names, one spelling each
COLLECTIVES = {
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reducescatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "alltoall": "AllToAll",
    "alltoallv": "AllToAll",
    "sendrecv": "SendRecv",
    "send": "Send",
    "recv": "Recv",
    "reduce": "Reduce",
    "gather": "Gather",
    "scatter": "Scatter",
    "barrier": "Barrier",
}
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")
_COLLECTIVE_NOISE = re.compile(r"_?(?:base|into_tensor|tensor|coalesced)\b|_")


@dataclass(frozen=True)
class CommKernels:
    """The communication-kernel patterns: one regex for "is it communication", and the op of each pattern."""

    patterns: tuple[tuple[str, str | None], ...]  # (regex, fixed op or None when the regex names it)

    @property
    def any_pattern(self) -> str:
        return "|".join(f"(?:{_NAMED_GROUP.sub('(?:', p)})" for p, _ in self.patterns)

    def op(self, name: str) -> str | None:
        for pattern, fixed in self.patterns:
            m = re.search(pattern, name)
            if m:
                return normalise_collective(m.groupdict().get("op") or fixed or name)
        return None


@functools.cache
def comm_kernels() -> CommKernels:
    data = yaml.safe_load(KERNEL_CLASSES.read_text(encoding="utf-8"))
    return CommKernels(tuple((e["pattern"], e.get("op")) for e in data["communication"]))


def normalise_collective(op: str) -> str:
    """`allreduce`, `all_reduce`, `AllReduce`, `_allgather_base` -> NCCL's spelling; other names unchanged."""
    key = _COLLECTIVE_NOISE.sub("", op.strip().lower())
    return COLLECTIVES.get(key, op)


def is_nccl_kernel(name: str) -> bool:
    """Whether the kernel is communication (the name is kept for the NCCL kernels it first meant)."""
    return comm_kernels().op(name) is not None


def nccl_op(name: str) -> str:
    """The collective of a communication kernel (`AllReduce` from both NCCL namings); the name otherwise."""
    return comm_kernels().op(name) or name.split("(", 1)[0]


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
class SyncTimeline:
    """One GPU's activity as the what-if needs it (ns, the trace's clock).

    `lane_*`: the union of its compute and memory activity (every stream). `coll_*`: its communication kernels
    in start order, keyed by process group and their order in it (every rank issues a group's collectives in
    the same order), with `ready` the end of the last compute/memory activity launched before the kernel
    (CUDA correlation ids grow in launch order: the kernel's stream waits for them) and `stream`.
    `steps`: (step number, CPU window start, end) of `ProfilerStep#N`.
    """

    lane_start: np.ndarray
    lane_end: np.ndarray
    coll_group: list[str]
    coll_index: np.ndarray
    coll_start: np.ndarray
    coll_end: np.ndarray
    coll_ready: np.ndarray
    coll_stream: np.ndarray
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    kernel_totals: dict[str, tuple[int, int]] = field(default_factory=dict)  # compute kernel -> (count, ns)

    @property
    def keys(self) -> list[tuple[str, int]]:
        return list(zip(self.coll_group, self.coll_index.tolist(), strict=True))


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged [s, e) intervals of intervals sorted by start."""
    if not starts.size:
        return starts, ends
    reach = np.maximum.accumulate(ends)
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], starts.size) - 1
    return starts[first], reach[last]


def build_timeline(
    lane_s: np.ndarray,
    lane_e: np.ndarray,
    lane_corr: np.ndarray,
    coll_s: np.ndarray,
    coll_e: np.ndarray,
    coll_corr: np.ndarray,
    coll_stream: np.ndarray,
    coll_group: list[str],
    steps: list[tuple[int, int, int]],
    kernel_totals: dict[str, tuple[int, int]],
) -> SyncTimeline:
    """A device's SyncTimeline from its activity sorted by start (corr -1 where unknown)."""
    order = np.argsort(lane_s, kind="stable")
    lane_start, lane_end = _union(lane_s[order], lane_e[order])
    ready = coll_s.copy()
    known = lane_corr >= 0
    if known.any() and coll_s.size:
        by_corr = np.argsort(lane_corr[known], kind="stable")
        corr_sorted = lane_corr[known][by_corr]
        reach = np.maximum.accumulate(lane_e[known][by_corr])
        before = np.searchsorted(corr_sorted, coll_corr) - 1
        has = (before >= 0) & (coll_corr >= 0)
        ready = np.where(has, np.minimum(reach[np.maximum(before, 0)], coll_s), coll_s)
    index = np.zeros(coll_s.size, dtype=np.int64)
    seen: dict[str, int] = {}
    for i, g in enumerate(coll_group):
        index[i] = seen.get(g, 0)
        seen[g] = index[i] + 1
    return SyncTimeline(
        lane_start, lane_end, coll_group, index, coll_s, coll_e, ready, coll_stream, steps, kernel_totals
    )


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
    timeline: SyncTimeline | None = field(default=None, repr=False)  # for the what-if; not in the JSON

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
