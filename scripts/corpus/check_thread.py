"""Say whether a public thread may be harvested into the corpus.

    python scripts/corpus/check_thread.py URL [URL ...] [--reserved FILE]

A thread is `owner/repo#N`. It is refused when sha256 of `owner/repo#n` or of `*/repo#n` (lowercase) is
listed in the reserved file (threads kept for independent evaluation), or when its repository is the
GPUAlert paper's evaluation repository. Prints `ok KEY` or `skip KEY (why)` per URL; exit 1 if any is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

THREAD_URL = re.compile(r"github\.com/([^/\s]+)/([^/\s#]+)/(?:issues|pull|discussions)/(\d+)", re.I)
DEFAULT_RESERVED = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "reserved-threads.sha256"


def thread_key(url: str) -> tuple[str, str] | None:
    """`(owner/repo#n, */repo#n)` of a GitHub issue or pull-request URL, lowercase."""
    m = THREAD_URL.search(url)
    if not m:
        return None
    owner, repo, number = m.group(1).lower(), m.group(2).lower(), m.group(3)
    return f"{owner}/{repo}#{number}", f"*/{repo}#{number}"


def reserved_hashes(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def verdict(url: str, reserved: set[str]) -> str:
    key = thread_key(url)
    if key is None:
        return f"skip {url} (not a GitHub issue or pull-request URL)"
    if "gpualert" in key[0]:
        return f"skip {key[0]} (the GPUAlert evaluation repository is left alone)"
    if any(hashlib.sha256(k.encode()).hexdigest() in reserved for k in key):
        return f"skip {key[0]} (reserved for independent evaluation)"
    return f"ok {key[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--reserved", type=Path, default=DEFAULT_RESERVED)
    args = parser.parse_args()
    reserved = reserved_hashes(args.reserved)
    answers = [verdict(url, reserved) for url in args.urls]
    print("\n".join(answers))
    return 1 if any(a.startswith("skip") for a in answers) else 0


if __name__ == "__main__":
    sys.exit(main())
