"""dcgm-exporter scrapes (Prometheus text): GPU memory, utilisation, power, temperature and Xid per GPU.

A value line is `DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…",modelName="NVIDIA H100 80GB HBM3",hostname="n7"} 1234`,
optionally followed by a millisecond timestamp; `# HELP` / `# TYPE` lines describe each field. Several
scrapes saved one after the other are read in order. Blank fields hold a sentinel near 2**63 and are
skipped. Samples carry the GPU index in `rank` (like nvidia-smi samples); the exporter's `hostname`
label (`Hostname` before dcgm-exporter #655) names the host in the environment.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

SOURCE = "dcgm"
SAMPLE = re.compile(
    r"^(?P<name>DCGM_\w+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|NaN|\+?Inf))"
    r"(?:\s+(?P<ts>\d{10,13}))?\s*$"
)
LABEL = re.compile(r'(?P<key>\w+)="(?P<value>(?:[^"\\]|\\.)*)"')
BLANK_SENTINEL = 9.2e18
METRICS = {
    "DCGM_FI_DEV_FB_USED": "gpu/memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "gpu/memory_free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "gpu/memory_reserved_mib",
    "DCGM_FI_DEV_GPU_UTIL": "gpu/util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gpu/mem_util_pct",
    "DCGM_FI_DEV_POWER_USAGE": "gpu/power_w",
    "DCGM_FI_DEV_GPU_TEMP": "gpu/temperature_c",
    "DCGM_FI_DEV_SM_CLOCK": "gpu/sm_clock_mhz",
    "DCGM_FI_DEV_XID_ERRORS": "gpu/xid_last",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpu/gr_engine_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gpu/tensor_active",
}
CAPACITY_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")


def _sniff(name: str, head: bytes) -> bool:
    return b"DCGM_FI_" in head and (b"# HELP DCGM_" in head or b'{gpu="' in head)


def _labels(text: str | None) -> dict[str, str]:
    return {m["key"]: m["value"] for m in LABEL.finditer(text or "")}


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    models: set[str] = set()
    hosts: set[str] = set()
    capacity: dict[tuple[str, int], dict[str, float]] = {}  # (host, gpu) -> latest used/free/reserved
    xids: set[tuple[str, int, int]] = set()
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, start=1):
            result.lines = number
            line = raw.decode("utf-8", "replace").strip()
            m = SAMPLE.match(line)
            if m is None:
                continue
            labels = _labels(m["labels"])
            value = float(m["value"])
            if value >= BLANK_SENTINEL or "gpu" not in labels or not labels["gpu"].isdigit():
                continue
            gpu = int(labels["gpu"])
            host = labels.get("hostname") or labels.get("Hostname") or ""
            if host:
                hosts.add(host)
            if labels.get("modelName"):
                models.add(labels["modelName"])
            if labels.get("DCGM_FI_DRIVER_VERSION"):
                result.environment["driver_version"] = labels["DCGM_FI_DRIVER_VERSION"]
            ts = datetime.fromtimestamp(int(m["ts"][:13]) / 1000, tz=timezone.utc) if m["ts"] else None
            name = m["name"]
            sink.sample(METRICS.get(name, "dcgm/" + name.lower()), value, source=SOURCE, rank=gpu, ts=ts)
            if name in CAPACITY_PARTS:
                capacity.setdefault((host, gpu), {})[name] = value
            if name == "DCGM_FI_DEV_XID_ERRORS" and value > 0 and (host, gpu, int(value)) not in xids:
                xids.add((host, gpu, int(value)))
                sink.event(
                    file=rel,
                    line=number,
                    source=SOURCE,
                    kind="xid",
                    message=line,
                    ts=ts,
                    host=host or None,
                    rank=gpu,
                    level="error",
                    fields={"xid": int(value), "gpu": gpu, "err_msg": labels.get("err_msg", "")},
                )
    if models:
        result.environment["gpu_names"] = sorted(models)
    if hosts:
        result.environment["hosts"] = sorted(hosts)
    used_and_free = set(CAPACITY_PARTS[:2])
    totals = [sum(parts.values()) for parts in capacity.values() if used_and_free <= set(parts)]
    if totals:
        result.environment["gpu_memory_total_mib"] = max(totals)
    return result


FILE_SOURCES = [FileSource("dcgm_exporter", _sniff, _read)]
