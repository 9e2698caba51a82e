"""`nvidia-smi -q` dumps: driver and CUDA versions, GPU models, memory capacity and health counters.

The dump is an indented tree of `Key : value` lines under `==============NVSMI LOG==============`,
one `GPU 00000000:18:00.0` block per device. Repeated snapshots (`-q -l N`) are read in order and the
last value of a counter wins. Key names moved between drivers (`Clocks Throttle Reasons` became
`Clocks Event Reasons`; `Double Bit` ECC totals became `DRAM Uncorrectable`), so several spellings
are accepted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

MAX_BYTES = 64 * 1024 * 1024
MAX_LINE_CHARS = 4096
BANNER = b"NVSMI LOG"
ENTRY = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
GPU_BLOCK = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
UNCORRECTABLE_ECC = (
    "ECC Errors/Volatile/DRAM Uncorrectable",
    "ECC Errors/Volatile/Double Bit/Total",
    "ECC Errors/Volatile/Uncorrectable",
)
SLOWDOWN_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")


def _sniff(name: str, head: bytes) -> bool:
    return BANNER in head[:512] and b"Driver Version" in head


def parse_tree(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(top-level values, one flat {'Section/Key': value} dict per GPU block), in order of appearance."""
    top: dict[str, str] = {}
    gpus: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []  # (indent, section name)
    for raw in text.splitlines():
        if not raw.strip() or BANNER.decode() in raw or len(raw) > MAX_LINE_CHARS:
            continue  # no entry is that long; ENTRY's lazy key is quadratic in a line's runs of spaces
        block = GPU_BLOCK.match(raw.strip())
        if block and not raw.startswith(" "):
            current = {"Bus Id": block["bus"]}
            gpus.append(current)
            stack = []
            continue
        indent = len(raw) - len(raw.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = ENTRY.match(raw)
        if m is None:
            stack.append((indent, raw.strip()))
            continue
        path = "/".join([name for _, name in stack] + [m["key"].strip()])
        (current if current is not None else top)[path] = m["value"]
    return top, gpus


def _number(value: str | None) -> float | None:
    m = NUMBER.search(value or "")
    return float(m.group()) if m else None


def _gpu_facts(gpu: dict[str, str]) -> dict[str, Any]:
    facts: dict[str, Any] = {"bus_id": gpu.get("Bus Id"), "name": gpu.get("Product Name")}
    total = _number(gpu.get("FB Memory Usage/Total"))
    if total is not None:
        facts["memory_total_mib"] = total
    for key in UNCORRECTABLE_ECC:
        if key in gpu and _number(gpu[key]) is not None:
            facts["ecc_uncorrectable"] = int(_number(gpu[key]) or 0)
            break
    if "Remapped Rows/Pending" in gpu:
        facts["row_remap_pending"] = gpu["Remapped Rows/Pending"].strip().lower() == "yes"
    if "Remapped Rows/Remapping Failure Occurred" in gpu:
        facts["row_remap_failure"] = gpu["Remapped Rows/Remapping Failure Occurred"].strip().lower() == "yes"
    active = [
        reason
        for section in ("Clocks Event Reasons", "Clocks Throttle Reasons")
        for reason in SLOWDOWN_REASONS
        if gpu.get(f"{section}/{reason}", "").strip() == "Active"
    ]
    if active:
        facts["slowdown"] = sorted(set(active))
    return facts


def parse_nvidia_smi_q(text: str) -> dict[str, Any]:
    """Environment facts from an `nvidia-smi -q` dump (several snapshots: the last value wins)."""
    top, blocks = parse_tree(text)
    env: dict[str, Any] = {}
    if top.get("Driver Version"):
        env["driver_version"] = top["Driver Version"]
    cuda = top.get("CUDA Version", "")
    if NUMBER.match(cuda):
        env["cuda_driver_version"] = cuda  # the newest CUDA this driver supports
    per_bus: dict[str, dict[str, Any]] = {}
    for block in blocks:
        per_bus.setdefault(block.get("Bus Id", str(len(per_bus))), {}).update(_gpu_facts(block))
    gpus = list(per_bus.values())
    if not gpus:
        return env
    env["gpu_count"] = len(gpus)
    names = sorted({g["name"] for g in gpus if g.get("name")})
    if names:
        env["gpu_names"] = names
    totals = [g["memory_total_mib"] for g in gpus if "memory_total_mib" in g]
    if totals:
        env["gpu_memory_total_mib"] = max(totals)
    health = {
        "gpu_ecc_uncorrectable": sum(g.get("ecc_uncorrectable", 0) for g in gpus),
        "gpu_row_remap_pending": sum(bool(g.get("row_remap_pending")) for g in gpus),
        "gpu_row_remap_failure": sum(bool(g.get("row_remap_failure")) for g in gpus),
    }
    if any("ecc_uncorrectable" in g for g in gpus):
        env["gpu_ecc_uncorrectable"] = health["gpu_ecc_uncorrectable"]
    if any("row_remap_pending" in g for g in gpus):
        env["gpu_row_remap_pending"] = health["gpu_row_remap_pending"]
        env["gpu_row_remap_failure"] = health["gpu_row_remap_failure"]
    slow = sorted({f"GPU {i}: {r}" for i, g in enumerate(gpus) for r in g.get("slowdown", [])})
    if slow:
        env["gpu_clock_slowdown"] = slow
    return env


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    with open_binary(path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        result.warnings.append(f"{rel}: only the first {MAX_BYTES // 2**20} MiB of the nvidia-smi -q dump were read")
        data = data[:MAX_BYTES]
    text = data.decode("utf-8", "replace")
    result.lines = text.count("\n") + 1
    result.environment = parse_nvidia_smi_q(text)
    return result


FILE_SOURCES = [FileSource("nvidia_smi_q", _sniff, _read)]
