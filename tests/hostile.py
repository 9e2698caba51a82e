"""Helpers for the tests (and scripts/fuzz.py) that feed forensics damaged and hostile run folders."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

# lines that fire bundled rules, as the real programs print them
OOM_LINE = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
    "capacity of 79.10 GiB of which 1.02 GiB is free."
)
NCCL_INFO = (
    "node-{host}:{pid}:{tid} [{dev}] NCCL INFO Channel {ch:02d}/0 : {r}[{dev}] -> {peer}[{pdev}] via P2P/CUMEM/read"
)


def tree_state(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under `folder` (links not followed): its kind and content hash, its mtime and its mode.

    Equal states before and after a run prove nothing was created, removed, written or touched there,
    whatever the permissions say (root can write to a read-only tree).
    """
    state: dict[str, tuple[str, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            if path.is_symlink():
                digest = "link:" + os.readlink(path)
            elif path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                digest = "dir" if path.is_dir() else "special"
            state[path.relative_to(folder).as_posix()] = (digest, st.st_mtime_ns, st.st_mode)
    return state


def write_gzip_bomb(path: Path, head: bytes, total_bytes: int, member_bytes: int = 64 * 1024**2) -> int:
    """A valid multi-member gzip file of `head` then zeros, `total_bytes` long once decompressed.

    Streamed: one member of `member_bytes` zeros is compressed once and written again and again, so a
    10 GB bomb costs ~10 MB on disk and under a second to make. Returns the decompressed size.
    """
    zeros = gzip.compress(bytes(member_bytes), 9, mtime=0)
    count = max(0, (total_bytes - len(head)) // member_bytes)
    with path.open("wb") as fh:
        fh.write(gzip.compress(head, 9, mtime=0))
        for _ in range(count):
            fh.write(zeros)
    return len(head) + count * member_bytes


def nccl_info_lines(count: int, ranks: int = 8) -> bytes:
    """`count` NCCL INFO channel lines from `ranks` processes on two hosts, as NCCL_DEBUG=INFO prints them.

    One period (every rank on every channel) is formatted and repeated, so ten million lines take a second.
    """
    period = []
    for i in range(ranks * 32):
        r = i % ranks
        period.append(
            NCCL_INFO.format(
                host=r // 4,
                pid=4000 + r,
                tid=4100 + r,
                dev=r % 4,
                ch=i // ranks,
                r=r,
                peer=(r + 1) % ranks,
                pdev=(r + 1) % 4,
            )
            + "\n"
        )
    block = "".join(period).encode()
    whole, rest = divmod(count, len(period))
    return block * whole + "".join(period[:rest]).encode()
