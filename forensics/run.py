"""Discovery: find a run's files, tell their kinds, and never write or follow a link outside."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from forensics.sources import file_sources
from forensics.textio import compression_of, read_head

TEXT_LOG = "log"
SKIPPED = "skipped"
BINARY_MAGIC = {
    b"SQLite format 3\x00": "sqlite",
    b"\x80": "pickle",
    b"PK\x03\x04": "zip",
    b"\x7fELF": "elf",
    b"PAR1": "parquet",
}


@dataclass
class RunFile:
    path: Path
    rel: str
    kind: str
    bytes: int
    note: str = ""


@dataclass
class Run:
    """The files of one run, from one or several input paths."""

    paths: list[Path]
    name: str
    files: list[RunFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_CONTROL_BYTES = bytes(b for b in range(32) if (b < 9 or b > 13) and b != 0x1B)  # ESC starts ANSI colours


def _looks_textual(head: bytes) -> bool:
    if not head:
        return True
    if b"\x00" in head:
        return False
    sample = head[:4096]
    control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return control <= len(sample) // 100


def sniff(path: Path, rel: str) -> tuple[str, str]:
    """(kind, note) for one file."""
    head = read_head(path)
    with path.open("rb") as fh:
        raw_head = fh.read(16)
    if not head and compression_of(raw_head):
        return SKIPPED, "compressed file could not be opened (damaged or unsupported)"
    name = path.name.lower()
    for source in file_sources():
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


def _inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError, RuntimeError):
        return False


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            found.append(Path(dirpath) / name)
    return found


def discover(paths: list[Path]) -> Run:
    """Every readable file under the given folders and files, with its kind."""
    if not paths:
        raise ValueError("no input path given")
    name = paths[0].resolve().name if len(paths) == 1 else f"{paths[0].resolve().name}+{len(paths) - 1}"
    run = Run(paths=paths, name=name.removesuffix(".log") or "run")
    for given in paths:
        if not given.exists() and not given.is_symlink():
            raise FileNotFoundError(f"{given}: no such file or folder")
        root = given if given.is_dir() else given.parent
        prefix = f"{given.name}/" if len(paths) > 1 and given.is_dir() else ""
        candidates = _walk(given) if given.is_dir() else [given]
        for path in candidates:
            rel = prefix + (path.relative_to(root).as_posix() if given.is_dir() else path.name)
            if path.is_symlink() and (given.is_dir() and not _inside(given, path)):
                run.warnings.append(f"{rel}: symbolic link out of the run folder, not followed")
                continue
            try:
                if not path.is_file():
                    continue
                size = path.stat().st_size
            except OSError as exc:
                run.warnings.append(f"{rel}: cannot stat: {exc.strerror}")
                continue
            if not os.access(path, os.R_OK):
                run.files.append(RunFile(path, rel, SKIPPED, size, "not readable (permission denied)"))
                run.warnings.append(f"{rel}: not readable (permission denied)")
                continue
            try:
                kind, note = sniff(path, rel)
            except OSError as exc:
                kind, note = SKIPPED, f"cannot read: {exc.strerror}"
                run.warnings.append(f"{rel}: {note}")
            run.files.append(RunFile(path, rel, kind, size, note))
    return run
