"""Measure forensics on a labelled corpus: is the named root cause the labelled one?

    python scripts/eval_corpus.py ../shared/corpus/public-issues [--min-accuracy 0.85]

The corpus folder holds `manifest.csv` (id, file, primary_class, secondary_classes, ...) and the case
files. `ray_actor_or_node_died` in the manifest accepts either Ray class; `healthy` requires the
verdict status `healthy`. The report is a per-case table, the top-1 accuracy, a per-class table and
the number of healthy cases that were flagged. Exit 0 always, unless `--min-accuracy` is not reached.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from forensics.model import Verdict
from forensics.pipeline import analyze

ACCEPTED = {"ray_actor_or_node_died": {"ray_actor_died", "ray_node_died"}}


@dataclass(frozen=True)
class CaseResult:
    id: str
    expected: str
    got: str  # the root cause's class, or the verdict status when there is none
    status: str
    rule: str
    rank: int | None
    evidence: str  # file:line of the first evidence line
    ok: bool


@dataclass(frozen=True)
class Evaluation:
    cases: list[CaseResult]

    @property
    def accuracy(self) -> float:
        return sum(c.ok for c in self.cases) / len(self.cases) if self.cases else 0.0

    @property
    def healthy_flagged(self) -> int:
        """Healthy cases that the analyzer reported as failed or degraded."""
        return sum(1 for c in self.cases if c.expected == "healthy" and c.status != "healthy")

    def per_class(self) -> dict[str, tuple[int, int]]:
        table: dict[str, tuple[int, int]] = {}
        for c in self.cases:
            n, correct = table.get(c.expected, (0, 0))
            table[c.expected] = (n + 1, correct + int(c.ok))
        return dict(sorted(table.items()))


def read_manifest(corpus: Path) -> list[dict[str, str]]:
    with (corpus / "manifest.csv").open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def judge(expected: str, verdict: Verdict) -> bool:
    if expected == "healthy":
        return verdict.status == "healthy"
    root = verdict.root_cause
    return root is not None and root.cls in ACCEPTED.get(expected, {expected})


def evaluate_case(corpus: Path, row: dict[str, str]) -> CaseResult:
    verdict = analyze([corpus / row["file"]]).verdict
    root = verdict.root_cause
    evidence = f"{root.evidence[0].file}:{root.evidence[0].line}" if root and root.evidence else ""
    return CaseResult(
        id=row["id"],
        expected=row["primary_class"],
        got=root.cls if root else verdict.status,
        status=verdict.status,
        rule=root.rule if root else "",
        rank=root.rank if root else None,
        evidence=evidence,
        ok=judge(row["primary_class"], verdict),
    )


def evaluate(corpus: Path, only: Iterable[str] = ()) -> Evaluation:
    wanted = set(only)
    rows = [r for r in read_manifest(corpus) if not wanted or r["id"] in wanted]
    return Evaluation([evaluate_case(corpus, r) for r in rows])


def render(ev: Evaluation) -> str:
    header = ("id", "expected", "got", "rule", "rank", "evidence", "ok")
    rows = [
        (c.id, c.expected, c.got, c.rule, "" if c.rank is None else str(c.rank), c.evidence, "yes" if c.ok else "NO")
        for c in ev.cases
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    correct = sum(c.ok for c in ev.cases)
    lines += ["", f"top-1 root-cause accuracy: {ev.accuracy:.3f} ({correct}/{len(ev.cases)})", ""]
    lines.append(f"{'class':24} {'n':>3} {'correct':>7}")
    for cls, (n, ok) in ev.per_class().items():
        lines.append(f"{cls:24} {n:>3} {ok:>7}")
    lines += ["", f"healthy cases reported as failed or degraded: {ev.healthy_flagged}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="folder with manifest.csv and the case files")
    parser.add_argument("--min-accuracy", type=float, help="exit 1 when the top-1 accuracy is below this")
    parser.add_argument("--case", action="append", default=[], help="only this case id (repeatable)")
    args = parser.parse_args(argv)
    if not (args.corpus / "manifest.csv").is_file():
        parser.error(f"{args.corpus}: no manifest.csv here")
    ev = evaluate(args.corpus, args.case)
    print(render(ev))
    if args.min_accuracy is not None and ev.accuracy < args.min_accuracy:
        print(f"accuracy {ev.accuracy:.3f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
