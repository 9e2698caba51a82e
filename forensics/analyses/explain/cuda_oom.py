"""CUDA out of memory: what the numbers of the message say, and how earlier steps used memory.

The rule `cuda-oom` extracts the message's numbers (requested, capacity, free, PyTorch's allocated and
reserved-but-unused memory, this and other processes' memory; current, 2.1-2.3 and pre-2.0 wordings); they
tell true exhaustion from fragmentation and from memory held outside PyTorch. The run's per-step peaks say
whether it built up (a leak) or came at once (a spike).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from forensics.analyses.explain.context import Reading
from forensics.analyses.explain.text import promote
from forensics.model import Finding
from forensics.units import fmt_gib, size_gib


@dataclass
class OomBudget:
    """The numbers of one CUDA OOM message, in GiB (None where the message does not say)."""

    tried: float
    capacity: float | None = None
    free: float | None = None
    allocated: float | None = None  # by PyTorch tensors
    unused_reserved: float | None = None  # reserved by PyTorch's cache but not allocated
    this_process: float | None = None  # the process's total use, PyTorch or not
    this_process_inferred: bool = False
    others: float = 0.0  # other processes on the same GPU
    gpu: int | None = None

    @property
    def outside_allocator(self) -> float | None:
        """GPU memory in use that PyTorch's allocator does not hold (CUDA context, NCCL, other processes)."""
        if None in (self.capacity, self.free, self.allocated):
            return None
        return max(0.0, self.capacity - self.free - self.allocated - (self.unused_reserved or 0.0))


CONTEXT_OVERHEAD_GIB = 2.0
OTHER_PROCESS = re.compile(r"Process \d+ has (?P<size>[\d.]+ ?[KMGT]?i?B) memory in use")


def oom_budget(fields: dict[str, Any]) -> OomBudget | None:
    """The budget the rule's extracted fields describe; None without a requested size."""
    tried = size_gib(fields.get("tried"))
    if tried is None:
        return None
    gpu = fields.get("gpu")
    budget = OomBudget(
        tried=tried,
        capacity=size_gib(fields.get("capacity")),
        free=size_gib(fields.get("free")),
        allocated=size_gib(fields.get("allocated")),
        unused_reserved=size_gib(fields.get("reserved_unallocated")),
        this_process=size_gib(fields.get("process_in_use")),
        gpu=int(gpu) if isinstance(gpu, str) and gpu.isdigit() else None,
    )
    total_reserved = size_gib(fields.get("reserved_total"))  # pre-2.0: reserved in all, allocated included
    if total_reserved is not None and budget.allocated is not None:
        budget.unused_reserved = max(0.0, total_reserved - budget.allocated)
    others = [g for m in OTHER_PROCESS.finditer(str(fields.get("other_processes", ""))) if (g := size_gib(m["size"]))]
    if budget.this_process is None and others and budget.allocated is not None:
        # In a container NVML shows this process under its host pid, as "Process N"; the one entry that
        # holds at least PyTorch's reserved memory is most likely this process.
        reserved = budget.allocated + (budget.unused_reserved or 0.0)
        own = max(others)
        if own >= reserved * 0.98:
            others.remove(own)
            budget.this_process, budget.this_process_inferred = own, True
    budget.others = sum(others)
    return budget


def oom_case(b: OomBudget) -> str:
    """exhaustion | fragmentation | other_process | outside_pytorch | refused_while_free.

    The lever that alone would have made the request fit; `refused_while_free` when the GPU had the memory
    when the message was written (a per-process limit, or another process allocating at the same time).
    """
    if b.free is None:
        return "exhaustion"
    shortfall = b.tried - b.free
    if shortfall <= 0:
        return "refused_while_free"
    reserved = (b.allocated or 0.0) + (b.unused_reserved or 0.0)
    outside = b.this_process - reserved if b.this_process is not None else 0.0
    outside -= max(CONTEXT_OVERHEAD_GIB, 0.03 * (b.capacity or 0.0))  # CUDA context, cuBLAS, NCCL: always there
    levers = {
        "fragmentation": b.unused_reserved or 0.0,
        "other_process": b.others,
        "outside_pytorch": outside,
    }
    covering = {k: v for k, v in levers.items() if v >= max(shortfall, 0.25)}
    return max(covering, key=lambda k: covering[k]) if covering else "exhaustion"


EXHAUSTION = "True exhaustion: the tensors of this step do not fit; make the step smaller."
OOM_PROMOTE = {
    "exhaustion": "ppo_micro_batch_size_per_gpu",
    "fragmentation": "expandable_segments",
    "other_process": "gpu_memory_utilization",
    "outside_pytorch": "gpu_memory_utilization",
    "refused_while_free": "gpu_memory_utilization",
}


def _oom_text(b: OomBudget, case: str) -> str:
    gpu = f"GPU {b.gpu}" if b.gpu is not None else "the GPU"
    parts = [f"Asked for {fmt_gib(b.tried)}"]
    if b.free is not None and b.capacity is not None:
        parts[0] += f" with {fmt_gib(b.free)} free of {fmt_gib(b.capacity)} on {gpu}"
    facts = []
    if b.allocated is not None:
        facts.append(f"PyTorch tensors held {fmt_gib(b.allocated)}")
    if b.unused_reserved is not None:
        facts.append(f"its cache a further {fmt_gib(b.unused_reserved)} reserved but unused")
    if b.this_process is not None and b.allocated is not None:
        outside = b.this_process - b.allocated - (b.unused_reserved or 0.0)
        who = "this process (seen by the driver under its host pid)" if b.this_process_inferred else "this process"
        facts.append(f"{who} used {fmt_gib(b.this_process)} in all, {fmt_gib(max(outside, 0.0))} of it outside PyTorch")
    if b.others:
        facts.append(f"other processes on the GPU held {fmt_gib(b.others)}")
    text = parts[0] + (": " + "; ".join(facts) if facts else "") + ". "
    if b.capacity and b.tried >= 0.1 * b.capacity:
        text += f"One request of {100 * b.tried / b.capacity:.0f}% of the GPU means a large micro-batch or sequence. "
    return (
        text
        + {
            "exhaustion": EXHAUSTION,
            "fragmentation": (
                "Fragmentation: the cache holds enough free memory, but not in one piece; "
                "expandable segments let it be reused."
            ),
            "other_process": (
                "Memory held by another process on the same GPU (a colocated rollout engine or a leftover process): "
                "give training more of the GPU."
            ),
            "outside_pytorch": (
                "Memory held outside PyTorch's allocator in this process (the colocated rollout engine's weights "
                "and KV cache when it is not put to sleep, NCCL buffers, CUDA context): free it before the update."
            ),
            "refused_while_free": (
                "The GPU had that much free memory when the message was written, so the allocation was refused by a "
                "per-process limit (set_per_process_memory_fraction) or lost to another process allocating at the "
                "same moment (a colocated rollout engine waking up)."
            ),
        }[case]
    )


def _step_peaks(series: pl.DataFrame) -> pl.DataFrame:
    """verl's perf/max_memory_allocated_gb per step (max over ranks and sources), in step order."""
    if series.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "value": pl.Float64})
    return (
        series.filter(
            pl.col("metric").cat.ends_with("max_memory_allocated_gb")
            & pl.col("value").is_finite()
            & pl.col("step").is_not_null()
        )
        .group_by("step")
        .agg(pl.col("value").max())
        .sort("step")
    )


def memory_trend(peaks: pl.DataFrame) -> str | None:
    """growing: the per-step peak rises step after step (a leak); None when it does not."""
    if peaks.height < 4:
        return None
    values = peaks["value"].to_list()
    top = max(values)
    rises = sum(1 for a, b in itertools.pairwise(values) if b > a + 0.01 * top)
    if rises >= 0.7 * (len(values) - 1) and values[-1] - values[0] >= max(1.0, 0.2 * top):
        return "growing"
    return None


def _peak_text(peaks: pl.DataFrame, budget: OomBudget) -> tuple[str, str | None]:
    """How the earlier steps used memory: a steady rise (leak), a sudden jump (spike), or how close they came."""
    if peaks.is_empty():
        return "", None
    first, last = peaks.row(0, named=True), peaks.row(-1, named=True)
    top = peaks.sort("value", descending=True).row(0, named=True)
    trend = memory_trend(peaks)
    if trend == "growing":
        per_step = (last["value"] - first["value"]) / max(1, last["step"] - first["step"])
        return (
            f" The peak allocated memory (perf/max_memory_allocated_gb) grew step after step, from "
            f"{first['value']:.2f} GB at step {first['step']} to {last['value']:.2f} GB at step {last['step']} "
            f"(+{per_step:.2f} GB per step): memory leaks - something keeps tensors alive from one step to the next.",
            "leak",
        )
    if budget.allocated and top["value"] < 0.5 * budget.allocated:
        return (
            f" Earlier steps peaked at {top['value']:.2f} GB (step {top['step']}); the failing step needed far more: "
            "a spike - an unusually long sequence or a larger micro-batch - not a slow growth.",
            "spike",
        )
    text = f" Before failing, the peak allocated memory over {peaks.height} logged step(s) was {top['value']:.2f} GB"
    text += f" at step {top['step']}"
    if budget.capacity:
        text += f" ({100 * top['value'] / budget.capacity:.0f}% of {budget.capacity:.2f} GiB)"
    return text + ".", None


def explain_cuda_oom(finding: Finding, reading: Reading) -> None:
    """The OOM budget, its case, and (unless a detector already tells it) how earlier steps used memory."""
    budget = oom_budget(finding.fields)
    if budget is None:
        if any("cumem_allocator" in e.text for e in finding.evidence):
            finding.fields["oom_case"] = "rollout_wake_up"
            finding.explanation = (
                "vLLM's sleep-mode allocator (cumem) could not map the rollout engine's memory back when it woke "
                "up: the trainer's weights, gradients or optimizer state still occupy the GPU at that moment."
            )
            finding.remediation = promote(finding.remediation, "gpu_memory_utilization")
        return
    case = oom_case(budget)
    finding.fields["oom_case"] = case
    history, trend = _peak_text(_step_peaks(reading.series), budget)
    text = _oom_text(budget, case)
    if trend == "leak" and case == "exhaustion":
        text = text.replace(EXHAUSTION, "True exhaustion, built up over the run rather than by this step.")
    finding.explanation = text + (history if reading.quotes_history(finding) else "")
    finding.remediation = promote(finding.remediation, OOM_PROMOTE[case])
    if trend:
        finding.fields["memory_trend"] = trend
    if trend == "leak":
        finding.remediation = promote(finding.remediation, "grows from step to step")
