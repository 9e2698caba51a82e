"""Nsight Systems exports of two nsys releases, checked against SQL and Python written here independently."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from forensics.discover import discover
from forensics.pipeline import analyze
from forensics.report.html import render_html
from forensics.report.json_report import to_json_dict
from forensics.sources.base import Sink
from forensics.sources.gputrace import EXTRAS_KEY, TraceFile
from forensics.sources.nsys import FILE_SOURCES

NSYS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus" / "nsys"
EXPORTS = ["perlmutter-cloverleaf-cuda.sqlite", "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"]
SAXPY_TRIMMED = Path(__file__).parent / "fixtures" / "nsys" / "saxpy-mpi-cuda_trimmed.sqlite"
READ = FILE_SOURCES[0].read


@pytest.fixture
def nsys_dir() -> Path:
    if not NSYS.is_dir():
        pytest.skip("the nsys corpus (../shared/corpus/nsys) is not beside this checkout")
    return NSYS


@pytest.fixture
def saxpy() -> Path:
    """The saxpy export: the full one beside the checkout, else the trimmed copy in the repository."""
    full = NSYS / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
    return full if full.is_file() else SAXPY_TRIMMED


def _rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


def _union_length(intervals: list[tuple[int, int]]) -> int:
    """Merge sorted intervals by hand: the reference for the SQL window-function union."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def _summary(path: Path) -> TraceFile:
    result = READ(path, path.name, Sink())
    assert result.warnings == []
    return result.extras[EXTRAS_KEY]


@pytest.mark.parametrize("name", [*EXPORTS, SAXPY_TRIMMED.name])
def test_both_releases_are_summarised_and_match_independent_sums(name: str):
    path = SAXPY_TRIMMED if name == SAXPY_TRIMMED.name else NSYS / name
    if not path.is_file():
        pytest.skip("the nsys corpus (../shared/corpus/nsys) is not beside this checkout")
    trace = _summary(path)
    kernels = _rows(path, 'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')
    copies = _rows(path, 'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY')
    (device,) = trace.devices
    assert trace.rank == device.rank == 0  # PMI_RANK in the captured environment
    assert device.kernel_count == len(kernels)
    assert device.compute_ns == _union_length(kernels)
    assert device.busy_ns == _union_length(kernels + copies)
    assert device.memory_ns == _union_length(copies)
    assert device.span_ns == max(e for _, e in kernels + copies) - min(s for s, _ in kernels + copies)
    assert device.comm_ns == device.nccl_count == 0
    parts = device.to_json()["breakdown_ms"]
    assert sum(parts.values()) == pytest.approx(device.span_ns / 1e6, abs=0.01)
    (top_total,) = _rows(
        path,
        'SELECT SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY demangledName ORDER BY 1 DESC LIMIT 1',
    )[0]
    assert device.top_kernels[0].total_ns == top_total
    gaps = sorted(
        (
            b[0] - a_end
            for a_end, b in zip(_running_ends(kernels + copies), sorted(kernels + copies)[1:], strict=False)
            if b[0] > a_end
        ),
        reverse=True,
    )
    assert [g for _, g in device.idle_gaps] == gaps[: len(device.idle_gaps)]


def _running_ends(intervals: list[tuple[int, int]]) -> list[int]:
    ends, top = [], None
    for _, e in sorted(intervals):
        top = e if top is None else max(top, e)
        ends.append(top)
    return ends


def test_saxpy_tables_nvtx_cuda_api_and_copies(saxpy: Path):
    path = saxpy
    result = READ(path, path.name, Sink())
    trace = result.extras[EXTRAS_KEY]
    assert result.environment["nsys_version"] == "2022.2.1.31"
    assert trace.devices[0].host == "nid001608"
    assert trace.devices[0].kernel_count == 5
    nvtx = {r["name"]: r for r in trace.tables["nvtx"]}
    assert nvtx["MPI_Send"]["count"] == 10 and nvtx["saxpy"]["count"] == 5
    (memcpy_calls,) = _rows(
        path,
        "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value = 'cudaMemcpy_v3020' AND r.eventClass = 0",
    )[0]
    api = {r["name"]: r for r in trace.tables["cuda_api"]}
    assert api["cudaMemcpy_v3020"]["count"] == memcpy_calls == 15
    assert "cudaMemcpy" not in api  # the backtrace copies of each call (event class 67) are not counted twice
    ops = {r["op"]: r for r in trace.tables["memory_ops"]}
    assert (ops["memcpy HtoD"]["count"], ops["memcpy HtoD"]["mib"]) == (10, 2500.0)
    assert (ops["memcpy DtoH"]["count"], ops["memcpy DtoH"]["mib"]) == (5, 1250.0)


def test_discovery_claims_exports_and_leaves_the_folder_untouched(nsys_dir: Path):
    before = {p.name: p.stat().st_mtime_ns for p in nsys_dir.iterdir()}
    run = discover([nsys_dir])
    kinds = {f.rel: f.kind for f in run.files}
    assert (
        kinds["perlmutter-cloverleaf-cuda.sqlite"] == kinds["saxpy-mpi-cuda_nsys_perlmutter0.sqlite"] == "nsys_sqlite"
    )
    for name in EXPORTS:
        _summary(nsys_dir / name)
    assert {p.name: p.stat().st_mtime_ns for p in nsys_dir.iterdir()} == before


def test_nccl_kernels_of_both_namings_are_communication(nsys_dir: Path, tmp_path: Path):
    """A copy of a real export with some kernels renamed to NCCL kernels: classes, per-op medians, overlap."""
    path = tmp_path / "rank3.sqlite"
    shutil.copy(nsys_dir / "perlmutter-cloverleaf-cuda.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'")
        conn.execute("DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'")
        conn.execute("INSERT INTO StringIds VALUES (900001, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL')")
        conn.execute("INSERT INTO StringIds VALUES (900002, 'ncclKernel_AllGather_RING_LL_Sum_int8_t')")
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 900001 WHERE rowid % 10 = 0")
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = 900002 WHERE rowid % 10 = 5")
        rows = conn.execute('SELECT shortName, start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    trace = _summary(path)
    (device,) = trace.devices
    assert trace.rank == 3  # from the file name, once the environment has none
    nccl = [(s, e) for n, s, e in rows if n in (900001, 900002)]
    compute = [(s, e) for n, s, e in rows if n not in (900001, 900002)]
    assert device.nccl_count == len(nccl)
    assert device.comm_ns == _union_length(nccl)
    assert device.compute_ns == _union_length(compute)
    assert device.overlap_ns == _union_length(nccl) + _union_length(compute) - _union_length(nccl + compute)
    ops = {n.op: n for n in device.nccl_ops}
    for op, sid in (("AllReduce", 900001), ("AllGather", 900002)):
        durations = sorted(e - s for n, s, e in rows if n == sid)
        assert ops[op].count == len(durations)
        assert ops[op].median_ns == durations[(len(durations) - 1) // 2]
        assert ops[op].max_ns == durations[-1]
    all_durations = sorted(e - s for s, e in nccl)
    assert device.nccl_median_ns == all_durations[(len(all_durations) - 1) // 2]
    assert {k.cls for k in device.top_kernels if k.name.startswith("nccl")} <= {"communication"}


def test_damaged_and_foreign_sqlite_give_warnings_not_tracebacks(saxpy: Path, tmp_path: Path):
    data = saxpy.read_bytes()
    cut = tmp_path / "cut.nsys.sqlite"
    cut.write_bytes(data[: len(data) // 3])
    result = READ(cut, cut.name, Sink())
    assert result.warnings and all("cut.nsys.sqlite" in w for w in result.warnings)
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    assert READ(foreign, foreign.name, Sink()).note == "SQLite database without Nsight Systems tables"


def test_analysis_and_report_of_the_corpus_folder(nsys_dir: Path):
    a = analyze([nsys_dir])
    doc = to_json_dict(a)
    devices = {d["file"]: d for d in doc["traces"]["devices"]}
    assert devices["saxpy-mpi-cuda_nsys_perlmutter0.sqlite"]["kernels"] == 5
    assert devices["perlmutter-cloverleaf-cuda.sqlite"]["kernels"] == 1312
    assert doc["traces"]["straggler"] is None and "nccl_latency_ms" not in a.environment  # no NCCL kernels
    html = render_html(a)
    assert "saxpy(double *, double *, double *, double, int)" in html and "MPI_Init" in html
