"""Apply label amendments (an audit's CSV files) to the corpus manifest.

    python scripts/corpus/amend.py AMENDMENTS.csv [...] [--corpus corpus]

Each row (id, primary_class, secondary_classes, faulty_rank, evidence, completed, notes) replaces those columns
of the case with that id; `completed` is not kept (the case file was already rewritten by the auditor).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from build import CLASSES, COLUMNS

AMENDED = ("primary_class", "secondary_classes", "faulty_rank", "evidence", "notes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("amendments", nargs="+", type=Path)
    parser.add_argument("--corpus", type=Path, default=Path("corpus"))
    args = parser.parse_args()
    manifest = args.corpus / "manifest.csv"
    with manifest.open(newline="", encoding="utf-8") as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh)}
    changed, refused = 0, []
    for path in args.amendments:
        with path.open(newline="", encoding="utf-8") as fh:
            for amendment in csv.DictReader(fh):
                row = rows.get(amendment["id"])
                classes = [amendment["primary_class"], *filter(None, amendment["secondary_classes"].split(";"))]
                if (
                    row is None
                    or any(c.strip() not in CLASSES for c in classes)
                    or amendment["evidence"]
                    not in (
                        "log",
                        "prose",
                    )
                ):
                    refused.append(f"{path.name}: {amendment['id']}")
                    continue
                before = {k: row[k] for k in AMENDED}
                row.update({k: amendment[k].strip() for k in AMENDED})
                changed += before != {k: row[k] for k in AMENDED}
    with manifest.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows.values())
    print(f"{changed} cases changed; refused: {refused or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
