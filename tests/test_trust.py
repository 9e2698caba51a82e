"""Nothing read is not healthy: empty, unreadable, archived, several runs, a hang ended by Ctrl-C, unrelated files.

Each case gets the status `inconclusive` with a reason (or, for an archive, the same verdict as its folder),
never a green `healthy` and never a confident failure, and the exit status follows the one convention:
0 done, 1 a --fail-on gate, 2 bad usage or unreadable input.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import main
from tests.conftest import REPO
from tests.hostile import OOM_LINE
from tests.schemas import validate

EXAMPLE = REPO / "examples" / "oom_then_timeout"
RUNS = REPO / "tests" / "fixtures" / "runs"
HANG = RUNS / "ray_hang_interrupt"


def _analyze(*args: str) -> tuple[int, dict, str]:
    """Exit status, the JSON document (validated against its schema) and the terminal output of `analyze`."""
    result = CliRunner().invoke(main, ["analyze", *args, "--no-html", "--json", "-"])
    doc = json.loads(result.stdout[: result.stdout.rindex("}") + 1]) if "{" in result.stdout else {}
    return result.exit_code, validate(doc) if doc else doc, result.stderr


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR of its own, to see what archives leave behind."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr("tempfile.tempdir", None)
    return folder


# ---------------------------------------------------------------- empty


def test_an_empty_folder_is_inconclusive_and_can_be_gated(tmp_path: Path):
    (tmp_path / "run" / "sub").mkdir(parents=True)
    code, doc, _ = _analyze(str(tmp_path / "run"))
    assert code == 0
    verdict = doc["verdict"]
    assert (verdict["status"], verdict["reason"]["code"], verdict["root_cause"]) == ("inconclusive", "empty", None)
    assert verdict["reason"]["text"].startswith("Nothing to read")
    quiet = ["analyze", str(tmp_path / "run"), "--no-html", "-q", "--fail-on"]
    assert CliRunner().invoke(main, [*quiet, "inconclusive"]).exit_code == 1
    assert CliRunner().invoke(main, [*quiet, "info"]).exit_code == 0, "a severity gate alone does not trip on it"
    both = CliRunner().invoke(main, ["analyze", str(EXAMPLE), "--no-html", "-q", "--fail-on", "critical,inconclusive"])
    assert both.exit_code == 1, "a gate on a severity still trips beside inconclusive"


def test_empty_files_are_inconclusive(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "driver.log").write_bytes(b"")
    (run / "worker.err").write_bytes(b"")
    code, doc, _ = _analyze(str(run))
    assert (code, doc["verdict"]["reason"]["code"]) == (0, "empty")
    assert "driver.log, worker.err" in doc["verdict"]["reason"]["text"]


# ---------------------------------------------------------------- unreadable


def test_a_run_of_damaged_files_is_unreadable_input_with_exit_2(tmp_path: Path):
    """Real logs cut inside their compressed header: nothing can be decoded, so nothing was analysed."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("driver.log", "torchrun_logs/none_2ia4957z/attempt_0/1/stderr.log"):
        packed = gzip.compress((EXAMPLE / name).read_bytes())
        (run / f"{Path(name).name}.gz").write_bytes(packed[:6])
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["analyze", str(run), "-o", str(out / "r.html"), "--json", str(out / "r.json")])
    assert result.exit_code == 2, result.output
    doc = validate(json.loads((out / "r.json").read_text(encoding="utf-8")))
    reason = doc["verdict"]["reason"]
    assert (doc["verdict"]["status"], reason["code"]) == ("inconclusive", "unreadable")
    assert "None of the 2 file(s) could be read" in reason["text"]
    assert "compressed file could not be opened" in reason["text"]
    assert "INCONCLUSIVE" in result.output and "No verdict:" in result.output
    assert "No verdict: unreadable" in (out / "r.html").read_text(encoding="utf-8"), "the report says it too"


def test_files_that_refuse_to_open_are_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """What chmod 000 does for any user but root, done by making `open` refuse the run's files."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("driver.log", "worker.out"):
        (run / name).write_text(OOM_LINE + "\n")
    real_open = open

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file).startswith(os.fspath(run)):
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    code, doc, _ = _analyze(str(run))
    assert (code, doc["verdict"]["status"], doc["verdict"]["reason"]["code"]) == (2, "inconclusive", "unreadable")
    assert "permission denied" in doc["verdict"]["reason"]["text"]
    assert doc["findings"] == [], "the OOM lines were never read, so nothing can be claimed about them"


def test_one_readable_file_is_enough_for_a_verdict(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "broken.log.gz").write_bytes(gzip.compress(b"x" * 100)[:6])
    (run / "driver.log").write_text(OOM_LINE + "\n")
    code, doc, _ = _analyze(str(run))
    assert (code, doc["verdict"]["status"], doc["verdict"]["reason"]) == (0, "failed", None)


# ---------------------------------------------------------------- tarballs


def _pack(source: Path, target: Path, mode: str, arcname: str | None) -> Path:
    with tarfile.open(target, mode) as tar:
        tar.add(source, arcname=arcname if arcname is not None else source.name)
    return target


def _essentials(doc: dict) -> dict:
    v = doc["verdict"]
    return {
        "status": v["status"],
        "root": {k: v["root_cause"][k] for k in ("class", "rule", "rank", "step", "evidence")},
        "files": [(f["path"], f["kind"], f["lines"], f["events"], f["samples"]) for f in doc["run"]["files"]],
        "findings": [(f["rule"], f["rank"], f["count"]) for f in doc["findings"]],
        "metrics": doc["metrics"],
    }


@pytest.mark.parametrize("suffix, mode", [(".tgz", "w:gz"), (".tar.gz", "w:gz"), (".tar", "w"), (".tar.xz", "w:xz")])
def test_a_tarball_of_a_run_folder_reads_as_the_folder(tmp_path: Path, private_tmp: Path, suffix: str, mode: str):
    _, folder, _ = _analyze(str(EXAMPLE))
    archive = _pack(EXAMPLE, tmp_path / f"oom_then_timeout{suffix}", mode, None)
    code, doc, _ = _analyze(str(archive))
    assert code == 0
    assert _essentials(doc) == _essentials(folder), "same files, same names, same verdict and evidence"
    assert doc["run"]["name"] == "oom_then_timeout" and doc["run"]["path"] == str(archive)
    assert list(private_tmp.iterdir()) == [], "the unpacked members are removed after the analysis"


def test_a_tarball_of_a_folders_contents_and_one_inside_a_run(tmp_path: Path, private_tmp: Path):
    _, folder, _ = _analyze(str(EXAMPLE))
    contents = _pack(EXAMPLE, tmp_path / "contents.tar.gz", "w:gz", ".")  # tar czf contents.tar.gz -C run .
    code, doc, _ = _analyze(str(contents))
    assert code == 0 and _essentials(doc) == _essentials(folder)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(contents, run / "logs.tar.gz")
    (run / "driver.log").write_text("fine\n")
    code, doc, _ = _analyze(str(run))
    nested = next(f for f in doc["run"]["files"] if f["path"] == "logs.tar.gz")
    assert nested["kind"] == "skipped" and "a run of its own" in nested["note"]


def _member(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **extra) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in extra.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_hostile_archive_members_are_listed_and_never_written(tmp_path: Path, private_tmp: Path):
    archive = tmp_path / "evil.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        _member(tar, "run/driver.log", data=(OOM_LINE + "\n").encode())
        _member(tar, "run/../../escaped.log", data=b"owned\n")
        _member(tar, "/tmp/absolute.log", data=b"owned\n")
        _member(tar, "run/passwd", tarfile.SYMTYPE, linkname="/etc/passwd")
        _member(tar, "run/hard", tarfile.LNKTYPE, linkname="run/driver.log")
        _member(tar, "run/fifo", tarfile.FIFOTYPE)
        _member(tar, "run/null", tarfile.CHRTYPE, devmajor=1, devminor=3)
        _member(tar, "run/driver.log", data=b"a second copy\n")
    code, doc, _ = _analyze(str(archive))
    assert code == 0
    assert [(f["path"], f["lines"]) for f in doc["run"]["files"]] == [("driver.log", 1)]
    assert doc["verdict"]["root_cause"]["rule"] == "cuda-oom"
    warned = {w.split(": ")[1]: w.split(": ", 2)[2] for w in doc["warnings"] if w.startswith("evil.tgz: ")}
    assert warned == {
        "run/../../escaped.log": "path outside the archive (absolute or with ..), not read",
        "/tmp/absolute.log": "path outside the archive (absolute or with ..), not read",
        "run/passwd": "link in the archive, not followed",
        "run/hard": "link in the archive, not followed",
        "run/fifo": "not a regular file (FIFO or device), not read",
        "run/null": "not a regular file (FIFO or device), not read",
        "run/driver.log": "appears twice in the archive; the first copy was read",
    }
    assert not (tmp_path / "escaped.log").exists() and not Path("/tmp/absolute.log").exists()
    assert list(private_tmp.iterdir()) == []


def test_a_tarball_bomb_stops_and_a_truncated_one_gives_what_it_holds(tmp_path: Path, private_tmp: Path):
    bomb = tmp_path / "bomb.tgz"
    with tarfile.open(bomb, "w:gz") as tar:
        _member(tar, "run/driver.log", data=(OOM_LINE + "\n").encode())
        info = tarfile.TarInfo("run/zeros.log")
        info.size = 64 * 1024**2
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert bomb.stat().st_size < 200 * 1024
    code, doc, _ = _analyze(str(bomb))
    assert code == 0 and doc["verdict"]["root_cause"]["rule"] == "cuda-oom", "what came before the bomb was read"
    assert any("decompression bomb" in w for w in doc["warnings"]), doc["warnings"]
    zeros = next(f for f in doc["run"]["files"] if f["path"] == "zeros.log")
    assert zeros["bytes"] < 32 * 1024**2, "unpacking stopped at the bomb, not after it"

    whole = _pack(EXAMPLE, tmp_path / "whole.tgz", "w:gz", None).read_bytes()
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(whole[: len(whole) // 2])
    code, doc, _ = _analyze(str(cut))
    assert code == 0 and doc["run"]["files"], "the members before the cut are read"
    assert any("cut.tgz: damaged gzip data" in w for w in doc["warnings"]), doc["warnings"]
    assert list(private_tmp.iterdir()) == []


# ---------------------------------------------------------------- a folder of runs


def test_a_folder_of_runs_is_refused_with_the_way_out():
    result = CliRunner().invoke(main, ["analyze", str(RUNS), "--no-html"])
    assert result.exit_code == 2
    runs = sorted(p.name for p in RUNS.iterdir() if p.is_dir())
    assert f"holds {len(runs)} runs ({', '.join(runs[:5])} and {len(runs) - 5} more)" in result.output
    assert f"forensics batch {RUNS} --out DIR" in result.output
    assert "parts of ONE run" in result.output
    for command in ("check", "diff"):
        args = [command, str(RUNS)] + ([str(EXAMPLE), "--no-html"] if command == "diff" else [])
        assert CliRunner().invoke(main, args).exit_code == 2, command


def test_the_parts_of_one_run_are_not_several_runs(tmp_path: Path):
    """Rank folders (torchrun), node folders holding Ray sessions: one run, analysed as one."""
    attempt = EXAMPLE / "torchrun_logs" / "none_2ia4957z" / "attempt_0"  # holds 0/ and 1/
    code, doc, _ = _analyze(str(attempt))
    assert (code, doc["verdict"]["root_cause"]["class"]) == (0, "cuda_oom")
    nodes = tmp_path / "nodes"
    for node in ("ray_session_node1", "ray_session_node2"):
        shutil.copytree(RUNS / "ray_node_hang" / node, nodes / node)
    code, doc, _ = _analyze(str(nodes))
    assert (code, doc["verdict"]["root_cause"]["class"]) == (0, "ray_node_died")


# ---------------------------------------------------------------- a hang ended by Ctrl-C


def test_a_ray_hang_ended_by_ctrl_c_is_not_healthy():
    """A real capture: a WorkerDict blocks in update_actor at step 6; ten minutes later Ctrl-C (expected.yaml)."""
    code, doc, _ = _analyze(str(HANG))
    verdict = doc["verdict"]
    assert code == 0
    assert (verdict["status"], verdict["reason"]["code"]) == ("inconclusive", "interrupted")
    assert verdict["reason"]["text"].startswith("The run was stopped by hand (KeyboardInterrupt at driver.log:")
    assert "after step 5" in verdict["reason"]["text"]
    gated = CliRunner().invoke(main, ["analyze", str(HANG), "--no-html", "-q", "--fail-on", "inconclusive"])
    assert gated.exit_code == 1


# ---------------------------------------------------------------- unrelated files


def test_documentation_is_not_run_output(tmp_path: Path):
    """The repository's own docs quote OOM lines and NCCL errors; as a 'run' they give no verdict, not a failure."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    for name in ("README.md", "corpus/README.md", "corpus/LABELS.md"):
        shutil.copy(REPO / name, docs / name.replace("/", "-"))
    shutil.copy(REPO / "tests" / "hostile.py", docs / "hostile.py")  # source code that holds OOM_LINE
    code, doc, _ = _analyze(str(docs))
    verdict = doc["verdict"]
    assert (code, verdict["status"], verdict["reason"]["code"]) == (0, "inconclusive", "not_run_output")
    assert doc["findings"] == []
    assert all(f["note"] == "documentation or source code (by its name), not run output" for f in doc["run"]["files"])
    code, doc, _ = _analyze(str(REPO / "README.md"))
    assert doc["verdict"]["status"] == "inconclusive", "the README's transcript quotes a CUDA OOM: not a failure"
