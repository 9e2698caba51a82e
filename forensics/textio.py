"""Reading input bytes: transparent decompression and line batches as polars columns.

Lines are never turned into Python strings one by one: a chunk of bytes becomes an Arrow string
column whose offsets are the newline positions, so matching runs in Rust over the whole batch.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa

CHUNK_BYTES = 32 * 1024 * 1024
CONTEXT_LINES = 64  # lines kept on both sides of a batch so multi-line records can be read whole
MAX_DECOMPRESSED_BYTES = 8 * 1024**3  # a bomb stops here, with a warning

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
}


def compression_of(head: bytes) -> str | None:
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


class ReadLimitExceeded(Exception):
    """A compressed input expanded past MAX_DECOMPRESSED_BYTES."""


class _ZstdReader(io.RawIOBase):
    """Streaming zstd through the standard library (3.14+) or the `zstandard` package when present."""

    def __init__(self, raw: BinaryIO):
        try:
            from compression import zstd  # type: ignore[import-not-found]

            self._inner = zstd.ZstdFile(raw)
        except ImportError:
            import zstandard  # type: ignore[import-not-found]

            self._inner = zstandard.ZstdDecompressor().stream_reader(raw)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self._inner.read(len(b))
        b[: len(data)] = data
        return len(data)


def open_binary(path: Path) -> BinaryIO:
    """Open a file for reading bytes, decompressing gzip, bz2, xz and zstd by their magic bytes."""
    raw = path.open("rb")
    head = raw.read(6)
    raw.seek(0)
    kind = compression_of(head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if kind == "bz2":
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if kind == "xz":
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    if kind == "zstd":
        return io.BufferedReader(_ZstdReader(raw))  # type: ignore[return-value]
    return raw


def read_head(path: Path, size: int = 4096) -> bytes:
    """The first bytes of a file after decompression; empty on any read error."""
    try:
        with open_binary(path) as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ImportError, ValueError):
        return b""


@dataclass
class LineBatch:
    """A run of consecutive lines of one file.

    `lines` holds every line of the batch, each with its trailing newline when it had one;
    matching uses multi-line regex mode so `^` and `$` still mean line start and end. Only lines in
    `[own_start, own_end)` belong to this batch: the others are context shared with a neighbour.
    """

    first_line: int  # 1-based number of lines[0]
    lines: pl.Series
    own_start: int
    own_end: int

    def line_number(self, index: int) -> int:
        return self.first_line + index

    def text(self, index: int) -> str:
        value = self.lines[index]
        return value.rstrip("\r\n") if value is not None else ""


def _valid_utf8(data: bytes) -> bytes:
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace").encode("utf-8")


def _as_lines(data: bytes) -> tuple[pl.Series, np.ndarray]:
    """Split bytes into a string column at newlines (kept), returning the line start offsets too."""
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10) + 1
    if len(ends) == 0 or ends[-1] != len(data):
        ends = np.append(ends, len(data))
    offsets = np.empty(len(ends) + 1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:] = ends
    array = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(data))
    return pl.Series("line", array), offsets


def iter_line_batches(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[LineBatch]:
    """Yield batches of lines, overlapping by CONTEXT_LINES on each side.

    Memory stays bounded by `chunk_bytes` plus the carried context, whatever the file size.
    """
    carry = b""
    carry_first_line = 1
    carry_own_from = 0  # lines of the carry already owned by the previous batch
    total = 0
    while True:
        block = stream.read(chunk_bytes)
        total += len(block)
        if total > MAX_DECOMPRESSED_BYTES:
            raise ReadLimitExceeded(f"stopped after {MAX_DECOMPRESSED_BYTES // 1024**3} GiB")
        final = not block
        data = carry + block
        if not data:
            return
        if not final:
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > 4 * chunk_bytes:  # one enormous line: cut it rather than grow forever
                    cut = len(data) - 1
                else:
                    carry = data
                    continue
            body, rest = data[: cut + 1], data[cut + 1 :]
        else:
            body, rest = data, b""
        body = _valid_utf8(body)
        lines, offsets = _as_lines(body)
        n = len(lines)
        if final:
            yield LineBatch(carry_first_line, lines, carry_own_from, n)
            return
        keep = min(n, 2 * CONTEXT_LINES)
        own_end = max(carry_own_from, n - CONTEXT_LINES)
        yield LineBatch(carry_first_line, lines, carry_own_from, own_end)
        start_keep = n - keep
        carry = body[offsets[start_keep] :] + rest
        carry_first_line += start_keep
        carry_own_from = own_end - start_keep
