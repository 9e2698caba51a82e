"""Discovery: find a run's files, tell their kinds, and never write or follow a link outside.

A run folder is untrusted: links may point anywhere or in circles, FIFOs would block a reader forever,
files may be unreadable, binary, or there by the hundred thousand. Discovery walks it with one
`scandir` per folder and at most one open per file, never opens anything but a regular file, and
turns every oddity into a note on the file or a warning for the report.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from forensics.archive import TAR_MAGIC_OFFSET, archive_stem, is_archive, unpack
from forensics.sources import file_sources
from forensics.sources.base import FileSource
from forensics.textio import compression_of, read_head

TEXT_LOG = "log"
SKIPPED = "skipped"
HEAD_BYTES = 4096
SMALL_FILE_BYTES = 64 * 1024  # files up to this size are checked all at once for anything worth scanning
QUIET_CHECK_BATCH_BYTES = 64 * 1024**2
BINARY_MAGIC = {
    b"SQLite format 3\x00": "sqlite",
    b"\x80": "pickle",
    b"PK\x03\x04": "zip",
    b"\x7fELF": "elf",
    b"PAR1": "parquet",
}
# names that promise text: binary content under them is worth a warning, not just a note
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
TEXT_SUFFIXES = (".log", ".txt", ".out", ".err", ".json", ".jsonl", ".csv", ".yaml", ".yml")
# Documentation and source code are not what a run printed: a README that quotes an OOM line, a changelog that
# mentions a segfault or a script that raises "CUDA out of memory" must not read as a failure of the run.
NOT_RUN_OUTPUT = re.compile(
    r"^(?:readme|licen[cs]e|copying|copyright|notice|authors|contributors|contributing|changelog|changes|news"
    r"|history)(?:\.[\w-]+)*$"
    r"|\.(?:md|markdown|rst|adoc|html?|ipynb|tex|pdf|py|pyi|pyx|c|cc|cpp|h|hpp|cu|cuh|js|ts|css|java|go|rs)$"
)
LOG_SUFFIXES = (".log", ".out", ".err", ".jsonl", ".csv")
NOT_RUN_OUTPUT_NOTE = "documentation or source code (by its name), not run output"


@dataclass
class RunFile:
    path: Path
    rel: str
    kind: str
    bytes: int
    note: str = ""


@dataclass
class Run:
    """The files of one run, from one or several input paths; a context manager that removes the private
    folders that archives were unpacked into."""

    paths: list[Path]
    name: str
    files: list[RunFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unpacked: list[Path] = field(default_factory=list)

    def close(self) -> None:
        for folder in self.unpacked:
            shutil.rmtree(folder, ignore_errors=True)
        self.unpacked.clear()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CONTROL_BYTES = bytes(b for b in range(32) if (b < 9 or b > 13) and b != 0x1B)  # ESC starts ANSI colours


def _looks_textual(head: bytes) -> bool:
    if not head:
        return True
    if b"\x00" in head:
        return False
    sample = head[:4096]
    control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return control <= len(sample) // 100


def sniff(path: Path | str, rel: str, sources: list[FileSource] | None = None) -> tuple[str, str]:
    """(kind, note) for one regular file, from its name and first bytes (decompressed when compressed)."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    if compression_of(head):
        head = read_head(Path(path), HEAD_BYTES)
        if not head:
            return SKIPPED, "compressed file could not be opened (damaged or unsupported)"
    if head[TAR_MAGIC_OFFSET : TAR_MAGIC_OFFSET + 5] == b"ustar":  # its members' text would fool the sniffers
        return SKIPPED, "a tar archive inside the run; give it to forensics as a run of its own to read it"
    name = os.path.basename(path).lower()
    for source in file_sources() if sources is None else sources:
        try:
            if source.sniff(name, head):
                return source.kind, ""
        except (ValueError, IndexError):
            continue
    for magic, kind in BINARY_MAGIC.items():
        if head.startswith(magic):
            return SKIPPED, f"binary ({kind}) with no reader"
    if not _looks_textual(head):
        return SKIPPED, "binary content"
    return TEXT_LOG, ""


def run_name(paths: list[Path]) -> str:
    """The name reports are called by: the folder's (or file's) name, `+N` when several were given."""
    first = archive_stem(paths[0].resolve().name)
    name = first if len(paths) == 1 else f"{first}+{len(paths) - 1}"
    return name.removesuffix(".log") or "run"


def is_run_output(name: str) -> bool:
    """False for documentation and source code by their names (`README`, `NEWS.gz`, `*.md`, `*.py`)."""
    plain = _plain_name(name)
    return plain.endswith(LOG_SUFFIXES) or NOT_RUN_OUTPUT.search(plain) is None


def _link_problem(root: Path, link: Path) -> str | None:
    """Why a symbolic link is not followed, or None when it stays inside the run folder."""
    try:
        target = link.resolve(strict=True)
    except RuntimeError:
        return "symbolic link loop, not followed"
    except OSError:
        return "symbolic link to nothing (dangling), not followed"
    try:
        target.relative_to(root.resolve())
    except ValueError:
        return "symbolic link out of the run folder, not followed"
    return None


@dataclass
class _Walk:
    """State of one folder walk: what was found, and which files were already taken (by device and inode)."""

    root: Path
    prefix: str
    run: Run
    sources: list[FileSource]
    seen: dict[tuple[int, int], str] = field(default_factory=dict)

    def add(self, path: str, rel: str, st: os.stat_result) -> None:
        identity = (st.st_dev, st.st_ino)
        if identity in self.seen:
            return  # a hard or symbolic link to a file already read
        self.seen[identity] = rel
        _add_file(self.run, path, rel, st, self.sources)


def _plain_name(path: str) -> str:
    """The lower-case name without a compression suffix: `worker.log.gz` -> `worker.log`."""
    name = path.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _add_file(run: Run, path: str, rel: str, st: os.stat_result, sources: list[FileSource]) -> None:
    """Sniff one file and add it to the run; paths are plain strings here, since pathlib costs ~20 µs a file."""
    if not stat.S_ISREG(st.st_mode):
        run.warnings.append(f"{rel}: not a regular file (FIFO, socket or device), not read")
        return
    if not is_run_output(os.path.basename(path)):
        run.files.append(RunFile(Path(path), rel, SKIPPED, st.st_size, NOT_RUN_OUTPUT_NOTE))
        return
    try:
        kind, note = sniff(path, rel, sources)
    except PermissionError:
        kind, note = SKIPPED, "not readable (permission denied)"
        run.warnings.append(f"{rel}: {note}")
    except OSError as exc:
        kind, note = SKIPPED, f"cannot read: {exc.strerror or exc}"
        run.warnings.append(f"{rel}: {note}")
    if kind == SKIPPED and note.startswith("binary") and _plain_name(path).endswith(TEXT_SUFFIXES):
        run.warnings.append(f"{rel}: named like text but holds binary data; skipped")
    elif kind == SKIPPED and note.startswith("compressed"):
        run.warnings.append(f"{rel}: {note}; skipped")
    run.files.append(RunFile(Path(path), rel, kind, st.st_size, note))


def _walk(walk: _Walk) -> None:
    """Depth-first, sorted, without recursion or following any directory link.

    Links to files are taken last, so that a file reached both by its own name and by a link inside
    the run (`latest.log -> run_3.log`) is read once, under its own name.
    """
    stack = [(str(walk.root), "")]
    links: list[tuple[str, str]] = []
    while stack:
        folder, rel_folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            where = rel_folder.rstrip("/") or walk.root.name
            walk.run.warnings.append(f"{walk.prefix}{where}: folder not readable ({exc.strerror or exc})")
            continue
        subfolders = []
        for entry in entries:
            rel = f"{walk.prefix}{rel_folder}{entry.name}"
            try:
                if entry.is_symlink():
                    links.append((entry.path, rel))
                elif entry.is_dir(follow_symlinks=False):
                    subfolders.append((entry.path, f"{rel_folder}{entry.name}/"))
                else:
                    walk.add(entry.path, rel, entry.stat(follow_symlinks=False))
            except OSError as exc:
                walk.run.warnings.append(f"{rel}: cannot stat: {exc.strerror or exc}")
        stack.extend(reversed(subfolders))
    for path, rel in links:
        problem = _link_problem(walk.root, Path(path))
        if problem:
            walk.run.warnings.append(f"{rel}: {problem}")
            continue
        try:
            if not os.path.isdir(path):  # a link to a folder inside is walked under its real name
                walk.add(path, rel, os.stat(path))
        except OSError as exc:
            walk.run.warnings.append(f"{rel}: cannot stat: {exc.strerror or exc}")


def _unpack_archive(run: Run, archive: Path) -> Path:
    """Unpack a tar archive given as (part of) a run into a private folder outside every input; its root."""
    into = Path(tempfile.mkdtemp(prefix="forensics-archive-"))
    run.unpacked.append(into)
    for given in run.paths:
        if given.is_dir() and (into.resolve() == given.resolve() or given.resolve() in into.resolve().parents):
            raise ValueError(f"the temporary folder {into} is inside the run {given}; set TMPDIR elsewhere")
    root, warnings = unpack(archive, into)
    run.warnings.extend(warnings)
    return root


def discover(paths: list[Path]) -> Run:
    """Every readable file under the given folders, files and tar archives, with its kind.

    Use the result as a context manager (`with discover(paths) as run:`): an archive's members are
    unpacked into a private folder that is removed when it ends.
    """
    if not paths:
        raise ValueError("no input path given")
    run = Run(paths=paths, name=run_name(paths))
    sources = file_sources()
    try:
        for given in paths:
            if not given.exists():
                raise FileNotFoundError(f"{given}: no such file or folder")
            prefix = f"{archive_stem(given.name)}/" if len(paths) > 1 else ""
            if given.is_dir():
                _walk(_Walk(given, prefix, run, sources))
            elif given.is_file() and is_archive(given):
                _walk(_Walk(_unpack_archive(run, given), prefix, run, sources))
            else:
                _add_file(run, str(given), given.name, given.stat(), sources)
    except BaseException:
        run.close()
        raise
    if not run.files:
        run.warnings.append("no files to read: the run folder is empty or holds only links and special files")
    return run


def _line_count(data: bytes) -> int:
    """Lines as the scanner counts them: a last line without its newline counts too."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def quiet_small_files(files: list[RunFile], may_match: Callable[[list[bytes]], list[bool]]) -> dict[str, int]:
    """Line counts of the small plain text logs in which none of the scanner's candidate searches matches.

    Scanning has a fixed cost of about a millisecond a file, which dominates a run of 100,000 tiny task
    logs. `may_match` (the scanner's literal search over whole files, batched) finds the few worth
    scanning; the others need no scan at all.
    """
    quiet: dict[str, int] = {}
    batch: list[tuple[str, bytes]] = []
    size = 0
    for rf in files:
        if rf.kind != TEXT_LOG or rf.bytes > SMALL_FILE_BYTES:
            continue
        try:
            with open(rf.path, "rb") as fh:
                data = fh.read(SMALL_FILE_BYTES + 1)
        except OSError:
            continue  # the scanner will meet the error again and say so
        if len(data) > SMALL_FILE_BYTES or compression_of(data):
            continue
        batch.append((rf.rel, data))
        size += len(data)
        if size > QUIET_CHECK_BATCH_BYTES:
            quiet.update(_quiet(batch, may_match))
            batch, size = [], 0
    quiet.update(_quiet(batch, may_match))
    return quiet


def _quiet(batch: list[tuple[str, bytes]], may_match: Callable[[list[bytes]], list[bool]]) -> dict[str, int]:
    hits = may_match([data for _, data in batch]) if batch else []
    return {rel: _line_count(data) for (rel, data), hit in zip(batch, hits, strict=True) if not hit}
