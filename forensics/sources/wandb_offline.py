"""Weights & Biases offline runs (`wandb/offline-run-*/run-<id>.wandb`): what `wandb.init(mode="offline")`
writes before a `wandb sync`.

The file is a `:W&B` header (magic 0xBEE1, version) followed by LevelDB-log framed records (32 KiB blocks,
each record a 7-byte header: CRC-32 of type and data, length, type FULL/FIRST/MIDDLE/LAST), each a protobuf `Record`
of the `wandb` package's `wandb_internal_pb2`. Only `history` records are metrics: one per `wandb.log`, its
items keyed by name (or nested key) with JSON values and `_step`, `_timestamp`. The protobuf schema comes from
the `wandb` package (an optional extra); without it the file is listed with a note. A damaged record (its CRC
does not match) ends the file: what came before is kept.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink

SOURCE = "wandb"
HEADER = b":W&B\xe1\xbe"  # ident and magic; a version byte follows
BLOCK = 32768
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_BYTES = 2 * 1024**3


def checksum(kind: int, data: bytes) -> int:
    """W&B's checksum of a record: CRC-32 (zlib's) of its type byte and data."""
    return zlib.crc32(bytes([kind]) + data) & 0xFFFFFFFF


def _sniff(name: str, head: bytes) -> bool:
    return name.endswith(".wandb") and head.startswith(HEADER)


def records(data: bytes) -> Iterator[bytes]:
    """The payload of every intact record, in order; stops at the first damaged one (raises ValueError)."""
    pos, pending = len(HEADER) + 1, b""
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        if len(chunk) < length or checksum(kind, chunk) != crc:
            raise ValueError(f"damaged record at byte {pos}")
        pos += RECORD_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def _history(record) -> tuple[int | None, datetime | None, dict[str, float]]:  # a wandb_internal_pb2.Record
    step, when, metrics = None, None, {}
    for item in record.history.item:
        key = item.key or "/".join(item.nested_key)
        try:
            value = json.loads(item.value_json)
        except ValueError:
            continue
        if key == "_step" and isinstance(value, (int, float)):
            step = int(value)
        elif key == "_timestamp" and isinstance(value, (int, float)) and math.isfinite(value):
            when = datetime.fromtimestamp(value, timezone.utc)
        elif not key.startswith("_") and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[key] = float(value)
        elif value in ("NaN", "Infinity", "-Infinity"):  # W&B writes non-finite floats as strings
            metrics[key] = float(value.replace("Infinity", "inf"))
    if record.history.HasField("step"):
        step = int(record.history.step.num)
    return step, when, metrics


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        result.note = "W&B offline run: install the `wandb` package (forensics[wandb]) to read it"
        result.warnings.append(f"{rel}: {result.note}")
        return result
    data = path.read_bytes()[:MAX_BYTES]
    count = 0
    try:
        for payload in records(data):
            count += 1
            record = wandb_internal_pb2.Record.FromString(payload)
            if record.WhichOneof("record_type") != "history":
                continue
            step, when, metrics = _history(record)
            if step is None:
                continue
            for metric, value in metrics.items():
                sink.sample(metric, value, source=SOURCE, step=step, ts=when)
    except Exception as exc:  # a damaged or truncated record ends the file: keep what came before
        result.warnings.append(f"{rel}: damaged after {count} records ({type(exc).__name__}: {exc})")
    result.lines = count
    return result


FILE_SOURCES = [FileSource("wandb_offline", _sniff, _read)]
