"""A run given as a tar archive (`.tar`, `.tgz`, `.tar.gz`, `.tar.bz2`, `.tar.xz`, `.tar.zst`), read in one pass.

People attach `tar czf run.tgz run/` to tickets. The archive is as untrusted as a run folder, and is read
under the same rules: decompression goes through `textio.open_binary`, so a damaged archive gives what was
read before the damage and a bomb is stopped (16 MiB of one byte in a row, 500:1, 8 GiB); only regular files
are taken (links, hard links, devices and FIFOs are listed and skipped); a name that is absolute or climbs
out with `..` is never written; sparse members (which expand from nothing) are skipped. The members are
streamed into a private temporary folder (mode 0700, never inside the run, removed when the analysis ends),
because some readers need a file (SQLite exports) and files are read in parallel.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

from forensics.textio import MAX_DECOMPRESSED_BYTES, open_binary, read_head, read_problem

ARCHIVE_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tbz2", ".tar.bz2", ".txz", ".tar.xz", ".tzst", ".tar.zst")
MAX_MEMBERS = 250_000  # a folder of 100,000 tiny task logs is a real run; millions of entries are an attack
COPY_BYTES = 1024 * 1024
TAR_MAGIC_OFFSET = 257


def is_archive(path: Path) -> bool:
    """A tar archive, by the `ustar` magic of its first header (decompressed when compressed)."""
    head = read_head(path, 512)
    return head[TAR_MAGIC_OFFSET : TAR_MAGIC_OFFSET + 5] == b"ustar"


def archive_stem(name: str) -> str:
    """`run.tar.gz` -> `run`."""
    lower = name.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _safe_parts(name: str) -> list[str] | None:
    """The path components of a member name, or None when the name would leave the folder it is unpacked in."""
    if not name or "\x00" in name or name.startswith("/"):
        return None
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or ".." in parts or any(len(os.fsencode(p)) > 255 for p in parts):
        return None
    return parts


def _copy(source, target: str, budget: int) -> int:
    """Write one member's bytes to a new file (never through an existing file or link); bytes written."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    written = 0
    with os.fdopen(fd, "wb") as out:
        while written < budget:
            data = source.read(min(COPY_BYTES, budget - written))
            if not data:
                break
            out.write(data)
            written += len(data)
    return written


class _Unpacker:
    """One pass over the archive's members, with what was skipped and why."""

    def __init__(self, archive: Path, into: Path) -> None:
        self.archive = archive
        self.into = into
        self.warnings: list[str] = []
        self.members = 0
        self.written = 0

    def skip(self, name: str, why: str) -> None:
        self.warnings.append(f"{self.archive.name}: {name}: {why}")

    def take(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        if member.isdir():
            return
        if member.issym() or member.islnk():
            self.skip(name, "link in the archive, not followed")
            return
        if not member.isreg():
            self.skip(name, "not a regular file (FIFO or device), not read")
            return
        if member.issparse():
            self.skip(name, "sparse file (it would expand from nothing), not read")
            return
        parts = _safe_parts(name)
        if parts is None:
            self.skip(name, "path outside the archive (absolute or with ..), not read")
            return
        folder = self.into.joinpath(*parts[:-1])
        target = folder / parts[-1]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(target):
                self.skip(name, "appears twice in the archive; the first copy was read")
                return
            source = tar.extractfile(member)
            if source is None:
                return
            self.written += _copy(source, str(target), MAX_DECOMPRESSED_BYTES - self.written)
        except OSError as exc:
            self.skip(name, f"could not be unpacked: {exc.strerror or exc}")

    def run(self) -> None:
        with open_binary(self.archive) as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tar:  # a stream: one pass, no seeking
                    for member in tar:
                        self.members += 1
                        if self.members > MAX_MEMBERS:
                            self.warnings.append(
                                f"{self.archive.name}: more than {MAX_MEMBERS:,} members; the rest was not read"
                            )
                            break
                        if self.written >= MAX_DECOMPRESSED_BYTES:
                            self.warnings.append(
                                f"{self.archive.name}: unpacks past {MAX_DECOMPRESSED_BYTES // 1024**3} GiB; "
                                "the rest was not read"
                            )
                            break
                        self.take(tar, member)
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                problem = read_problem(stream)
                if problem is None:  # damage the decompressor did not see (a truncated plain tar, a bad header)
                    self.warnings.append(
                        f"{self.archive.name}: damaged archive after {self.members:,} members "
                        f"({type(exc).__name__}: {exc}); the rest was not read"
                    )
            problem = read_problem(stream)
            if problem:
                self.warnings.append(f"{self.archive.name}: {problem}")


def unpack(archive: Path, into: Path) -> tuple[Path, list[str]]:
    """Stream `archive`'s regular files into the empty folder `into`; return the run's root and the warnings.

    An archive of one folder (`tar czf run.tgz run/`) has that folder as its root, so that file names read
    as they would in the folder itself.
    """
    unpacker = _Unpacker(archive, into)
    unpacker.run()
    entries = list(into.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else into
    return root, unpacker.warnings
