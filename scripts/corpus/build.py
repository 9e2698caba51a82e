"""Merge harvested excerpts into the corpus, checked, deduplicated and split by thread.

    python scripts/corpus/build.py STAGING_DIR [--corpus corpus] [--reserved FILE]

STAGING_DIR holds one folder per harvest, each with `manifest.csv` (file, primary_class, secondary_classes,
faulty_rank, source_url, project, notes) and its `.log` files. Every excerpt is checked (taxonomy, a GitHub
thread URL that is not reserved for independent evaluation, no secret, no path that names a machine of ours,
text not already in the corpus) and appended to CORPUS/manifest.csv with a new id. Its split is the thread's:
`sealed` for a fixed quarter of the threads (sha256 of SPLIT_SALT and `*/repo#N`), `open` for the rest, so
forks and cross-posts of one thread land together. Existing rows are never renumbered or moved.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_thread import DEFAULT_RESERVED, reserved_hashes, thread_key, verdict

from forensics.redact import redact
from forensics.rules.model import TAXONOMY

SPLIT_SALT = "forensics-corpus-split-v1:"
SEALED_SHARE = 4  # one thread in four
CLASSES = {*TAXONOMY, "healthy", "ray_actor_or_node_died"}
COLUMNS = ["id", "file", "split", "primary_class", "secondary_classes", "faulty_rank", "evidence"]
COLUMNS += ["source_url", "project", "notes"]
FORBIDDEN = tuple("/" + p for p in ("work/", "farm/", "root/.pyenv"))  # our machines' paths (not spelt out here)


def _label_from_prose(notes: str) -> bool:
    """The harvester's mark for a label that rests on the thread's words, not on the excerpt."""
    notes = notes.lower()
    return "from prose" in notes or "label-from-thread" in notes


def split_of(url: str) -> str:
    key = thread_key(url)
    assert key is not None
    digest = hashlib.sha256((SPLIT_SALT + key[1]).encode()).hexdigest()
    return "sealed" if int(digest[:8], 16) % SEALED_SHARE == 0 else "open"


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def problems(row: dict[str, str], text: str, reserved: set[str]) -> list[str]:
    found = []
    classes = [row["primary_class"], *(c for c in row.get("secondary_classes", "").split(";") if c.strip())]
    found += [f"class {c!r} is not in the taxonomy" for c in classes if c.strip() not in CLASSES]
    answer = verdict(row["source_url"], reserved)
    if not answer.startswith("ok"):
        found.append(answer)
    found += [f"names a path of ours ({s})" for s in FORBIDDEN if s in text]
    if redact(text) != text:
        found.append("holds what looks like a secret")
    if len(text.strip().splitlines()) < 1 or not text.strip():
        found.append("is empty")
    return found


def read_corpus(corpus: Path) -> list[dict[str, str]]:
    manifest = corpus / "manifest.csv"
    if not manifest.exists():
        return []
    with manifest.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("staging", type=Path)
    parser.add_argument("--corpus", type=Path, default=Path("corpus"))
    parser.add_argument("--reserved", type=Path, default=DEFAULT_RESERVED)
    args = parser.parse_args()
    reserved = reserved_hashes(args.reserved)
    rows = read_corpus(args.corpus)
    seen = {normalised((args.corpus / r["file"]).read_text(encoding="utf-8")) for r in rows}
    next_id = 1 + max((int(r["id"]) for r in rows), default=0)
    added, skipped = 0, []
    for manifest in sorted(args.staging.glob("*/manifest.csv")):
        with manifest.open(newline="", encoding="utf-8") as fh:
            staged = list(csv.DictReader(fh))
        for row in staged:
            source = manifest.parent / row["file"]
            text = source.read_text(encoding="utf-8")
            issues = problems(row, text, reserved)
            if normalised(text) in seen:
                issues.append("same text as an excerpt already kept")
            if issues:
                skipped.append(f"{source}: {'; '.join(issues)}")
                continue
            seen.add(normalised(text))
            split = split_of(row["source_url"])
            case_id = f"{next_id:04d}"
            target = args.corpus / "cases" / split / f"{case_id}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            rows.append(
                {
                    "id": case_id,
                    "file": target.relative_to(args.corpus).as_posix(),
                    "split": split,
                    **{k: row.get(k, "").strip() for k in COLUMNS[3:]},
                    "evidence": "prose" if _label_from_prose(row.get("notes", "")) else "log",
                }
            )
            next_id += 1
            added += 1
    args.corpus.mkdir(parents=True, exist_ok=True)
    with (args.corpus / "manifest.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"added {added}, skipped {len(skipped)}; the corpus has {len(rows)} cases")
    print("\n".join(skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
