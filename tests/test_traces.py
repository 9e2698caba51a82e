"""Kineto traces captured on 2 H200s (DDP, torch.profiler, trimmed to steps 5-6): breakdown and straggler verdict."""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from forensics.analyses.traces import find_straggler, rank_units
from forensics.discover import discover
from forensics.model import Analysis
from forensics.pipeline import analyze
from forensics.report.html import render_html
from forensics.sources.base import FileResult, Sink
from forensics.sources.gputrace import EXTRAS_KEY
from forensics.sources.kineto import FILE_SOURCES

TRACES = Path(__file__).parent / "fixtures" / "traces"
READ = FILE_SOURCES[0].read


@pytest.fixture(scope="module")
def slow_rank() -> Analysis:
    return analyze([TRACES / "trace_slow_rank"])


def _union(intervals: list[tuple[float, float]]) -> float:
    total, cur = 0.0, None
    for s, e in sorted(intervals):
        if cur is None or s > cur[1]:
            total += cur[1] - cur[0] if cur else 0.0
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0.0)


def _trace_file(scenario: str, rank: int) -> Path:
    (path,) = (TRACES / scenario).glob(f"rank{rank}.*.pt.trace.json.gz")
    return path


@functools.cache
def _read(scenario: str, rank: int) -> FileResult:
    path = _trace_file(scenario, rank)
    return READ(path, path.name, Sink())


def test_reader_matches_a_plain_json_reading_of_the_same_file():
    path = _trace_file("trace_slow_rank", 1)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ns = [(round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000), e) for e in gpu]
    kernels = [(s, e) for s, e, ev in ns if ev["cat"] == "kernel"]
    nccl = [(s, e) for s, e, ev in ns if ev["cat"] == "kernel" and ev["name"].startswith("nccl")]
    compute = [(s, e) for s, e, ev in ns if ev["cat"] == "kernel" and not ev["name"].startswith("nccl")]
    everything = [(s, e) for s, e, _ in ns]

    result = _read("trace_slow_rank", 1)
    assert result.warnings == []
    (device,) = result.extras[EXTRAS_KEY].devices
    assert (device.rank, device.device, device.steps) == (1, 1, 2)
    assert device.kernel_count == len(kernels) and device.nccl_count == len(nccl) == 12
    assert device.compute_ns == _union(compute)
    assert device.comm_ns == _union(nccl)
    assert device.busy_ns == _union(everything)
    assert device.span_ns == max(e for _, e in everything) - min(s for s, _ in everything)
    first = min(s for s, _ in everything)
    assert device.start == datetime.fromtimestamp((doc["baseTimeNanoseconds"] + first) / 1e9, tz=timezone.utc)
    ((op, count),) = {(n.op, n.count) for n in device.nccl_ops}
    assert (op, count) == ("AllReduce", 12)  # torch's `allreduce` (kernel args) in NCCL's spelling
    assert result.environment["nccl_version"] == "2.28.9"


def test_slow_rank_capture_names_rank_1_from_traces_alone(slow_rank: Analysis):
    a = slow_rank
    st = a.traces["straggler"]
    assert st["rank"] == 1 and st["basis"] == "per step" and st["rule"] == "trace-straggler"
    assert st["compute_faster_pct"] > 3 * st["host_faster_pct"]  # rank 1 runs 30 extra 8192² matmuls a step
    (heavy, *_) = st["heavier_kernels"]
    assert heavy["name"].startswith("nvjet_sm90") and heavy["extra_calls"] == 30  # the matmuls, 30 a step
    (finding,) = [f for f in a.findings if f.cls == "straggler"]
    assert (finding.rank, finding.severity, finding.rule) == (1, "warning", "trace-straggler")
    assert finding.evidence[0].file.startswith("rank1.") and "compute 73." in finding.evidence[0].text
    assert finding.evidence[1].file.startswith("rank0.") and "NCCL 69." in finding.evidence[1].text
    assert a.verdict.status == "degraded" and a.verdict.root_cause is finding
    assert finding.explanation.startswith("The job would be 53% faster without rank 1's lateness: 87.8 -> 41.3")
    assert a.environment["nccl_latency_ms"] == pytest.approx(3.8, abs=0.1)


def test_healthy_capture_names_no_straggler():
    a = analyze([TRACES / "trace_healthy"])
    assert a.traces["straggler"] is None
    # rank 1's host is a few ms late each step (launch skew): it shows in the what-if, below the finding's bar
    assert a.traces["what_if"]["worst"]["rank"] == 1 and 10 < a.traces["what_if"]["worst"]["host_faster_pct"] < 25
    assert [d["label"] for d in a.traces["devices"]] == ["rank 0", "rank 1"]
    assert a.findings == [] and a.verdict.status == "healthy"
    ratio = a.traces["devices"][0]["compute_ms"] / a.traces["devices"][1]["compute_ms"]
    assert 0.9 < ratio < 1.2


def test_straggler_needs_the_others_to_wait():
    """More compute on one rank that the others do not wait for (no NCCL rise) is not a straggler."""
    units, _ = rank_units([_read("trace_slow_rank", rank).extras[EXTRAS_KEY] for rank in (0, 1)])
    assert find_straggler(units).unit.rank == 1
    no_wait = [replace(units[0], comm_ns=units[1].comm_ns), units[1]]
    assert find_straggler(no_wait) is None


def test_trace_without_rank_warns_and_is_never_rank_0(tmp_path: Path):
    text = gzip.decompress(_trace_file("trace_healthy", 0).read_bytes()).decode()
    start = text.index('"distributedInfo"')
    text = text[:start] + text[text.index("\n", start) + 1 :]
    anonymous = tmp_path / "host_123.456.pt.trace.json"
    anonymous.write_text(text)
    result = READ(anonymous, anonymous.name, Sink())
    assert result.extras[EXTRAS_KEY].rank is None and result.extras[EXTRAS_KEY].devices[0].rank is None
    assert "no distributedInfo.rank; its rank is unknown" in result.warnings[0]
    named = tmp_path / "worker_rank3.pt.trace.json"
    named.write_text(text)
    result = READ(named, named.name, Sink())
    assert result.extras[EXTRAS_KEY].rank == 3 and "taken from the file name" in result.warnings[0]


def test_truncated_gzip_gives_partial_results_and_a_warning(tmp_path: Path):
    data = _trace_file("trace_healthy", 1).read_bytes()
    cut = tmp_path / "rank1.cut.pt.trace.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    result = READ(cut, cut.name, Sink())
    assert result.warnings and "rank1.cut.pt.trace.json.gz" in result.warnings[0]
    assert "ends inside" in " ".join(result.warnings) or "reading stopped early" in " ".join(result.warnings)


def test_discovery_and_html_report(slow_rank: Analysis):
    run = discover([TRACES / "trace_slow_rank"])
    assert {f.kind for f in run.files} == {"kineto_trace"}
    html = render_html(slow_rank)
    assert "Straggler: rank 1" in html and 'id="plot-traces-breakdown"' in html and 'id="plot-traces-what-if"' in html
    assert "Without rank 1's lateness" in html and "<strong>41.342 ms, 53% faster</strong>" in html
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL" in html  # the NCCL kernel in the top-kernels table
