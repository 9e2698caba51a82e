"""The host: Ray's memory-monitor numbers for a host OOM, and what a kill without a reason leaves to read."""

from __future__ import annotations

import polars as pl

from forensics.analyses.explain.context import Reading
from forensics.model import Finding

SIGKILL_SENDERS = (
    "SIGKILL comes from outside the process - the kernel OOM killer, a scheduler's memory or time limit, or an "
    "operator - and leaves no traceback; these logs do not say which: read the host's kernel log (dmesg)."
)
TERMINATION = (
    "A process ended by SIGTERM or SIGABRT, stopped by its launcher or gone from under its executor usually "
    "follows another failure: launchers terminate the other ranks once one has failed, the NCCL watchdog and an "
    "uncaught C++ exception abort the process, a scheduler terminates a job at its time limit. Nothing earlier in "
    "these logs says which: read the failed rank's own stderr and the scheduler's records."
)


def explain_process_killed(finding: Finding, reading: Reading) -> None:
    """A kill with no cause in the logs: who sends such a signal, and the host memory the run reported, if any."""
    if finding.rule != "process-sigkill":
        finding.explanation = TERMINATION
        return
    finding.explanation = SIGKILL_SENDERS
    series = reading.series
    host = (
        series.filter(pl.col("metric").cat.ends_with("cpu_memory_used_gb") & pl.col("value").is_finite())
        if not series.is_empty()
        else series
    )
    if host.is_empty():
        return
    last = host.sort("step", nulls_last=True).row(-1, named=True)
    top = host["value"].max()
    finding.explanation = (
        f"No out-of-memory line in these logs, but host memory in use (perf/cpu_memory_used_gb, node-wide) "
        f"reached {top:.1f} GB (last logged {last['value']:.1f} GB at step {last['step']}): compare it with the "
        "node's RAM; a SIGKILL near the limit is the OOM killer's."
    )


def explain_host_oom(finding: Finding, reading: Reading) -> None:
    """Ray's memory monitor numbers: how full the node was, against which threshold, and whom it killed."""
    f = finding.fields
    finding.host = finding.host or f.get("node_ip")
    if f.get("node_used_gb") and f.get("node_total_gb"):
        node = f" {f['node_ip']}" if f.get("node_ip") else ""
        text = f"The node{node} used {f['node_used_gb']} GB of {f['node_total_gb']} GB"
        if f.get("threshold") or f.get("threshold_pct"):
            limit = f["threshold"] if f.get("threshold") else f"{f['threshold_pct']}% of its memory"
            text += f", above Ray's kill threshold of {limit} (RAY_memory_usage_threshold)"
        if f.get("killed_task"):
            text += f"; Ray killed {f['killed_task']} (pid {f.get('killed_pid')}, {f.get('killed_used_gb')} GB)"
        finding.explanation = text + "."
