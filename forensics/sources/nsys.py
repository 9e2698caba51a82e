"""Nsight Systems `nsys export --type sqlite` files: where each GPU's time went, aggregated inside SQLite.

An export of a long capture is several GB: every number here comes out of a SQL aggregate, never from
rows pulled into Python. The file is opened read-only through a URI (no journal, nothing written beside
it). nsys creates tables lazily and renames columns between releases, so every table and column is
looked up first and a missing one only removes its section. Schema: reference §4.1 (nsys 2022.2 and
2024.5 exports); kernel classes and the interval arithmetic are described in `gputrace`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.sources.gputrace import (
    COMMUNICATION,
    COMPUTE,
    EXTRAS_KEY,
    SLOWEST_NCCL,
    TOP_GAPS,
    TOP_KERNELS,
    DeviceTrace,
    KernelStat,
    NcclStat,
    SyncTimeline,
    TraceFile,
    is_nccl_kernel,
    nccl_op,
    rank_from_file_name,
    record_samples,
)

SOURCE = "nsys"
SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_MARKERS = (b"StringIds", b"TARGET_INFO_", b"CUPTI_ACTIVITY_KIND_", b"NVTX_EVENTS", b"ANALYSIS_DETAILS")
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
ENV_ASSIGNMENT = re.compile(r"(?:^|[\x00;\s])(?P<key>[A-Z_]+)=\"?(?P<value>\d+)\"?(?=$|[\x00;\s\"])")
TOP_TABLE = 10
NAME_CAP = 300


def _sniff(name: str, head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC) and (any(m in head for m in NSYS_MARKERS) or "nsys" in name)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """Read-only, immutable and URI-escaped: nothing is ever created beside the export.

    `mode=ro` alone still creates `-wal` and `-shm` files beside a WAL-mode database; `immutable=1`
    tells SQLite the file cannot change, so it takes no locks and writes nothing.
    """
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    return conn


class _Schema:
    """The tables and columns this export has (nsys creates tables lazily)."""

    def __init__(self, conn: sqlite3.Connection):
        self.tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._conn = conn
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self._conn.execute(f'PRAGMA table_info("{table}")') if table in self.tables else []
            self._columns[table] = {r[1] for r in rows}
        return self._columns[table]

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and set(columns) <= self.columns(table)

    def first(self, table: str, *candidates: str) -> str | None:
        return next((c for c in candidates if c in self.columns(table)), None)


def _nccl_names(conn: sqlite3.Connection, schema: _Schema) -> dict[int, str]:
    """StringIds ids of NCCL kernel names -> collective (`AllReduce`), from the small string table."""
    if "StringIds" not in schema.tables:
        return {}
    rows = conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'nccl%'")
    return {i: nccl_op(v) for i, v in rows if is_nccl_kernel(v)}


def _nccl_cte(nccl: dict[int, str]) -> tuple[str, list[Any]]:
    if not nccl:
        return "nccl(id, op) AS (SELECT NULL, NULL WHERE 0)", []
    values = ", ".join("(?, ?)" for _ in nccl)
    return f"nccl(id, op) AS (VALUES {values})", [x for item in nccl.items() for x in item]


def _activity_cte(schema: _Schema, class_col: str) -> str:
    """Every GPU activity as (dev, s, e, cls): 0 compute kernel, 1 NCCL kernel, 2 memcpy/memset."""
    parts = [
        f'SELECT deviceId, start, "end", CASE WHEN {class_col} IN (SELECT id FROM nccl) THEN 1 ELSE 0 END FROM {KERNEL}'
    ]
    parts += [f'SELECT deviceId, start, "end", 2 FROM {t}' for t in (MEMCPY, MEMSET) if schema.has(t, "deviceId")]
    return "ev(dev, s, e, cls) AS (" + " UNION ALL ".join(parts) + ")"


_UNION_SQL = """
WITH {nccl}, {activity},
sets(grp, c0, c1, c2) AS (VALUES ('compute', 1, 0, 0), ('comm', 0, 1, 0), ('kernels', 1, 1, 0),
                                 ('busy', 1, 1, 1), ('memory', 0, 0, 1)),
x AS (SELECT grp, dev, s, e FROM ev JOIN sets ON (cls = 0 AND c0) OR (cls = 1 AND c1) OR (cls = 2 AND c2)),
w AS (SELECT grp, dev, s, e, MAX(e) OVER (PARTITION BY grp, dev ORDER BY s, e
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM x)
SELECT grp, dev, COUNT(*), MIN(s), MAX(e), SUM(MAX(0, e - MAX(s, COALESCE(prev, s)))) FROM w GROUP BY grp, dev
"""

_GAPS_SQL = """
WITH {nccl}, {activity},
w AS (SELECT dev, s, MAX(e) OVER (PARTITION BY dev ORDER BY s, e
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM ev),
g AS (SELECT dev, prev, s - prev AS gap, ROW_NUMBER() OVER (PARTITION BY dev ORDER BY s - prev DESC) AS n
      FROM w WHERE s > prev)
SELECT dev, prev, gap FROM g WHERE n <= {top} ORDER BY dev, gap DESC
"""

_NCCL_SQL = """
WITH {nccl},
n AS (SELECT k.deviceId AS dev, nccl.op AS op, k."end" - k.start AS d
      FROM {kernel} k JOIN nccl ON k.{class_col} = nccl.id),
a AS (SELECT dev, op, d FROM n UNION ALL SELECT dev, '*', d FROM n),
r AS (SELECT dev, op, d, ROW_NUMBER() OVER (PARTITION BY dev, op ORDER BY d) AS rn,
             COUNT(*) OVER (PARTITION BY dev, op) AS c FROM a)
SELECT dev, op, MAX(c), SUM(d), MAX(CASE WHEN rn = (c + 1) / 2 THEN d END), MAX(d) FROM r GROUP BY dev, op
"""

_SLOWEST_NCCL_SQL = """
WITH {nccl},
n AS (SELECT k.deviceId AS dev, nccl.op AS op, k.start AS s, k."end" - k.start AS d,
             ROW_NUMBER() OVER (PARTITION BY k.deviceId ORDER BY k."end" - k.start DESC) AS rn
      FROM {kernel} k JOIN nccl ON k.{class_col} = nccl.id)
SELECT dev, op, s, d FROM n WHERE rn <= {top} ORDER BY dev, d DESC
"""

_TOP_KERNELS_SQL = """
WITH {nccl},
g AS (SELECT deviceId AS dev, {name_col} AS name_id, COUNT(*) AS c, SUM("end" - start) AS total,
             MAX("end" - start) AS longest, MAX({class_col} IN (SELECT id FROM nccl)) AS is_nccl
      FROM {kernel} GROUP BY deviceId, {name_col}),
r AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY dev ORDER BY total DESC) AS n FROM g)
SELECT dev, COALESCE(s.value, CAST(name_id AS TEXT)), c, total, longest, is_nccl
FROM r LEFT JOIN StringIds s ON s.id = r.name_id WHERE n <= {top} ORDER BY dev, total DESC
"""


# the what-if's input (gputrace.SyncTimeline), computed in SQL: the union of compute and memory activity per device
# (gaps and islands), and for each NCCL kernel the end of the last compute/memory activity launched before it
_LANE_SQL = """
WITH {nccl},
lane(dev, s, e) AS ({lane}),
w AS (SELECT dev, s, e, MAX(e) OVER (PARTITION BY dev ORDER BY s, e
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM lane),
g AS (SELECT dev, s, e, SUM(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                        OVER (PARTITION BY dev ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM w)
SELECT dev, MIN(s), MAX(e) FROM g GROUP BY dev, island ORDER BY dev, 2
"""

_READY_SQL = """
WITH {nccl},
x(dev, corr, s, e, stream, is_nccl) AS ({activity}),
r AS (SELECT *, MAX(CASE WHEN is_nccl = 0 THEN e END) OVER (PARTITION BY dev ORDER BY corr
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ready FROM x)
SELECT dev, s, e, COALESCE(MIN(ready, s), s), stream FROM r WHERE is_nccl = 1 ORDER BY dev, s
"""

_KERNEL_TOTALS_SQL = """
WITH {nccl}
SELECT k.deviceId, COALESCE(s.value, CAST(k.{name_col} AS TEXT)), COUNT(*), SUM(k."end" - k.start)
FROM {kernel} k LEFT JOIN StringIds s ON s.id = k.{name_col}
WHERE k.{class_col} NOT IN (SELECT id FROM nccl) GROUP BY k.deviceId, k.{name_col}
"""

STEP_RANGE = re.compile(r"^ProfilerStep#(\d+)$")


def _timelines(
    conn: sqlite3.Connection, schema: _Schema, nccl_sql: str, params: list[Any], class_col: str
) -> dict[int, SyncTimeline]:
    """Per device, the what-if's view of it; {} when the export lacks correlation ids."""
    if not schema.has(KERNEL, "correlationId", "streamId"):
        return {}
    copies = [t for t in (MEMCPY, MEMSET) if schema.has(t, "deviceId", "correlationId", "streamId")]
    lane = [f'SELECT deviceId, start, "end" FROM {KERNEL} WHERE {class_col} NOT IN (SELECT id FROM nccl)']
    lane += [f'SELECT deviceId, start, "end" FROM {t}' for t in copies]
    activity = [
        f'SELECT deviceId, correlationId, start, "end", streamId, {class_col} IN (SELECT id FROM nccl) FROM {KERNEL}'
    ]
    activity += [f'SELECT deviceId, correlationId, start, "end", streamId, 0 FROM {t}' for t in copies]
    lanes: dict[int, list[tuple[int, int]]] = {}
    for dev, start, end in conn.execute(_LANE_SQL.format(nccl=nccl_sql, lane=" UNION ALL ".join(lane)), params):
        lanes.setdefault(dev, []).append((start, end))
    colls: dict[int, list[tuple[int, int, int, int]]] = {}
    sql = _READY_SQL.format(nccl=nccl_sql, activity=" UNION ALL ".join(activity))
    for dev, start, end, ready, stream in conn.execute(sql, params):
        colls.setdefault(dev, []).append((start, end, ready, stream))
    totals: dict[int, dict[str, tuple[int, int]]] = {}
    name_col = schema.first(KERNEL, "demangledName", "shortName", "mangledName") or class_col
    if "StringIds" in schema.tables:
        sql = _KERNEL_TOTALS_SQL.format(nccl=nccl_sql, kernel=KERNEL, name_col=name_col, class_col=class_col)
        for dev, name, count, total in conn.execute(sql, params):
            totals.setdefault(dev, {})[(name or "")[:NAME_CAP]] = (count, total)
    steps = _profiler_steps(conn, schema)
    out = {}
    for dev, intervals in lanes.items():
        c = np.array(colls.get(dev, []), dtype=np.int64).reshape(-1, 4)
        out[dev] = SyncTimeline(
            lane_start=np.array([s for s, _ in intervals], dtype=np.int64),
            lane_end=np.array([e for _, e in intervals], dtype=np.int64),
            coll_group=[""] * len(c),  # nsys does not name the communicator: one group, in start order
            coll_index=np.arange(len(c), dtype=np.int64),
            coll_start=c[:, 0],
            coll_end=c[:, 1],
            coll_ready=c[:, 2],
            coll_stream=c[:, 3],
            steps=steps,
            kernel_totals=totals.get(dev, {}),
        )
    return out


def _nvtx_label(schema: _Schema) -> tuple[str, str] | None:
    """How to read an NVTX range's text (inline, or by id from StringIds): (join, expression); None without ranges."""
    if not schema.has(NVTX, "start", "end", "eventType"):
        return None
    text = "n.text" if "text" in schema.columns(NVTX) else "NULL"
    if "textId" in schema.columns(NVTX) and "StringIds" in schema.tables:
        return "LEFT JOIN StringIds s ON s.id = n.textId", f"COALESCE({text}, s.value)"
    return "", text


def _profiler_steps(conn: sqlite3.Connection, schema: _Schema) -> list[tuple[int, int, int]]:
    """`ProfilerStep#N` NVTX ranges (torch.profiler with NVTX on), as (N, start, end)."""
    reading = _nvtx_label(schema)
    if reading is None:
        return []
    join, name = reading
    types = ", ".join(map(str, NVTX_RANGE_TYPES))
    sql = (
        f'SELECT {name}, n.start, n."end" FROM {NVTX} n {join} WHERE n.eventType IN ({types}) '
        f"AND {name} LIKE 'ProfilerStep#%'"
    )
    steps = {}
    for label, start, end in conn.execute(sql):
        m = STEP_RANGE.match(label or "")
        if m and end is not None and int(m[1]) not in steps:
            steps[int(m[1])] = (start, end)
    return sorted((n, s, e) for n, (s, e) in steps.items())


def _wall_clock(origin_ns: int | None, offset_ns: int) -> datetime | None:
    if origin_ns is None:
        return None
    return datetime.fromtimestamp((origin_ns + offset_ns) / 1e9, tz=timezone.utc)


def _device_traces(
    conn: sqlite3.Connection, schema: _Schema, rel: str, nccl: dict[int, str], origin_ns: int | None
) -> dict[int, DeviceTrace]:
    """Per device: the unions of compute, NCCL, memory and all activity, and the largest idle gaps."""
    class_col = schema.first(KERNEL, "shortName", "demangledName", "mangledName")
    if class_col is None or not schema.has(KERNEL, "deviceId", "start", "end"):
        return {}
    nccl_sql, params = _nccl_cte(nccl)
    activity = _activity_cte(schema, class_col)
    unions: dict[int, dict[str, tuple[int, int, int, int]]] = {}
    for grp, dev, count, first, last, union in conn.execute(
        _UNION_SQL.format(nccl=nccl_sql, activity=activity), params
    ):
        unions.setdefault(dev, {})[grp] = (count, first, last, union)
    devices: dict[int, DeviceTrace] = {}
    firsts: dict[int, int] = {}
    for dev, groups in unions.items():
        count, first, last, busy = groups["busy"]
        firsts[dev] = first
        none = (0, 0, 0, 0)
        devices[dev] = DeviceTrace(
            file=rel,
            source=SOURCE,
            device=dev,
            rank=None,
            host=None,
            start=_wall_clock(origin_ns, first),
            span_ns=last - first,
            busy_ns=busy,
            compute_ns=groups.get("compute", none)[3],
            comm_ns=groups.get("comm", none)[3],
            memory_ns=groups.get("memory", none)[3],
            kernels_ns=groups.get("kernels", none)[3],
            kernel_count=groups.get("kernels", none)[0],
            nccl_count=groups.get("comm", none)[0],
            nccl_median_ns=None,
        )
    gaps_sql = _GAPS_SQL.format(nccl=nccl_sql, activity=activity, top=TOP_GAPS)
    for dev, prev, gap in conn.execute(gaps_sql, params):
        devices[dev].idle_gaps.append((prev - firsts[dev], gap))
    _fill_top_kernels(conn, schema, devices, nccl_sql, params, class_col)
    if nccl:
        _fill_nccl(conn, devices, nccl_sql, params, class_col, firsts)
    for dev, timeline in _timelines(conn, schema, nccl_sql, params, class_col).items():
        if dev in devices:
            devices[dev].timeline = timeline
            devices[dev].steps = len(timeline.steps) or None
    return devices


def _fill_top_kernels(
    conn: sqlite3.Connection,
    schema: _Schema,
    devices: dict[int, DeviceTrace],
    nccl_sql: str,
    params: list[Any],
    class_col: str,
) -> None:
    name_col = schema.first(KERNEL, "demangledName", "shortName", "mangledName") or class_col
    if "StringIds" not in schema.tables:
        return
    sql = _TOP_KERNELS_SQL.format(nccl=nccl_sql, kernel=KERNEL, name_col=name_col, class_col=class_col, top=TOP_KERNELS)
    for dev, name, count, total, longest, is_nccl in conn.execute(sql, params):
        if dev in devices:
            cls = COMMUNICATION if is_nccl else COMPUTE
            devices[dev].top_kernels.append(KernelStat(name[:NAME_CAP], cls, count, total, longest))


def _fill_nccl(
    conn: sqlite3.Connection,
    devices: dict[int, DeviceTrace],
    nccl_sql: str,
    params: list[Any],
    class_col: str,
    firsts: dict[int, int],
) -> None:
    """Per device and collective: count, total, median and longest NCCL kernel; the slowest instances."""
    sql = _NCCL_SQL.format(nccl=nccl_sql, kernel=KERNEL, class_col=class_col)
    for dev, op, count, total, median, longest in conn.execute(sql, params):
        if dev not in devices:
            continue
        if op == "*":
            devices[dev].nccl_median_ns = median
        else:
            devices[dev].nccl_ops.append(NcclStat(op, count, total, median, longest))
    for d in devices.values():
        d.nccl_ops.sort(key=lambda n: -n.total_ns)
    sql = _SLOWEST_NCCL_SQL.format(nccl=nccl_sql, kernel=KERNEL, class_col=class_col, top=SLOWEST_NCCL)
    for dev, op, start, dur in conn.execute(sql, params):
        if dev in devices:
            devices[dev].slowest_nccl.append(
                {"op": op, "offset_ms": round((start - firsts[dev]) / 1e6, 3), "us": round(dur / 1e3, 2)}
            )


def _top_nvtx(conn: sqlite3.Connection, schema: _Schema) -> list[dict[str, Any]]:
    reading = _nvtx_label(schema)
    if reading is None:
        return []
    join, name = reading
    types = ", ".join(map(str, NVTX_RANGE_TYPES))
    sql = (
        f'SELECT {name} AS label, COUNT(*), SUM(n."end" - n.start), MAX(n."end" - n.start) FROM {NVTX} n {join} '
        f'WHERE n.eventType IN ({types}) AND n."end" IS NOT NULL GROUP BY label ORDER BY 3 DESC LIMIT {TOP_TABLE}'
    )
    return [_named_stat(label, count, total, longest) for label, count, total, longest in conn.execute(sql)]


def _top_cuda_api(conn: sqlite3.Connection, schema: _Schema) -> list[dict[str, Any]]:
    if not schema.has(RUNTIME, "start", "end", "nameId") or "StringIds" not in schema.tables:
        return []
    # nsys 2022 stores each call a second time as a backtrace record (event classes 67-69)
    where = "WHERE r.eventClass NOT IN (67, 68, 69)" if "eventClass" in schema.columns(RUNTIME) else ""
    sql = (
        f'SELECT s.value, COUNT(*), SUM(r."end" - r.start), MAX(r."end" - r.start) FROM {RUNTIME} r '
        f"LEFT JOIN StringIds s ON s.id = r.nameId {where} GROUP BY r.nameId ORDER BY 3 DESC LIMIT {TOP_TABLE}"
    )
    return [_named_stat(label, count, total, longest) for label, count, total, longest in conn.execute(sql)]


def _memory_ops(conn: sqlite3.Connection, schema: _Schema) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if schema.has(MEMCPY, "deviceId", "copyKind", "bytes"):
        sql = (
            f'SELECT deviceId, copyKind, COUNT(*), SUM("end" - start), SUM(bytes) FROM {MEMCPY} '
            "GROUP BY deviceId, copyKind ORDER BY 4 DESC"
        )
        for dev, kind, count, total, nbytes in conn.execute(sql):
            rows.append(_memory_row(dev, f"memcpy {COPY_KINDS.get(kind, f'kind {kind}')}", count, total, nbytes))
    if schema.has(MEMSET, "deviceId", "bytes"):
        sql = f'SELECT deviceId, COUNT(*), SUM("end" - start), SUM(bytes) FROM {MEMSET} GROUP BY deviceId'
        for dev, count, total, nbytes in conn.execute(sql):
            rows.append(_memory_row(dev, "memset", count, total, nbytes))
    return rows


def _memory_row(dev: int, op: str, count: int, total: int, nbytes: int | None) -> dict[str, Any]:
    return {
        "device": dev,
        "op": op,
        "count": count,
        "total_ms": round(total / 1e6, 3),
        "mib": round((nbytes or 0) / 2**20, 2),
    }


def _named_stat(label: str | None, count: int, total: int, longest: int) -> dict[str, Any]:
    return {
        "name": (label or "(unnamed)")[:NAME_CAP],
        "count": count,
        "total_ms": round(total / 1e6, 3),
        "max_ms": round(longest / 1e6, 3),
    }


def _scalar(conn: sqlite3.Connection, schema: _Schema, table: str, sql: str) -> Any:
    if table not in schema.tables:
        return None
    row = conn.execute(sql).fetchone()
    return row[0] if row else None


def _rank_from_environment(conn: sqlite3.Connection, schema: _Schema) -> int | None:
    """RANK (or the MPI/Slurm equivalents) of the profiled process, from the environment nsys captured."""
    texts: list[str] = []
    if schema.has("META_DATA_CAPTURE", "name", "value"):
        sql = "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE' AND value GLOB '*RANK*'"
        texts += [v for (v,) in conn.execute(sql)]
        sql = (
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE' AND value GLOB 'SLURM_PROCID*'"
        )
        texts += [v for (v,) in conn.execute(sql)]
    if schema.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        texts += [
            v for (v,) in conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'")
        ]
    found: dict[str, int] = {}
    for text in texts:
        for m in ENV_ASSIGNMENT.finditer(text or ""):
            found.setdefault(m["key"], int(m["value"]))
    return next((found[k] for k in RANK_VARIABLES if k in found), None)


def _section(result: FileResult, rel: str, what: str, read: Callable[[], Any], default: Any) -> Any:
    """One part of the export; a damaged or unexpected table costs that part only, with a warning."""
    try:
        return read()
    except sqlite3.Error as exc:
        result.warnings.append(f"{rel}: Nsight Systems {what} could not be read: {exc}")
        return default


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    try:
        conn = connect_read_only(path)
        schema = _Schema(conn)
    except sqlite3.Error as exc:
        result.warnings.append(f"{rel}: not readable as an Nsight Systems export: {exc}")
        return result
    try:
        return _summarise(conn, schema, rel, result, sink)
    finally:
        conn.close()


def _summarise(conn: sqlite3.Connection, schema: _Schema, rel: str, result: FileResult, sink: Sink) -> FileResult:
    if not any(t.startswith(("CUPTI_", "TARGET_INFO_", "NVTX_")) or t == "StringIds" for t in schema.tables):
        result.note = "SQLite database without Nsight Systems tables"
        return result
    version_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in schema.tables), None)
    if version_table:
        sql = f"SELECT value FROM {version_table} WHERE name = 'EXPORT_PRODUCT_VERSION'"
        version = _section(result, rel, "version", lambda: _scalar(conn, schema, version_table, sql), None)
        if version:
            result.environment["nsys_version"] = version
    origin = _section(
        result,
        rel,
        "session start",
        lambda: _scalar(
            conn, schema, "TARGET_INFO_SESSION_START_TIME", "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"
        ),
        None,
    )
    host = _section(
        result,
        rel,
        "host name",
        lambda: _scalar(
            conn, schema, "TARGET_INFO_SYSTEM_ENV", "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'"
        ),
        None,
    )
    if schema.has("TARGET_INFO_GPU", "name"):
        names = _section(
            result,
            rel,
            "GPU list",
            lambda: [n for (n,) in conn.execute("SELECT DISTINCT name FROM TARGET_INFO_GPU")],
            [],
        )
        if names:
            result.environment["gpu_names"] = sorted(n for n in names if n)
    rank = _section(result, rel, "environment", lambda: _rank_from_environment(conn, schema), None)
    if rank is None:
        rank = rank_from_file_name(rel)
    nccl = _section(result, rel, "string table", lambda: _nccl_names(conn, schema), {})
    devices = _section(result, rel, "GPU activity", lambda: _device_traces(conn, schema, rel, nccl, origin), {})
    active = [d for _, d in sorted(devices.items())]
    if rank is None and active:
        result.warnings.append(
            f"{rel}: no rank found (no RANK/OMPI_COMM_WORLD_RANK/PMI_RANK/SLURM_PROCID in the captured environment, "
            "no rankN in the file name); its GPUs are reported by device"
        )
    elif rank is not None and len(active) > 1:
        result.warnings.append(f"{rel}: rank {rank} used {len(active)} GPUs; they are reported by device")
    for d in active:
        d.host = host
        d.rank = rank if len(active) == 1 else None
    tables = {
        "nvtx": _section(result, rel, "NVTX ranges", lambda: _top_nvtx(conn, schema), []),
        "cuda_api": _section(result, rel, "CUDA API calls", lambda: _top_cuda_api(conn, schema), []),
        "memory_ops": _section(result, rel, "memcpy/memset", lambda: _memory_ops(conn, schema), []),
    }
    result.extras[EXTRAS_KEY] = TraceFile(rel, SOURCE, rank, active, tables)
    record_samples(sink, active)
    kernels = sum(d.kernel_count for d in active)
    nccl_kernels = sum(d.nccl_count for d in active)
    result.note = f"Nsight Systems export: {len(active)} GPU(s), {kernels} kernels ({nccl_kernels} NCCL)"
    return result


FILE_SOURCES = [FileSource("nsys_sqlite", _sniff, _read)]
