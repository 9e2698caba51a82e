#!/usr/bin/env python3
"""Trim a capture (capture.py's Ray runs, run_scenarios.sh's torchrun runs) into a test fixture: same layout,
only the telling files.

    python scripts/capture/ray/trim_fixtures.py CAPTURE_DIR tests/fixtures/runs/<scenario>

Keeps driver.log, the output of `ray start`, torchrun's per-rank stdout/stderr/error files, collect_env.txt,
the file logger's JSONL and, from each Ray session's logs/, the raylet, GCS, core-worker and worker logs,
non-empty events/*.log and the agents' logs that report a raylet's death; drops empty files and everything
else (checkpoints). Ray's periodic state dumps (`[state-dump]` lines, "Event stats:" / "Gcs Debug state:"
records and their continuation lines) are cut, and paths of the capturing machine (the capture folder, this
repository, the interpreter's environment, the home folder) become neutral ones.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

KEEP = re.compile(
    r"^(?:driver\.log|raylet\.(?:out|err)|gcs_server\.(?:out|err)|python-core-(?:driver|worker)-.*\.log"
    r"|worker-.*\.(?:out|err)|event_[A-Z_0-9]+\.log|dashboard_agent\.log|runtime_env_agent\.err"
    r"|ray_start_\w+\.log|std(?:out|err)\.log|error\.json|collect_env\.txt|[\w-]+\.jsonl)$"
)
REPO = Path(__file__).resolve().parents[3]
RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [TDIWEC] \d+ \d+\] ")
DUMP_HEAD = re.compile(r"(?:Event stats:|Gcs Debug state:|\[state-dump\] NodeManager:)\s*$")
PATHS = [
    (re.compile(r"/[\w.-]+(?:/[\w.-]+)*?/captures/ray/[\w-]+/"), "/home/user/run/"),
    (re.compile(r"/\w+/main/(?=scripts/)"), "/home/user/verl/"),
    (re.compile(r"/root/venvs/[\w-]+/"), "/home/user/.venv/"),
    (re.compile(r"/root/"), "/home/user/"),
]


def machine_paths(capture: Path) -> list[tuple[str, str]]:
    """This machine's own folders in the capture's text, longest first, and what each becomes."""
    found = [
        (f"{capture.resolve()}/", "/home/user/run/"),
        (f"{REPO}/", "/home/user/verl/"),
        (f"{Path(sys.prefix).resolve()}/", "/home/user/.venv/"),
        (f"{Path.home()}/", "/home/user/"),
    ]
    return sorted(found, key=lambda pair: -len(pair[0]))


def neutral(text: str, own: list[tuple[str, str]] = ()) -> str:
    for path, replacement in own:
        text = text.replace(path, replacement)
    for pattern, replacement in PATHS:
        text = pattern.sub(replacement, text)
    return text


def without_dumps(lines: list[str]) -> list[str]:
    """Drop state-dump lines and the continuation lines of dump records (a record's head line stays)."""
    out, in_dump = [], False
    for line in lines:
        if RECORD.match(line):
            in_dump = bool(DUMP_HEAD.search(line))
            out.append(line)
        elif not in_dump and not line.startswith("[state-dump]"):
            out.append(line)
    return out


def trim(src: Path, dst: Path) -> int:
    own = machine_paths(src)
    total = 0
    for path in sorted(src.rglob("*")):
        if not path.is_file() or path.stat().st_size == 0 or not KEEP.match(path.name):
            continue
        if path.name == "driver.log" and path.parent != src:
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")  # no newline translation: keep \r
        lines = text.split("\n")
        if path.name != "driver.log":
            lines = without_dumps(lines)
        target.write_bytes(neutral("\n".join(lines), own).encode("utf-8", errors="surrogateescape"))
        total += target.stat().st_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path)
    parser.add_argument("fixture", type=Path)
    args = parser.parse_args()
    if args.fixture.exists():
        shutil.rmtree(args.fixture)
    size = trim(args.capture, args.fixture)
    print(f"{args.fixture}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
