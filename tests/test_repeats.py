"""Repeats of a line are counted into one event: memory grows with distinct events, not with lines."""

from __future__ import annotations

import functools
import json

import polars as pl
import pytest

from forensics import scan as scan_module
from forensics.pipeline import analyze
from forensics.textio import iter_line_batches

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.42 GiB. GPU 1 has a total capacity of 79.19 GiB"


def _spill(i: int, pid: int) -> str:
    return (
        f"[2025-10-16 02:{i // 60 % 60:02d}:{i % 60:02d},{i % 1000:03d} I {pid} {pid + 7}] (raylet) "
        f"local_object_manager.cc:245: :info_message:Spilled {100 + i % 900} MiB, {1 + i % 9} objects, "
        f"write throughput {50 + i % 400} MiB/s."
    )


@pytest.fixture
def flooded(tmp_path):
    """2,000 spill lines of one raylet, 3 of another, a CUDA OOM between them."""
    lines = [_spill(i, 4242) for i in range(1000)] + [_spill(5, 777), OOM]  # pid 777: another raylet
    lines += [_spill(i, 4242) for i in range(1000, 2000)] + [_spill(6, 777), _spill(7, 777)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "raylet.out").write_text("\n".join(lines) + "\n")
    return run


def _spill_events(a) -> list[dict]:
    events = a.events.filter(pl.col("fields").str.contains('"ray-object-spilling"', literal=True))
    return [{"line": row["line"], **json.loads(row["fields"])} for row in events.iter_rows(named=True)]


@pytest.mark.parametrize("chunk", [None, 4096])
def test_repeats_become_one_event_per_origin_with_their_count_and_last_line(flooded, monkeypatch, chunk):
    if chunk:  # many batches: repeats are counted across them
        monkeypatch.setattr(scan_module, "iter_line_batches", functools.partial(iter_line_batches, chunk_bytes=chunk))
    a = analyze([flooded])
    events = _spill_events(a)
    assert [(e["line"], e["repeats"]["count"], e["repeats"]["last_line"]) for e in events] == [
        (1, 2000, 2002),
        (1001, 3, 2004),
    ]
    assert events[0]["repeats"]["last_ts"] == "2025-10-16 02:33:19.999000+00:00".replace(" ", "T")
    assert (events[0]["spilled_mib"], events[0]["spilled_objects"]) == ("100", "1")  # the first line's values
    spills = [f for f in a.findings if f.rule == "ray-object-spilling"]
    assert sum(f.count for f in spills) == 2003
    assert a.verdict.root_cause.rule == "cuda-oom"


def test_lines_that_differ_in_more_than_numbers_stay_apart(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [_spill(1, 42), _spill(2, 42).replace("MiB/s.", "MiB/s (to s3://bucket)."), _spill(3, 42), OOM]
    (run / "raylet.out").write_text("\n".join(lines) + "\n")
    events = _spill_events(analyze([run]))
    assert [(e["line"], e.get("repeats", {}).get("count", 1)) for e in events] == [(1, 2), (2, 1)]


def test_a_workers_exception_flood_folds_but_a_drivers_chains_keep_their_tasks(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    flood = [
        f"(WorkerDict pid=9, ip=10.0.0.9) ConnectionResetError: [Errno 104] Connection reset by peer (attempt {i})"
        for i in range(500)
    ]
    chain = [
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() "
        "(pid={pid}, ip=10.0.0.{pid}, actor_id=81d55abbf97898da3aaf337e01000000, repr=<WorkerDict object>)",
        '  File "/opt/verl/verl/workers/fsdp_workers.py", line 810, in update_actor',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB",
    ]
    lines = flood + [x.format(pid=101) for x in chain] + [x.format(pid=202) for x in chain]
    (run / "driver.log").write_text("\n".join(lines) + "\n")
    events = analyze([run]).events.filter(pl.col("kind") == "exception")
    fields = [json.loads(f) for f in events["fields"].to_list()]
    reset = [f for f in fields if f["exception"] == "ConnectionResetError"]
    assert [f["repeats"]["count"] for f in reset] == [500]
    oom = [f for f in fields if f["exception"] == "OutOfMemoryError"]
    assert [f.get("task_pid") for f in oom] == [101, 202]


def test_repeats_under_other_ranks_wrappers_stay_apart(tmp_path):
    """MPI's `[1,R]<stdout>:` and srun's `R: ` name the rank that printed a line: its repeats are counted per rank."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [f"[1,{rank}]<stdout>: {_spill(i, 42)}" for i in range(6) for rank in (0, 1)]
    lines += [f"{rank}: {_spill(i, 42)}" for i in range(6) for rank in (2, 3)] + [OOM]
    (run / "mpi.log").write_text("\n".join(lines) + "\n")
    a = analyze([run])
    events = a.events.filter(pl.col("fields").str.contains('"ray-object-spilling"', literal=True))
    counts = {row["rank"]: json.loads(row["fields"])["repeats"]["count"] for row in events.iter_rows(named=True)}
    assert counts == {0: 6, 1: 6, 2: 6, 3: 6}


def test_an_exception_below_a_traceback_or_a_retry_report_is_read_on_its_own(tmp_path):
    """Its event reads the lines above it (frames, Ray's report of a retried attempt): only a bare repeat, below an
    ordinary line, is counted into an earlier bare one's event; a failure is never counted into a retried attempt,
    nor one with its own traceback into a bare one."""
    run = tmp_path / "run"
    run.mkdir()
    attempt = [
        "(raylet) Task f failed. There are 1 retries remaining, so the task will be retried. Error: User exception:",
        "ray::f() (pid=9054, ip=192.0.2.2)",
        '  File "/app/reward.py", line 442, in f',
        "ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=8000): Max retries exceeded",
    ]
    failure = [
        "Traceback (most recent call last):",
        '  File "/app/main.py", line 12, in main',
        "ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=8000): Max retries exceeded",
    ]
    bare = ["INFO driver: reward server still down", attempt[-1]] * 3
    worker = "(WorkerDict pid=8667, ip=192.0.2.2) "  # a worker's lines: a driver's exceptions are never folded
    (run / "driver.log").write_text("\n".join(worker + line for line in attempt + bare + failure) + "\n")
    events = analyze([run]).events.filter(pl.col("kind") == "exception")
    got = [(row["line"], json.loads(row["fields"])) for row in events.iter_rows(named=True)]
    assert [(line, f.get("retried", False), f.get("repeats", {}).get("count", 1)) for line, f in got] == [
        (4, True, 1),
        (6, False, 3),
        (13, False, 1),
    ]
    assert got[2][1]["frames"] == ["/app/main.py:main"]
