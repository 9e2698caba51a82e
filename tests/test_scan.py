from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics import prefilter
from forensics import scan as scan_module
from forensics.pipeline import load_catalogue
from forensics.scan import LOOKBACK_LINES, TextScanner
from forensics.sources import line_extractors
from forensics.sources.base import Sink
from forensics.textio import iter_line_batches


def _scanner(extra_rules: Path | None = None) -> TextScanner:
    rules = load_catalogue([extra_rules] if extra_rules else []).rules
    return TextScanner(rules, line_extractors())


def _dispatched(scanner: TextScanner, data: bytes, chunk: int) -> set[tuple[int, int]]:
    """(line number, pattern index) of every line the scanner hands to a pattern."""
    index = {id(p): i for i, p in enumerate(scanner.patterns)}
    found = set()
    for batch in iter_line_batches(io.BytesIO(data), chunk_bytes=chunk):
        for pos, text, patterns in scanner.hits(batch):
            assert text == batch.text(pos)
            found.update((batch.line_number(pos), index[id(p)]) for p in patterns)
    return found


def _brute_force(scanner: TextScanner, data: bytes) -> set[tuple[int, int]]:
    """The same, the slow way: every pattern in Rust over every line (and what an extractor requires too)."""
    lines = pl.Series(data.decode("utf-8", "replace").split("\n"))
    found = set()
    for i, pattern in enumerate(scanner.patterns):
        hit = lines.str.contains(f"(?m){pattern.rust}")
        if pattern.extractor is not None and pattern.extractor.requires is not None:
            hit = hit & lines.str.contains(f"(?m){pattern.extractor.requires}")
        for row in hit.arg_true().to_list():
            found.add((row + 1, i))
    return found


@pytest.fixture(params=["hyperscan", "polars"])
def engine(request, monkeypatch) -> str:
    """Each literal engine in turn (hyperscan only where its wheel installs)."""
    if request.param == "hyperscan" and prefilter.hyperscan is None:
        pytest.skip("hyperscan is not installed on this platform")
    monkeypatch.setenv(prefilter.ENGINE_VARIABLE, request.param)
    return request.param


@pytest.mark.parametrize("python_tests_max", [0, 10**9])  # polars: literals found in Rust, or in Python
def test_prefilter_and_dispatch_find_what_every_pattern_finds_on_real_logs(
    corpus, monkeypatch, engine, python_tests_max
):
    monkeypatch.setattr(prefilter, "LITERAL_TESTS_IN_PYTHON_MAX", python_tests_max)
    scanner = _scanner()
    assert type(scanner.finder).__name__.lower().startswith(engine)
    data = b"".join(p.read_bytes() for p in sorted((corpus / "cases").glob("*.log")))
    expected = _brute_force(scanner, data)
    assert len(expected) > 40
    for chunk in (2048, 1 << 20):  # batch edges anywhere, and one batch
        assert _dispatched(scanner, data, chunk) == expected


def test_user_rules_without_literals_or_case_insensitive_still_match(tmp_path, engine):
    area = tmp_path / "site"
    area.mkdir()
    rule = """\
id: {id}
title: t
class: hang
severity: warning
layer: script
description: d
match:
  - regex: '{regex}'
examples:
  match: ['{example}']
  no_match: ['all is well']
"""
    (area / "slow-step.yaml").write_text(rule.format(id="slow-step", regex=r"^\d{4,} ms$", example="12345 ms"))
    (area / "nccl-stall.yaml").write_text(
        rule.format(id="nccl-stall", regex="(?i)nccl stalled", example="NCCL Stalled")
    )
    scanner = _scanner(area)
    lines = ["12 ms", "NCCL INFO fine", "123456 ms", "[rank1] Nccl STALLED for 30 s", "step:3 - a/b:1"]
    data = ("\n".join(lines) + "\n").encode()
    by_rule = {}
    for line, i in _dispatched(scanner, data, 1 << 20):
        if scanner.patterns[i].rule is not None:
            by_rule.setdefault(scanner.patterns[i].rule.id, set()).add(line)
    assert by_rule == {"slow-step": {3}, "nccl-stall": {4}}


def test_many_candidates_are_told_apart_by_literals_found_in_rust_without_losing_hits(engine):
    scanner = _scanner()
    noise = [f"WARNING no Error here {i}, just a word" for i in range(3 * prefilter.LITERAL_TESTS_IN_PYTHON_MAX)]
    hits = ["ValueError: bad value", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    half = len(noise) // 2
    data = ("\n".join(noise[:half] + hits[:1] + noise[half:] + hits[1:]) + "\n").encode()
    got = _dispatched(scanner, data, 1 << 20)
    assert {line for line, _ in got} == {half + 1, len(noise) + 2}
    assert got == _brute_force(scanner, data)


def test_patterns_searched_in_full_find_their_lines_with_either_engine(engine):
    scanner = _scanner()
    in_full = {
        scanner.patterns[i].rule.id if scanner.patterns[i].rule else scanner.patterns[i].extractor.name
        for i in scanner._searched_patterns
    }
    assert {"nccl-return-chain", "rank_measurements"} <= in_full  # " -> " and words in most lines
    assert (scanner._line_regexes.fallback == []) is (engine == "hyperscan")
    lines = [
        "dgxa100:1050:1316 [0] NCCL INFO include/net.h:25 -> 2",  # the rule's examples (real NCCL output)
        "dgxa100:1050:1316 [0] NCCL INFO transport/net.cc:515 -> 2",
        "node1:12:34 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        "Rank 3 has data 1024 time cost 23.3 bandwidth 17.1",
        "[rank1]: allreduce took 2.8 ms",
        "rank",  # the trigger's \s may cross a line in Hyperscan: no line is found for it
        "3 took 5 ms",
    ]
    data = ("\n".join(lines) + "\n").encode()
    got = _dispatched(scanner, data, 1 << 20)
    assert got == _brute_force(scanner, data)
    named = {
        (line, scanner.patterns[i].rule.id if scanner.patterns[i].rule else scanner.patterns[i].extractor.name)
        for line, i in got
    }
    assert {
        (1, "nccl-return-chain"),
        (2, "nccl-return-chain"),
        (4, "rank_measurements"),
        (5, "rank_measurements"),
    } <= named
    assert not {n for n in named if n[0] in (3, 6, 7) and n[1] in in_full}


@pytest.mark.parametrize("healthy", [3, 300])  # the further literals tested in Python, then in Rust
def test_lines_without_a_patterns_further_literals_are_not_tried(engine, healthy):
    scanner = _scanner()
    step = "step:{} - actor/pg_loss:0.0123 - actor/grad_norm:{} - critic/vf_loss:0.52 - response_length/mean:311.5"
    lines = [step.format(i, 0.87) for i in range(healthy)] + [step.format(healthy, "nan")]
    data = ("\n".join(lines) + "\n").encode()
    batch = next(iter_line_batches(io.BytesIO(data), chunk_bytes=1 << 20))
    rows, tried = scanner._candidates(batch)
    non_finite = {i for i, p in enumerate(scanner.patterns) if p.rule is not None and p.rule.id == "non-finite-loss"}
    assert set(rows[np.isin(tried, list(non_finite))].tolist()) == {healthy}  # only the nan line is tried
    got = _dispatched(scanner, data, 1 << 20)
    assert got == _brute_force(scanner, data)
    assert {line for line, i in got if i in non_finite} == {healthy + 1}


def _events(scanner: TextScanner, path: Path, rel: str, **kwargs) -> pl.DataFrame:
    sink = Sink()
    lines, warnings = scanner.scan(path, rel, sink, **kwargs)
    assert warnings == []
    return sink.events().with_columns(pl.lit(lines).alias("lines_read"))


def test_events_do_not_depend_on_batch_size_or_read_ahead(corpus, monkeypatch):
    scanner = _scanner()
    path = corpus / "cases" / "011_nccl_timeout.log"
    whole = _events(scanner, path, "x.log")
    assert whole.height > 3
    for chunk in (512, 4096):
        monkeypatch.setattr(scan_module, "iter_line_batches", functools.partial(iter_line_batches, chunk_bytes=chunk))
        assert _events(scanner, path, "x.log").equals(whole)
        assert _events(scanner, path, "x.log", read_ahead=True).equals(whole)


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_read_error_mid_file_is_a_warning_with_the_line_reached(tmp_path, monkeypatch, read_ahead):
    path = tmp_path / "x.log"
    path.write_bytes(b"line\n" * 5000)

    def failing(stream, chunk_bytes=1024):
        for n, batch in enumerate(iter_line_batches(stream, chunk_bytes=chunk_bytes)):
            if n == 3:
                raise OSError("Input/output error")
            yield batch

    monkeypatch.setattr(scan_module, "iter_line_batches", failing)
    lines, warnings = _scanner().scan(path, "x.log", Sink(), read_ahead=read_ahead)
    assert warnings == [f"x.log: read stopped at line {lines}: OSError: Input/output error"]
    assert 0 < lines < 5000


def _oom_run(tmp_path: Path, gap: int) -> pl.DataFrame:
    lines = [
        "2025-10-16 02:08:01,120 - verl.workers.fsdp_workers - INFO - step 63: update_actor micro batch 3/8",
        *["gpu-a018:3276835:3276875 [1] NCCL INFO AllReduce: opCount 1a2 count 1024 datatype 7"] * gap,
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/workers/actor/dp_actor.py", line 432, in update_policy',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.42 GiB. GPU 1 has a total capacity of "
        "79.19 GiB of which 2.31 GiB is free.",
    ]
    path = tmp_path / "stderr.log"
    path.write_text("\n".join(lines) + "\n")
    return _events(_scanner(), path, "torchrun_logs/r/attempt_0/145/stderr.log")


def test_an_undated_error_takes_the_time_of_the_stamped_line_above_it(tmp_path):
    events = _events_with_rule(_oom_run(tmp_path, gap=20), "cuda-oom")
    assert events.select("line", "rank", "ts_inferred").row(0) == (24, 145, True)
    assert str(events["ts"][0]) == "2025-10-16 02:08:01.120000+00:00"


def test_a_time_further_up_than_the_lookback_is_not_borrowed(tmp_path):
    events = _events_with_rule(_oom_run(tmp_path, gap=LOOKBACK_LINES + 5), "cuda-oom")
    assert events.select("ts", "ts_inferred").row(0) == (None, False)


def _events_with_rule(events: pl.DataFrame, rule_id: str) -> pl.DataFrame:
    return events.filter(pl.col("fields").str.contains(f'"{rule_id}"', literal=True))


def test_whole_files_that_may_match_are_told_from_those_that_cannot(tmp_path, engine):
    area = tmp_path / "site"
    area.mkdir()
    (area / "slow-step.yaml").write_text(
        "id: slow-step\ntitle: t\nclass: hang\nseverity: warning\nlayer: script\ndescription: d\n"
        "match:\n  - regex: '^\\d{5,}$'\nexamples:\n  match: ['12345']\n  no_match: ['12']\n"
    )
    scanner = _scanner(area)
    assert scanner.unfiltered is not None  # a rule with no literal: its own regex is searched
    texts = [b"all is well\n12\n", b"ok\n123456\nok\n", b"x\n[rank1] double-BIT ECC error\n", b""]
    assert scanner.may_match(texts) == [False, True, True, False]
    # rank_measurements has no literal search (LineExtractor.literal_prefilter): its trigger and what it requires
    # are searched in the whole text, both needed
    texts = [b"x\n[rank3] allreduce took 2.8 ms\n", b"rank 3 of 512 is ready\n", b"the job took 2.8 ms\n"]
    assert scanner.may_match(texts) == [True, False, False]
