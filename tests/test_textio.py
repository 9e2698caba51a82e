from __future__ import annotations

import gzip
import io

from forensics.textio import CONTEXT_LINES, iter_line_batches, open_binary


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
