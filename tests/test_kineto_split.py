"""The byte-level splitter of `traceEvents` against Python's json module on the hard cases."""

from __future__ import annotations

import io
import json

import pytest

from forensics.sources.kineto import _marker_starts, _parse_block, _Split, split_trace_events

AWKWARD_NAMES = [
    'aten::copy_ "quoted" [1, 2] {x}, y',
    "ends with a backslash \\",
    'escaped backslash then quote \\\\" inside',
    "newline\nin a string, and a tab\t",
    "ProfilerStep#3",
    "unicode ∑ é",
]


def _document(indent: int | None) -> tuple[bytes, list[dict]]:
    events = [
        {
            "ph": "X",
            "cat": "kernel" if i % 3 else "cpu_op",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": float(i),
            "dur": 1.5,
            "args": {"k": [1, {"a": name}]},
        }
        for i, name in enumerate(AWKWARD_NAMES * 20)
    ]
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
        "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
        "traceEvents": events,
        "traceName": "x [not an event]",
        "baseTimeNanoseconds": 1700000000000000000,
    }
    return json.dumps(doc, indent=indent, ensure_ascii=False).encode(), events


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk", [97, 1 << 20])
def test_every_event_and_the_surrounding_keys_come_back(indent: int | None, chunk: int):
    raw, events = _document(indent)
    split = _Split()
    bad = [0]
    frames = [_parse_block(block, bad) for block in split_trace_events(io.BytesIO(raw), split, chunk)]
    names = [n for f in frames for n in f.get_column("name").to_list()]
    assert names == [e["name"] for e in events if e["cat"] == "kernel"]  # CPU operators are dropped unparsed
    assert bad == [0] and split.closed and split.warnings == []
    rest = json.loads(split.head + b"[]" + split.tail)
    assert rest["distributedInfo"]["rank"] == 1 and rest["traceName"] == "x [not an event]"


def test_truncated_array_keeps_what_came_before_and_warns():
    raw, events = _document(2)
    split = _Split()
    frames = [_parse_block(b, [0]) for b in split_trace_events(io.BytesIO(raw[: len(raw) // 2]), split, 1024)]
    read = sum(f.height for f in frames)
    assert 0 < read < len(events)
    assert not split.closed and "truncated" in split.warnings[0]


def test_not_a_trace():
    split = _Split()
    assert list(split_trace_events(io.BytesIO(b'{"a": [1, 2, 3]}'), split)) == []
    assert split.warnings == ["no top-level `traceEvents` array"]


@pytest.mark.parametrize("pad", range(8))
def test_markers_are_found_at_every_alignment_and_at_the_very_end(pad: int):
    region = b" " * pad + b'{"cat": "kernel"}, {"name": "ProfilerStep#12"}, {"cat": "kerne", "x": "Mem"}, "Memset"'
    starts = _marker_starts(region)
    assert [region[p : p + 8] for p in starts] == [b'"kernel"', b"Profiler", b'"Memset"']
    assert starts[0] == pad + 8 and starts[-1] == len(region) - 8
