from __future__ import annotations

import bz2
import gzip
import io
import lzma
import threading

import numpy as np
import pytest

from forensics import textio
from forensics.textio import CONTEXT_LINES, iter_line_batches, open_binary, prefetched


def _own_lines(data: bytes, chunk: int) -> list[tuple[int, str]]:
    out = []
    for batch in iter_line_batches(io.BytesIO(data), chunk_bytes=chunk):
        for i in range(batch.own_start, batch.own_end):
            out.append((batch.line_number(i), batch.text(i)))
    return out


def test_every_line_is_owned_once_with_its_number_across_chunk_boundaries():
    lines = [f"line {i} " + "x" * (i % 37) for i in range(1, 2001)]
    data = ("\n".join(lines) + "\n").encode()
    for chunk in (64, 1000, 4096, len(data) * 2):
        got = _own_lines(data, chunk)
        assert got == [(i, text) for i, text in enumerate(lines, start=1)], chunk


def test_file_without_final_newline_and_blank_lines_keep_numbers():
    data = b"a\n\nb\r\n\nlast"
    assert _own_lines(data, 3) == [(1, "a"), (2, ""), (3, "b"), (4, ""), (5, "last")]


def test_context_reaches_across_a_batch_boundary():
    lines = [f"l{i}" for i in range(1, 501)]
    data = ("\n".join(lines) + "\n").encode()
    for batch in iter_line_batches(io.BytesIO(data), chunk_bytes=700):
        for i in range(batch.own_start, batch.own_end):
            n = batch.line_number(i)
            if n <= len(lines) - CONTEXT_LINES and i + CONTEXT_LINES < len(batch.lines):
                assert batch.text(i + CONTEXT_LINES) == f"l{n + CONTEXT_LINES}"


def test_invalid_utf8_is_replaced_not_fatal():
    data = b"ok\n\xff\xfe broken \xc3\n"
    assert [t for _, t in _own_lines(data, 1024)] == ["ok", "\ufffd\ufffd broken \ufffd"]


def test_gzip_is_opened_transparently(tmp_path):
    path = tmp_path / "x.log.gz"
    path.write_bytes(gzip.compress(b"hello\nworld\n"))
    with open_binary(path) as fh:
        assert fh.read() == b"hello\nworld\n"


def _batches(batches) -> list[tuple[int, int, int, list[str]]]:
    return [(b.first_line, b.own_start, b.own_end, b.lines.to_list()) for b in batches]


def test_read_ahead_yields_the_same_batches():
    data = ("\n".join(f"line {i} " + "y" * (i % 53) for i in range(20000)) + "\n").encode()
    plain = _batches(iter_line_batches(io.BytesIO(data), chunk_bytes=8192))
    assert len(plain) > 10
    assert _batches(prefetched(iter_line_batches(io.BytesIO(data), chunk_bytes=8192))) == plain


def test_read_ahead_stops_its_thread_when_the_reader_stops_early():
    data = b"x\n" * 100_000
    before = threading.active_count()
    batches = prefetched(iter_line_batches(io.BytesIO(data), chunk_bytes=1024))
    next(batches)
    batches.close()
    assert threading.active_count() == before


def test_read_ahead_raises_the_reading_error_in_the_reader():
    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            raise OSError("Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        list(prefetched(iter_line_batches(Failing())))


@pytest.mark.parametrize(("suffix", "compress"), [(".bz2", bz2.compress), (".xz", lzma.compress)])
def test_compressed_streams_are_read_whole_across_short_reads(tmp_path, suffix, compress):
    lines = [f"{i} " + "z" * (i % 97) for i in range(8000)]
    path = tmp_path / f"x.log{suffix}"
    path.write_bytes(compress(("\n".join(lines) + "\n").encode()))
    with open_binary(path) as fh:
        got = [
            (b.line_number(i), b.text(i)) for b in iter_line_batches(fh, 4096) for i in range(b.own_start, b.own_end)
        ]
    assert got == list(enumerate(lines, start=1))


def test_a_compressed_file_stops_at_the_size_limit_and_a_plain_one_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(textio, "MAX_DECOMPRESSED_BYTES", 10_000)
    lines = [f"line {i}".encode() for i in range(5_000)]  # ~50 kB, varied: no bomb by run or ratio
    (tmp_path / "x.log").write_bytes(b"\n".join(lines))
    (tmp_path / "x.log.gz").write_bytes(gzip.compress(b"\n".join(lines)))
    with open_binary(tmp_path / "x.log") as plain:
        assert sum(b.own_end - b.own_start for b in iter_line_batches(plain, chunk_bytes=1024)) == 5_000
        assert textio.read_problem(plain) is None
    with open_binary(tmp_path / "x.log.gz") as packed:
        read = sum(b.own_end - b.own_start for b in iter_line_batches(packed, chunk_bytes=1024))
        assert 0 < read < 5_000
        assert "decompresses past" in textio.read_problem(packed)


def test_invalid_utf8_across_batch_edges_keeps_every_line_and_number():
    lines = [(f"{i} ok" if i % 7 else f"{i} bad \xff\xfe end").encode("latin-1") for i in range(1, 3001)]
    data = b"\n".join(lines) + b"\n"
    expected = [(i, line.decode("utf-8", "replace")) for i, line in enumerate(lines, start=1)]
    for chunk in (700, 4096):
        assert _own_lines(data, chunk) == expected
        batches = list(iter_line_batches(io.BytesIO(data), chunk_bytes=chunk))
        assert all(b.lines[i].rstrip("\n") == b.text(i) for b in batches for i in range(len(b.lines)))


def test_newlines_found_slice_by_slice_are_all_the_newlines():
    rng = np.random.default_rng(3)
    data = rng.choice(np.array([10, 65, 66], dtype=np.uint8), size=3 * textio.NEWLINE_SEARCH_BYTES + 17)
    data[textio.NEWLINE_SEARCH_BYTES - 1 : textio.NEWLINE_SEARCH_BYTES + 1] = 10  # on both sides of a slice edge
    assert np.array_equal(textio.find_newlines(data), np.flatnonzero(data == 10))
    assert len(textio.find_newlines(data[:0])) == 0
