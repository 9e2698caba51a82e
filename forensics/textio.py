"""Reading input bytes: transparent decompression and line batches as polars columns.

Lines are never turned into Python strings one by one: a chunk of bytes becomes an Arrow string
column whose offsets are the newline positions, so matching runs in Rust over the whole batch.
"""

from __future__ import annotations

import bz2
import contextlib
import ctypes
import functools
import gzip
import io
import lzma
import queue
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import polars as pl

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_BYTES = 4 * 1024 * 1024
NEWLINE = 10
CONTEXT_LINES = 64  # lines kept on both sides of a batch so multi-line records can be read whole
MAX_DECOMPRESSED_BYTES = 8 * 1024**3  # a compressed file stops here, with a warning (a plain file is read whole)
# A bomb is stopped sooner. The classic one (GBs of one repeated byte: zeros, newlines) by that run, which no
# log holds; any other by its expansion: gzip cannot exceed ~1030:1 and real logs stay under ~300:1 (a flood of
# identical lines); the decoder's read-ahead makes the measured ratio of a gzip bomb ~700:1 at 256 MiB.
# Formats that compress further (xz, zstd) can cut a genuine flood short, with a warning that says so.
MAX_UNIFORM_RUN_BYTES = 16 * 1024**2
MAX_EXPANSION_RATIO = 500
RATIO_CHECKED_AFTER_BYTES = 256 * 1024**2
MAX_LINE_CHARS = 64 * 1024  # what Python reads of one line; a longer one is matched whole in Rust only

NEWLINE_SEARCH_BYTES = 256 * 1024  # newlines are found a cache-sized slice at a time (no chunk-sized mask)
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter (malloc.h)

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
}


COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def without_compression_suffix(name: str) -> str:
    """`metrics.jsonl.gz` -> `metrics.jsonl`: what a compressed file holds, by its name."""
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def compression_of(head: bytes) -> str | None:
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


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


class _Decompressed(io.RawIOBase):
    """A decompressing reader that ends cleanly where the data is damaged or turns out to be a bomb.

    Everything decoded before the problem is returned (a truncated .gz still yields its lines, the last
    ones being the ones that matter after a crash) and the reason is kept in `problem` for a warning.
    """

    def __init__(self, decoder: BinaryIO, raw: BinaryIO, kind: str):
        self._decoder = decoder
        self._raw = raw
        self.kind = kind
        self.decoded = 0
        self.problem: str | None = None
        self._run_byte = b""
        self._run_bytes = 0  # length of the current run of one repeated byte

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self.problem is not None:
            return 0
        view = memoryview(b).cast("B")
        try:
            data = self._decoder.read1(len(view))  # one decoding step, so a failure loses nothing decoded
        except Exception as exc:  # any decoder error (zlib, lzma, zstd, EOF, header) means damaged data
            self.problem = f"damaged {self.kind} data after {self.decoded:,} bytes ({type(exc).__name__}: {exc})"
            return 0
        n = len(data)
        view[:n] = data
        self.decoded += n
        self._check_bomb(data)
        return n

    def _check_bomb(self, data: bytes) -> None:
        first = data[:1]
        if first and data.count(first) == len(data):
            self._run_bytes = self._run_bytes + len(data) if first == self._run_byte else len(data)
            self._run_byte = first
        else:
            self._run_bytes = 0
        if self.decoded > MAX_DECOMPRESSED_BYTES:
            self.problem = (
                f"{self.kind} data decompresses past {MAX_DECOMPRESSED_BYTES // 1024**3} GiB; the rest was not read"
            )
        elif self._run_bytes > MAX_UNIFORM_RUN_BYTES:
            self.problem = (
                f"{self.kind} data holds over {MAX_UNIFORM_RUN_BYTES // 2**20} MiB of the byte {first!r} in a row "
                f"(a decompression bomb, or a zero-filled tail); stopped after {self.decoded // 2**20:,} MiB"
            )
        elif self.decoded > RATIO_CHECKED_AFTER_BYTES and self.decoded > MAX_EXPANSION_RATIO * max(1, self._raw.tell()):
            self.problem = (
                f"{self.kind} data expands more than {MAX_EXPANSION_RATIO}:1 (a decompression bomb?); "
                f"stopped after {self.decoded // 2**20:,} MiB; decompress it yourself to read it whole"
            )

    def close(self) -> None:
        self._decoder.close()
        self._raw.close()
        super().close()


def open_binary(path: Path) -> BinaryIO:
    """Open a file for reading bytes, decompressing gzip, bz2, xz and zstd by their magic bytes.

    A compressed file ends early, never with an exception, where it is damaged: see `read_problem`.
    """
    raw = path.open("rb")
    head = raw.read(6)
    raw.seek(0)
    kind = compression_of(head)
    if kind is None:
        return raw
    try:
        if kind == "gzip":
            decoder: BinaryIO = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        elif kind == "bz2":
            decoder = bz2.BZ2File(raw)  # type: ignore[assignment]
        elif kind == "xz":
            decoder = lzma.LZMAFile(raw)  # type: ignore[assignment]  # noqa: SIM115 (closed with the stream)
        else:
            decoder = io.BufferedReader(_ZstdReader(raw))  # type: ignore[assignment]
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_Decompressed(decoder, raw, kind), 1024 * 1024)  # type: ignore[return-value]


def read_problem(stream: BinaryIO) -> str | None:
    """Why a stream from `open_binary` ended before its data did (damage or a bomb), or None."""
    return getattr(getattr(stream, "raw", None), "problem", None)


def read_head(path: Path, size: int = 4096) -> bytes:
    """The first bytes of a file after decompression; empty on any read error."""
    try:
        with open_binary(path) as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ImportError, ValueError):
        return b""


@functools.cache
def return_freed_buffers_to_the_os() -> None:
    """Have glibc map every allocation of 1 MiB or more on its own, so that a freed chunk buffer goes back
    to the OS.

    By default glibc raises its mmap threshold to the size of the largest block freed (up to 32 MiB), after
    which every 16 MiB chunk comes from the heap of the thread that read it and stays there when freed:
    peak memory then grows with the number of chunks read (measured: 330 MiB at 4 GiB of logs, 241 MiB
    at 1 GiB; with the threshold fixed, 243 and 230 MiB). The setting is process-wide, from the first
    analysis on; it has no effect elsewhere than glibc.
    """
    with contextlib.suppress(AttributeError, OSError):  # not glibc (macOS): nothing to do
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 1024 * 1024)


def find_newlines(data: np.ndarray) -> np.ndarray:
    """The positions of the newlines in `data`."""
    step = NEWLINE_SEARCH_BYTES
    if len(data) <= step:
        return np.flatnonzero(data == NEWLINE)
    return np.concatenate([np.flatnonzero(data[i : i + step] == NEWLINE) + i for i in range(0, len(data), step)])


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
    data: np.ndarray  # the bytes `lines` is built on, and each line's start plus the end (reading one line
    offsets: np.ndarray  # from them is cheaper than indexing the column; the literal search reads the bytes)

    def line_number(self, index: int) -> int:
        return self.first_line + index

    def text(self, index: int) -> str:
        start = int(self.offsets[index])
        raw = self.data[start : min(int(self.offsets[index + 1]), start + MAX_LINE_CHARS)].tobytes()
        return raw.decode("utf-8", "replace").rstrip("\r\n")


def _line_array(body: np.ndarray, ends: np.ndarray) -> tuple[pa.LargeStringArray, np.ndarray]:
    import pyarrow as pa  # here, not at the top: a run without text logs never loads Arrow (~25 MiB)

    offsets = np.empty(len(ends) + 1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:] = ends
    array = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(body))
    return array, offsets


def _line_ends(body: np.ndarray, newlines: np.ndarray) -> np.ndarray:
    ends = newlines + 1
    if len(body) and (len(ends) == 0 or ends[-1] != len(body)):
        ends = np.append(ends, len(body))
    return ends


def _as_lines(body: np.ndarray, newlines: np.ndarray) -> tuple[pl.Series, np.ndarray, np.ndarray]:
    """A string column over `body` cut after each newline (kept), its bytes, and the line start offsets.

    No byte is copied: the Arrow offsets are the newline positions and the data buffer is `body`.
    Invalid UTF-8, found by Arrow's validation, is replaced (U+FFFD) in a copy of this batch only.
    """
    import pyarrow as pa

    array, offsets = _line_array(body, _line_ends(body, newlines))
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        fixed = bytes(body).decode("utf-8", "replace").encode("utf-8")
        body = np.frombuffer(fixed, dtype=np.uint8)
        array, offsets = _line_array(body, _line_ends(body, find_newlines(body)))
    return pl.Series("line", array), body, offsets


def _fill(stream: BinaryIO, view: memoryview) -> int:
    """Read into `view` until it is full or the stream ends (a short read alone is not the end for bz2/xz)."""
    readinto = getattr(stream, "readinto", None)
    got = 0
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = stream.read(len(view) - got)
            n = len(data)
            view[got : got + n] = data
        if not n:
            break
        got += n
    return got


def iter_line_batches(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[LineBatch]:
    """Yield batches of lines, overlapping by CONTEXT_LINES on each side.

    Each chunk is read once, straight into the buffer its batch's column is built on. Memory stays
    bounded by `chunk_bytes` plus the carried context, whatever the file size.
    """
    carry = np.empty(0, dtype=np.uint8)  # context lines and the unfinished last line, copied forward
    carry_first_line = 1
    carry_own_from = 0  # lines of the carry already owned by the previous batch
    while True:
        buf = np.empty(len(carry) + chunk_bytes, dtype=np.uint8)
        buf[: len(carry)] = carry
        got = _fill(stream, memoryview(buf)[len(carry) :])
        final = got < chunk_bytes
        data = buf[: len(carry) + got]
        if len(data) == 0:
            return
        newlines = find_newlines(data)
        if final:
            cut = len(data)
        elif len(newlines):
            cut = int(newlines[-1]) + 1
        elif len(data) > 4 * chunk_bytes:  # one enormous line: cut it rather than grow forever
            cut = len(data)
        else:
            carry = data
            continue
        lines, body, offsets = _as_lines(data[:cut], newlines)
        n = len(lines)
        if final:
            yield LineBatch(carry_first_line, lines, carry_own_from, n, body, offsets)
            return
        keep = min(n, 2 * CONTEXT_LINES)
        own_end = max(carry_own_from, n - CONTEXT_LINES)
        yield LineBatch(carry_first_line, lines, carry_own_from, own_end, body, offsets)
        start_keep = n - keep
        # from `body`, which the offsets index (it differs from `data` where invalid UTF-8 was replaced)
        carry = np.concatenate((body[int(offsets[start_keep]) :], data[cut:]))
        carry_first_line += start_keep
        carry_own_from = own_end - start_keep


def prefetched(batches: Iterator[LineBatch], depth: int = 1) -> Iterator[LineBatch]:
    """The same batches, the next one read and split in a helper thread while the caller scans this one.

    Reading, newline search and validation release the GIL, so one large file keeps two cores busy.
    At most `depth` batches wait ready, so memory stays bounded.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer(batch):
                    return
            offer(done)
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            offer(exc)

    worker = threading.Thread(target=produce, name="forensics-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        worker.join()
