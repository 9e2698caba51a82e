"""Damaged and hostile run folders: partial results and a warning that names the file, never a crash or a hang.

Each test plants one kind of damage next to a line that fires a bundled rule, and checks both that the
damage is reported and that what could be read was read (the rule still fires, at the right line).
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import json
import lzma
import os
import pickle
import random
import re
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import forensics.pipeline as analyze_module
from forensics import textio
from forensics.cli import main
from forensics.discover import discover, quiet_small_files
from forensics.pipeline import analyze, load_catalogue
from forensics.report.figures import figures
from forensics.report.html import MAX_FILE_ROWS, render_html
from forensics.report.json_report import dumps, to_json_dict
from forensics.report.markdown import render_markdown
from forensics.scan import TextScanner
from forensics.sources import line_extractors
from tests.conftest import REPO
from tests.hostile import OOM_LINE, nccl_info_lines, tree_state, write_gzip_bomb
from tests.schemas import validate

FLOOD_LINES = int(os.environ.get("FORENSICS_FLOOD_LINES", "200000"))  # the one-off long run uses 10,000,000
REPORT_LIMIT_BYTES = 5 * 1024**2


def _json(run: Path) -> dict:
    result = CliRunner().invoke(main, ["analyze", str(run), "--no-html", "--json", "-", "-q"])
    assert result.exit_code == 0, result.output
    return validate(json.loads(result.stdout))


def _file(doc: dict, path: str) -> dict:
    return next(f for f in doc["run"]["files"] if f["path"] == path)


def _oom_evidence(doc: dict) -> list[tuple[str, int]]:
    return [(e["file"], e["line"]) for f in doc["findings"] if f["rule"] == "cuda-oom" for e in f["evidence"]]


def test_log_cut_mid_line_keeps_every_complete_line_and_the_fragment(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").write_bytes(f'starting\n{OOM_LINE}\nTraceback (most recent call last):\n  File "tr'.encode())
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log", 2)]
    assert _file(doc, "worker.log")["lines"] == 4


def test_truncated_gzip_gives_the_lines_before_the_cut_and_a_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    body = nccl_info_lines(20_000) + OOM_LINE.encode() + b"\n" + nccl_info_lines(3000)
    packed = gzip.compress(body)
    (run / "worker.log.gz").write_bytes(packed[: len(packed) - 40])  # the trailer and the last lines are lost
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log.gz", 20_001)]
    warning = next(w for w in doc["warnings"] if w.startswith("worker.log.gz: "))
    assert "damaged gzip data" in warning and "EOFError" in warning
    assert 20_001 < _file(doc, "worker.log.gz")["lines"] < 23_001


@pytest.mark.parametrize("compress", [bz2.compress, lzma.compress])
def test_truncated_bz2_and_xz_are_salvaged_too(tmp_path, compress):
    """bz2 decodes whole 900 kB blocks: the cut one is lost, the ones before it are kept."""
    run = tmp_path / "run"
    run.mkdir()
    packed = compress(OOM_LINE.encode() + b"\n" + nccl_info_lines(30_000))
    (run / "worker.log.z").write_bytes(packed[: len(packed) * 3 // 4])
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log.z", 1)]
    assert any(w.startswith("worker.log.z: damaged ") for w in doc["warnings"])
    assert 1 < _file(doc, "worker.log.z")["lines"] < 30_001


def test_corrupt_gzip_is_read_up_to_the_damage_and_a_bad_header_is_skipped_with_a_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    packed = bytearray(gzip.compress(OOM_LINE.encode() + b"\n" + nccl_info_lines(30_000), 6))
    for i in range(len(packed) // 2, len(packed) // 2 + 64):
        packed[i] ^= 0x5A
    (run / "flipped.log.gz").write_bytes(bytes(packed))
    (run / "header.log.gz").write_bytes(b"\x1f\x8b\x08\xff" + os.urandom(200))
    doc = _json(run)
    assert ("flipped.log.gz", 1) in _oom_evidence(doc)
    assert any(w.startswith("flipped.log.gz: damaged gzip data") for w in doc["warnings"])
    assert _file(doc, "header.log.gz")["kind"] == "skipped"
    assert any(w.startswith("header.log.gz: compressed file could not be opened") for w in doc["warnings"])


def test_a_10_gb_gzip_bomb_stops_within_megabytes_with_a_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    head = (OOM_LINE + "\n").encode() + nccl_info_lines(100)  # textual first kilobytes, then zeros
    expanded = write_gzip_bomb(run / "worker.log.gz", head, 10 * 10**9)
    assert expanded > 10 * 10**9 - 64 * 1024**2
    assert (run / "worker.log.gz").stat().st_size < 12 * 1024**2
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log.gz", 1)]
    warning = next(w for w in doc["warnings"] if w.startswith("worker.log.gz: "))
    assert "over 16 MiB of the byte b'\\x00' in a row (a decompression bomb" in warning
    assert int(re.search(r"stopped after ([\d,]+) MiB", warning)[1].replace(",", "")) <= 64


def test_a_bomb_of_zeros_only_is_skipped_as_binary_without_decompressing_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_gzip_bomb(run / "worker.log.gz", b"", 10 * 10**9)
    doc = _json(run)
    assert _file(doc, "worker.log.gz")["kind"] == "skipped"
    assert "worker.log.gz: named like text but holds binary data; skipped" in doc["warnings"]


def test_a_bomb_of_varied_text_is_stopped_by_its_expansion_ratio(tmp_path, monkeypatch):
    """xz compresses a repeated block of lines far beyond what gzip can (and beyond what real logs reach)."""
    monkeypatch.setattr(textio, "RATIO_CHECKED_AFTER_BYTES", 1024**2)
    text = nccl_info_lines(60_000)
    path = tmp_path / "flood.log.xz"
    path.write_bytes(lzma.compress(text, preset=1))
    with textio.open_binary(path) as stream:
        read = len(stream.read())
        problem = textio.read_problem(stream)
    assert problem is not None and f"expands more than {textio.MAX_EXPANSION_RATIO}:1" in problem
    assert 1024**2 < read < len(text)


def test_invalid_utf8_is_replaced_and_the_line_still_fires_its_rule(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").write_bytes(b"ok \xff\xfe\n\xc3\x28 " + OOM_LINE.encode() + b" \xed\xa0\x80\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log", 2)]
    text = next(f for f in doc["findings"] if f["rule"] == "cuda-oom")["evidence"][0]["text"]
    assert "\ufffd" in text


def test_a_50_mb_line_is_read_and_capped_and_the_next_line_is_found(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    huge = b"NCCL WARN " + b"x" * (50 * 1024**2) + b"\n"
    (run / "worker.log").write_bytes(b"first\n" + huge + OOM_LINE.encode() + b"\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("worker.log", 3)]
    assert _file(doc, "worker.log")["lines"] == 3
    assert all(len(e["text"]) <= 2000 for f in doc["findings"] for e in f["evidence"])


def test_an_nccl_info_flood_is_read_to_the_end(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "nccl.log").write_bytes(nccl_info_lines(FLOOD_LINES) + OOM_LINE.encode() + b"\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("nccl.log", FLOOD_LINES + 1)]
    assert _file(doc, "nccl.log")["lines"] == FLOOD_LINES + 1


def test_binary_named_log_is_skipped_with_a_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").write_bytes(bytes(range(256)) * 64)
    (run / "driver.log").write_text(OOM_LINE + "\n")
    doc = _json(run)
    assert _file(doc, "worker.log") | {"note": "binary content", "kind": "skipped"} == _file(doc, "worker.log")
    assert "worker.log: named like text but holds binary data; skipped" in doc["warnings"]
    assert _oom_evidence(doc) == [("driver.log", 1)]


def test_half_written_jsonl_keeps_the_complete_records(tmp_path):
    run = tmp_path / "run"
    (run / "proj").mkdir(parents=True)
    rows = [json.dumps({"step": s, "data": {"actor/pg_loss": s / 10, "critic/score/mean": 0.5}}) for s in (1, 2, 3)]
    (run / "proj" / "exp.jsonl").write_text("\n".join(rows) + '\n{"step": 4, "data": {"actor/pg_lo')
    doc = _json(run)
    assert doc["metrics"]["actor/pg_loss"]["last_step"] == 3
    assert doc["metrics"]["actor/pg_loss"]["last"] == 0.3
    assert "proj/exp.jsonl: 1 line(s) were not metric records (JSON objects with a step); skipped" in doc["warnings"]


def test_corrupt_sqlite_does_not_stop_the_analysis(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    db = run / "profile.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(2000)])
    conn.close()
    data = bytearray(db.read_bytes())
    data[100:4096] = os.urandom(3996)  # the page after the header is garbage
    db.write_bytes(bytes(data))
    (run / "driver.log").write_text(OOM_LINE + "\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("driver.log", 1)]
    entry = _file(doc, "profile.sqlite")
    assert entry["note"] or any(w.startswith("profile.sqlite: ") for w in doc["warnings"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode; the next test covers it")
def test_unreadable_file_is_listed_and_skipped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "secret.log").write_text(OOM_LINE + "\n")
    (run / "secret.log").chmod(0)
    try:
        doc = _json(run)
    finally:
        (run / "secret.log").chmod(0o644)
    assert _file(doc, "secret.log")["note"] == "not readable (permission denied)"
    assert "secret.log: not readable (permission denied)" in doc["warnings"]


def test_a_file_that_refuses_to_open_is_listed_and_skipped(tmp_path, monkeypatch):
    """What chmod 000 does for any user but root, done by making `open` refuse that one file."""
    run = tmp_path / "run"
    run.mkdir()
    locked = run / "secret.log"
    locked.write_text(OOM_LINE + "\n")
    (run / "driver.log").write_text("fine\n")
    real_open = open

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file) == os.fspath(locked):
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    run_files = discover([run])
    entry = next(f for f in run_files.files if f.rel == "secret.log")
    assert (entry.kind, entry.note) == ("skipped", "not readable (permission denied)")
    assert "secret.log: not readable (permission denied)" in run_files.warnings


def test_empty_folder_and_empty_files_give_a_report_with_a_warning(tmp_path):
    run = tmp_path / "run"
    (run / "nothing" / "here").mkdir(parents=True)
    doc = _json(run)
    assert doc["run"]["files"] == []
    assert any(w.startswith("no files to read") for w in doc["warnings"])
    (run / "empty.log").write_bytes(b"")
    (run / "newline.log").write_bytes(b"\n")
    doc = _json(run)
    assert [(f["path"], f["kind"], f["lines"]) for f in doc["run"]["files"]] == [
        ("empty.log", "log", 0),
        ("newline.log", "log", 1),
    ]


def test_links_are_not_followed_out_of_the_run_or_round_in_circles(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "other_job.log").write_text(OOM_LINE + "\n")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "run_3.log").write_text("[rank0]: fine\n" + OOM_LINE + "\n")
    (run / "latest.log").symlink_to("logs/run_3.log")  # inside: read once, under its own name
    (run / "other.log").symlink_to(outside / "other_job.log")
    (run / "elsewhere").symlink_to(outside)
    (run / "loop_a").symlink_to("loop_b")
    (run / "loop_b").symlink_to("loop_a")
    (run / "self").symlink_to(".")
    (run / "gone.log").symlink_to("missing.log")
    doc = _json(run)
    assert [f["path"] for f in doc["run"]["files"]] == ["logs/run_3.log"]
    assert _oom_evidence(doc) == [("logs/run_3.log", 2)]
    warnings = set(doc["warnings"])
    assert {
        "other.log: symbolic link out of the run folder, not followed",
        "elsewhere: symbolic link out of the run folder, not followed",
        "loop_a: symbolic link loop, not followed",
        "loop_b: symbolic link loop, not followed",
        "gone.log: symbolic link to nothing (dangling), not followed",
    } <= warnings


@contextlib.contextmanager
def _within(seconds: int, what: str):
    """Fail (instead of hanging the suite) when the block runs longer than `seconds`."""

    def hung(signum, frame):
        raise TimeoutError(f"{what} took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_is_never_opened(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: the analysis must not even try."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "pipe.log")
    (run / "driver.log").write_text(OOM_LINE + "\n")
    with _within(60, "the analysis of a folder with a FIFO"):
        a = analyze([run])
    assert "pipe.log: not a regular file (FIFO, socket or device), not read" in a.warnings
    assert [(f.rule, f.evidence[0].file) for f in a.findings] == [("cuda-oom", "driver.log")]


def test_long_padded_lines_in_environment_dumps_take_no_quadratic_time(tmp_path):
    """`key:   value` parsers with lazy groups backtrack over every run of spaces: a 200 kB line took minutes."""
    run = tmp_path / "run"
    run.mkdir()
    padded = "NUMA node0 CPU(s):" + " " * 100_000 + "0-63" + " " * 100_000 + "x"
    (run / "collect_env.txt").write_text(
        f"PyTorch version: 2.5.1+cu124\nIs debug build: False\n{padded}\nOS: Ubuntu 22.04.4 LTS (x86_64)\n"
    )
    (run / "nvidia_smi_q.txt").write_text(
        f"==============NVSMI LOG==============\n\nDriver Version                            : 550.54.15\n{padded}\n"
    )
    with _within(30, "reading environment dumps with 200 kB lines"):
        a = analyze([run])
    kinds = {f.path: f.kind for f in a.files}
    assert kinds == {"collect_env.txt": "collect_env", "nvidia_smi_q.txt": "nvidia_smi_q"}
    assert a.environment["torch_version"] == "2.5.1+cu124"
    assert a.environment["os"] == "Ubuntu 22.04.4 LTS (x86_64)"


def test_many_tiny_files_are_all_listed_and_the_report_stays_small(tmp_path):
    run = tmp_path / "run"
    count = 2000  # bench/many_files.py measures 100,000
    for i in range(count):
        folder = run / f"worker_{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"task_{i % 100:03d}.log").write_text(f"task {i} started\ntask {i} done\n")
    (run / "worker_007" / "task_042.log").write_text(OOM_LINE + "\n")
    before = tree_state(run)
    a = analyze([run])
    assert len(a.files) == count
    assert [(f.rule, f.evidence[0].file) for f in a.findings] == [("cuda-oom", "worker_007/task_042.log")]
    page = render_html(a)
    assert len(page.encode()) < REPORT_LIMIT_BYTES
    assert page.count("<tr><td><code>worker_") <= MAX_FILE_ROWS
    assert "<code>worker_007/task_042.log</code>" in page
    assert tree_state(run) == before


def test_warnings_reach_the_html_and_the_terminal(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "binary.log").write_bytes(random.Random(3).randbytes(4096).replace(b"\n", b"\x00"))
    html = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["analyze", str(run), "-o", str(html)])
    assert result.exit_code == 0, result.output
    assert "warning: binary.log: named like text but holds binary data; skipped" in " ".join(result.output.split())
    assert "<li>binary.log: named like text but holds binary data; skipped</li>" in html.read_text()


class _Planted:
    """Unpickling this would run a shell command that creates `marker`."""

    def __init__(self, marker: Path, via: str):
        self.marker = marker
        self.via = via

    def __reduce__(self):
        if self.via == "subprocess":
            return (subprocess.call, (["touch", str(self.marker)],))
        if self.via == "exec":
            return (exec, (f"open({str(self.marker)!r}, 'w').close()",))
        return (os.system, (f"touch {self.marker}",))


def test_flight_recorder_dumps_that_would_run_code_run_nothing(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(REPO / "examples" / "oom_then_timeout" / "fr", run / "fr")  # two real dumps, decodable
    markers = []
    for i, (via, protocol) in enumerate([("system", 2), ("subprocess", 4), ("exec", 5), ("system", 0)]):
        marker = tmp_path / f"created_{i}"
        markers.append(marker)
        dump = {"version": "2.10", "entries": [_Planted(marker, via)], "pg_status": {"0": {}}}
        (run / "fr" / f"evil_trace_rank_{i + 2}").write_bytes(pickle.dumps(dump, protocol=protocol))
    (run / "fr" / "state.pkl").write_bytes(pickle.dumps(_Planted(tmp_path / "created_pkl", "system")))
    markers.append(tmp_path / "created_pkl")
    before = tree_state(run)
    doc = _json(run)
    assert not [m for m in markers if m.exists()]
    assert tree_state(run) == before
    refused = [w for w in doc["warnings"] if "flight-recorder dump not decoded: refusing to load" in w]
    assert sorted(w.split(":")[0] for w in refused) == [f"fr/evil_trace_rank_{i}" for i in (2, 3, 4)]
    # protocol 0 is text (it is scanned as a log, never unpickled); a stray .pkl has no reader
    assert _file(doc, "fr/evil_trace_rank_5")["kind"] == "log"
    assert _file(doc, "fr/state.pkl")["note"] == "binary (pickle) with no reader"
    assert _file(doc, "fr/nccl_trace_rank_1")["note"].startswith("flight recorder, rank 1,")


def test_undecodable_file_names_and_lone_surrogates_reach_every_output(tmp_path):
    """Linux names are bytes (Python hands back lone surrogates for invalid UTF-8) and JSON may escape them."""
    run = tmp_path / "run"
    run.mkdir()
    odd = os.fsencode(run) + b"/worker\xff\xfe.log"
    with open(odd, "wb") as fh:
        fh.write(OOM_LINE.encode() + b"\n")
    (run / "line\nbreak.log").write_text("fine\n")
    (run / "proj").mkdir()
    (run / "proj" / "exp.jsonl").write_bytes(b'{"step": 1, "data": {"\\ud800 loss": 1.0, "raw \xed\xa0\x80": 2.0}}\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["analyze", str(run), "-o", str(out / "r.html"), "--json", str(out / "r.json"), "--md", str(out / "r.md")]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "r.json").read_text(encoding="utf-8"))
    assert [(f["rule"], f["evidence"][0]["line"]) for f in doc["findings"]] == [("cuda-oom", 1)]
    assert sorted(doc["metrics"]) == ["? loss", "raw ?"]  # replaced where they reach a table
    assert "worker" in doc["verdict"]["root_cause"]["evidence"][0]["file"]
    assert "line\nbreak.log" in [f["path"] for f in doc["run"]["files"]]


def test_skipping_small_files_that_match_nothing_changes_no_result(monkeypatch):
    """quiet_small_files only saves time: runs of many small files give the same result with and without it."""
    may_match = TextScanner(load_catalogue([]).rules, line_extractors()).may_match
    fixtures = [REPO / "tests" / "fixtures" / "runs" / name for name in ("healthy", "sigkill", "ray_worker_sigkill")]
    skipped = 0
    for run in [*fixtures, REPO / "examples" / "oom_then_timeout"]:
        skipped += len(quiet_small_files(discover([run]).files, may_match))
        with_skip = to_json_dict(analyze([run]))
        monkeypatch.setattr(analyze_module, "quiet_small_files", lambda files, may_match: {})
        without = to_json_dict(analyze([run]))
        monkeypatch.undo()
        assert with_skip == without, run.name
    assert skipped > 0  # some fixture files were in fact skipped


def test_half_written_kineto_traces_give_the_events_before_the_cut(tmp_path):
    source = sorted((REPO / "tests" / "fixtures" / "traces" / "trace_healthy").glob("*.pt.trace.json.gz"))
    run = tmp_path / "run"
    run.mkdir()
    whole = gzip.decompress(source[0].read_bytes())
    (run / "rank0.1.pt.trace.json").write_bytes(whole[: len(whole) // 2])  # the profiler died mid-write
    packed = source[1].read_bytes()
    (run / "rank1.2.pt.trace.json.gz").write_bytes(packed[: len(packed) // 2])
    (run / "rank2.3.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "dur": "x", "ts": null}, 5, []]}')
    (run / "rank3.4.pt.trace.json").write_bytes(b"")
    (run / "driver.log").write_text(OOM_LINE + "\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("driver.log", 1)]
    for name in ("rank0.1.pt.trace.json", "rank1.2.pt.trace.json.gz"):
        assert (
            f"{name}: the file ends inside `traceEvents` (truncated?); the events before it were read"
            in doc["warnings"]
        )
        assert _file(doc, name)["note"].startswith("PyTorch profiler trace: rank ")
    assert "rank3.4.pt.trace.json: no top-level `traceEvents` array" in doc["warnings"]


def _nsys_like(path: Path, wal: bool = False) -> None:
    with sqlite3.connect(path) as conn:
        if wal:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        conn.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT)")
        conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, f"kernel_{i}") for i in range(3000)])
    conn.close()


def test_an_nsys_export_is_opened_without_creating_wal_or_shm_files(tmp_path):
    """`mode=ro` alone makes SQLite create -wal and -shm beside a WAL-mode database: a write in the run."""
    run = tmp_path / "run"
    run.mkdir()
    _nsys_like(run / "profile.nsys.sqlite", wal=True)
    before = tree_state(run)
    doc = _json(run)
    assert _file(doc, "profile.nsys.sqlite")["kind"] == "nsys_sqlite"
    assert tree_state(run) == before


def test_a_corrupt_nsys_export_is_a_warning(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    db = run / "profile.nsys.sqlite"
    _nsys_like(db)
    data = bytearray(db.read_bytes())
    data[4096:] = (bytes(range(256)) * len(data))[: len(data) - 4096]  # every page after the schema is garbage
    db.write_bytes(bytes(data))
    (run / "driver.log").write_text(OOM_LINE + "\n")
    doc = _json(run)
    assert _oom_evidence(doc) == [("driver.log", 1)]
    damaged = [w for w in doc["warnings"] if w.startswith("profile.nsys.sqlite: ")]
    assert damaged and all(w.endswith("could not be read: database disk image is malformed") for w in damaged)


def test_a_finding_without_evidence_lines_still_renders_everywhere():
    """A detector can find something in the series without citing a line (the fuzzer met one in mutated data)."""
    a = analyze([REPO / "examples" / "oom_then_timeout"])
    timed = next(f for f in a.findings if f.ts is not None)
    a.findings.append(dataclasses.replace(timed, rule="memory-growth", evidence=[], count=1))
    page = render_html(a)
    assert '<span class="muted small">memory-growth · ' in page  # its row in the findings table
    hover = [t for _, fig in figures(a) for trace in fig.data for t in (trace.text or ())]
    assert "memory-growth ×1" in hover
    assert render_markdown(to_json_dict(a)) and dumps(a)


def test_binary_of_a_known_kind_under_a_text_name_is_warned_of_too(tmp_path):
    """Bytes that start like a zip archive, in a file named .log, are skipped with the same warning."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    result = CliRunner().invoke(main, ["analyze", str(run), "--no-html"])
    assert "warning: worker.log: named like text but holds binary data; skipped" in " ".join(result.output.split())
