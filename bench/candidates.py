"""Which patterns make the scanner's candidate lines, and how many of those lines they end up matching.

    python bench/candidates.py /tmp/bench_runs/run1g [--top 25]

The scanner tries a pattern on each line holding one of the pattern's literals (forensics/prefilter.py).
A pattern whose literals are common ("worker", "gpu") makes many candidate pairs that Rust then has to
decide, for few matches. For each literal: the lines holding it; for each pattern: the (line, pattern)
pairs tried and how many matched, worst first. Files are read one after the other in this process.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forensics.discover import TEXT_LOG, discover  # noqa: E402
from forensics.pipeline import load_catalogue  # noqa: E402
from forensics.scan import TextScanner  # noqa: E402
from forensics.sources import line_extractors  # noqa: E402
from forensics.textio import iter_line_batches, open_binary  # noqa: E402


def name_of(pattern) -> str:
    if pattern.extractor is not None:
        return f"extractor {pattern.extractor.name}"
    return f"rule {pattern.rule.id}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)

    scanner = TextScanner(load_catalogue([]).rules, line_extractors())
    literal_lines: Counter[int] = Counter()
    tried: Counter[int] = Counter()
    matched: Counter[int] = Counter()
    lines = candidate_lines = matching_lines = 0
    start = time.perf_counter()
    with discover([args.run_dir]) as run:
        for rf in run.files:
            if rf.kind != TEXT_LOG:
                continue
            with open_binary(rf.path) as stream:
                for batch in iter_line_batches(stream):
                    lines += batch.own_end - batch.own_start
                    held = scanner.finder.lines_holding(batch)
                    for ids in held.values():
                        literal_lines.update(ids)
                    rows, patterns = scanner._candidates(batch)
                    candidate_lines += len(set(rows.tolist()))
                    tried.update(patterns.tolist())
                    found = scanner.matches(batch)
                    matching_lines += len(found)
                    for _, ids in found:
                        matched.update(ids)
    seconds = time.perf_counter() - start
    print(
        f"{lines:,} lines, {candidate_lines:,} candidate lines ({candidate_lines / max(1, lines):.1%}), "
        f"{sum(tried.values()):,} pairs tried, {matching_lines:,} matching lines, {seconds:.1f} s"
    )
    print(f"\nliterals holding the most lines (top {args.top}):")
    for literal, n in literal_lines.most_common(args.top):
        text, icase = scanner.finder.literals[literal]
        users = sorted({name_of(scanner.patterns[i]) for i in scanner._patterns_of[literal]})
        more = " …" if len(users) > 4 else ""
        print(f"  {n:>10,}  {text!r}{' (i)' if icase else ''}  <- {', '.join(users[:4])}{more}")
    print(f"\npatterns tried on the most lines (top {args.top}): tried, matched, pattern, literals")
    for index, n in tried.most_common(args.top):
        p = scanner.patterns[index]
        if p.literals is not None:
            shown = ", ".join(repr(s) for s in sorted(p.literals.strings)[:4]) + (
                " …" if len(p.literals.strings) > 4 else ""
            )
        elif p.extractor is not None and not p.extractor.literal_prefilter:
            shown = "no literals: Rust searches the trigger, then what it requires"
        else:
            shown = "no literals: every line its alternation matches"
        print(f"  {n:>10,} {matched[index]:>10,}  {name_of(p)}  [{shown}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
