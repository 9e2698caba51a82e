"""How well the catalogue names root causes on a labelled corpus: `forensics eval DIR`.

A corpus folder holds `manifest.csv` (one row per case: `id`, `file` relative to the folder, `primary_class`,
and optionally `split`, `secondary_classes`, `faulty_rank`, `source_url`, `project`, `notes`) and the case
files, each a log excerpt or a run folder. Each case is analysed as a run of its own; its verdict class is the
root cause's class, `healthy` for a healthy verdict, else the status (`inconclusive`). A label
`ray_actor_or_node_died` accepts either Ray class. Scores: top-1 accuracy, macro-F1 over the labelled classes,
per-class precision and recall, the confusion matrix, the faulty-rank accuracy where a rank is labelled, how
often a verdict that names a cause (a class other than unknown_crash) is right, above and below a confidence
of HIGH_CONFIDENCE, and the misses with the evidence line the verdict stood on. A tool that says "a crash, cause
unknown" is less wrong than one that names the wrong cause; the last figure counts the second kind.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

from forensics.pipeline import Options, analyze
from forensics.rules.model import TAXONOMY

SCHEMA = "forensics.eval/v1"
SPLITS = ("open", "sealed", "all")
ACCEPTED = {"ray_actor_or_node_died": frozenset({"ray_actor_died", "ray_node_died"})}
REQUIRED_COLUMNS = ("id", "file", "primary_class")
NAMED_CAUSES = frozenset(TAXONOMY) - {"unknown_crash"}  # a verdict in one of these names what failed
HIGH_CONFIDENCE = 0.8


class CorpusError(ValueError):
    """The corpus folder or its manifest cannot be read."""


@dataclass(frozen=True)
class Case:
    id: str
    path: Path
    expected: str
    split: str = "open"
    faulty_rank: int | None = None
    evidence: str = "log"  # `prose`: the excerpt alone cannot show the labelled cause (LABELS.md)
    project: str = ""
    source_url: str = ""


@dataclass(frozen=True)
class Outcome:
    """What the analysis said about one case."""

    id: str
    expected: str
    got: str  # the root cause's class, `healthy`, or the status when there is no root cause
    ok: bool
    rule: str = ""
    rank: int | None = None
    expected_rank: int | None = None
    evidence: str = ""  # file:line and text of the line the verdict stood on
    error: str = ""  # why the case could not be analysed
    label_evidence: str = "log"  # the case's `evidence` column
    confidence: float | None = None  # the root cause's

    @property
    def names_a_cause(self) -> bool:
        return self.got in NAMED_CAUSES


def _rank(text: str) -> int | None:
    text = (text or "").strip()
    return int(text) if text.lstrip("-").isdigit() else None


def read_corpus(folder: Path, split: str = "all") -> list[Case]:
    """The cases of `folder/manifest.csv` in `split` (a manifest without a `split` column is all open)."""
    if split not in SPLITS:
        raise CorpusError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    manifest = folder / "manifest.csv"
    try:
        with manifest.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CorpusError(f"{manifest}: cannot be read ({exc}); a corpus folder holds manifest.csv") from exc
    missing = [c for c in REQUIRED_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise CorpusError(f"{manifest}: no column {', '.join(missing)} (needed: {', '.join(REQUIRED_COLUMNS)})")
    cases = [
        Case(
            id=row["id"],
            path=folder / row["file"],
            expected=row["primary_class"].strip(),
            split=(row.get("split") or "open").strip(),
            faulty_rank=_rank(row.get("faulty_rank", "")),
            evidence=(row.get("evidence") or "log").strip(),
            project=row.get("project", ""),
            source_url=row.get("source_url", ""),
        )
        for row in rows
    ]
    return [c for c in cases if split == "all" or c.split == split]


def judge(expected: str, got: str) -> bool:
    return got in ACCEPTED.get(expected, {expected})


def _failed(case: Case, error: str) -> Outcome:
    return Outcome(
        case.id, case.expected, "error", False, expected_rank=case.faulty_rank, error=error,
        label_evidence=case.evidence,
    )  # fmt: skip


def evaluate_case(case: Case, patterns: tuple[Path, ...] = ()) -> Outcome:
    try:
        verdict = analyze([case.path], Options(patterns=list(patterns), jobs=1)).verdict
    except (OSError, ValueError) as exc:
        return _failed(case, str(exc))
    except Exception as exc:  # a bug of ours: the case is scored as missed and named, the others still run
        return _failed(case, f"internal error: {type(exc).__name__}: {exc}")
    root = verdict.root_cause
    got = "healthy" if verdict.status == "healthy" else root.cls if root else verdict.status
    evidence = ""
    if root is not None and root.evidence:
        first = root.evidence[0]
        evidence = f"{first.file}:{first.line}  {first.text[:200]}"
    return Outcome(
        id=case.id,
        expected=case.expected,
        got=got,
        ok=judge(case.expected, got),
        rule=root.rule if root else "",
        rank=root.rank if root else None,
        expected_rank=case.faulty_rank,
        evidence=evidence,
        label_evidence=case.evidence,
        confidence=round(verdict.confidence, 2) if root else None,
    )


@dataclass
class Scores:
    """The figures of one evaluation."""

    outcomes: list[Outcome]
    split: str = "all"
    per_class: dict[str, dict[str, float]] = field(default_factory=dict)
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.confusion = _confusion(self.outcomes)
        self.per_class = _per_class(self.outcomes)

    @property
    def top1(self) -> float:
        return sum(o.ok for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    @property
    def macro_f1(self) -> float:
        """The mean F1 over the classes that are labelled in the corpus."""
        f1s = [c["f1"] for c in self.per_class.values()]
        return sum(f1s) / len(f1s) if f1s else 0.0

    @property
    def rank_accuracy(self) -> tuple[int, int]:
        """(right, labelled): cases whose faulty rank is labelled and was named, and how many are labelled."""
        labelled = [o for o in self.outcomes if o.expected_rank is not None]
        return sum(o.rank == o.expected_rank for o in labelled), len(labelled)

    @property
    def healthy_alarmed(self) -> int:
        """Healthy controls that got any verdict but healthy."""
        return sum(1 for o in self.outcomes if o.expected == "healthy" and o.got != "healthy")

    def top1_where(self, label_evidence: str) -> tuple[float, int]:
        """(top-1, cases) over the cases whose `evidence` column is `label_evidence`."""
        some = [o for o in self.outcomes if o.label_evidence == label_evidence]
        return (sum(o.ok for o in some) / len(some) if some else 0.0), len(some)

    def named_cause(self, confident: bool | None = None) -> tuple[int, int]:
        """(right, named): verdicts that name a cause, and how many of them are right; `confident` keeps those
        at or above HIGH_CONFIDENCE (True) or below it (False)."""
        named = [o for o in self.outcomes if o.names_a_cause]
        if confident is not None:
            named = [o for o in named if ((o.confidence or 0.0) >= HIGH_CONFIDENCE) == confident]
        return sum(o.ok for o in named), len(named)

    @property
    def misses(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def to_json(self) -> dict[str, Any]:
        right, labelled = self.rank_accuracy
        return {
            "schema": SCHEMA,
            "split": self.split,
            "cases": len(self.outcomes),
            "top1": round(self.top1, 4),
            "macro_f1": round(self.macro_f1, 4),
            "faulty_rank": {"right": right, "labelled": labelled},
            "healthy_alarmed": self.healthy_alarmed,
            "top1_by_evidence": {
                kind: {"top1": round(t, 4), "cases": n} for kind in ("log", "prose") for t, n in [self.top1_where(kind)]
            },
            "named_cause": {
                band: {"right": right, "named": named}
                for band, confident in (("all", None), ("high_confidence", True), ("low_confidence", False))
                for right, named in [self.named_cause(confident)]
            },
            "per_class": self.per_class,
            "confusion": self.confusion,
            "outcomes": [asdict(o) for o in self.outcomes],
        }


def _label(o: Outcome) -> str:
    """The class an outcome counts under: a Ray label that the verdict satisfied counts as the verdict's."""
    return o.got if o.ok else o.expected


def _confusion(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for o in outcomes:
        table.setdefault(_label(o), Counter())[o.got] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(table.items())}


def _per_class(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    labelled = Counter(o.expected for o in outcomes)
    out = {}
    for cls, n in sorted(labelled.items()):
        accepted = ACCEPTED.get(cls, {cls})
        tp = sum(1 for o in outcomes if o.expected == cls and o.ok)
        predicted = sum(1 for o in outcomes if o.got in accepted)
        precision = tp / predicted if predicted else 0.0
        recall = tp / n
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[cls] = {"n": n, "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}
    return out


def evaluate(
    cases: Iterable[Case],
    patterns: tuple[Path, ...] = (),
    jobs: int = 0,
    split: str = "all",
    progress: Callable[[Outcome], None] | None = None,
) -> Scores:
    """Analyse every case (in `jobs` processes; 0 = one per CPU) and score the verdicts."""
    cases = list(cases)
    workers = jobs or os.cpu_count() or 1
    outcomes: list[Outcome] = []
    if workers == 1 or len(cases) < 2:
        for case in cases:
            outcomes.append(evaluate_case(case, patterns))
            if progress:
                progress(outcomes[-1])
    else:
        # spawned, not forked: a fork of a process whose polars threads hold locks can hang
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            for outcome in pool.map(evaluate_case, cases, [patterns] * len(cases), chunksize=8):
                outcomes.append(outcome)
                if progress:
                    progress(outcome)
    return Scores(outcomes, split)


FLOOR_KEYS = {"top1", "macro_f1", "healthy_alarmed_max"}


def read_floors(path: Path, split: str) -> dict[str, float]:
    """The minimum scores for `split` from a YAML file `{split: {top1: …, macro_f1: …, healthy_alarmed_max: …}}`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CorpusError(f"{path}: cannot be read as YAML ({exc})") from exc
    floors = data.get(split, {}) if isinstance(data, dict) else None
    if not isinstance(floors, dict) or set(floors) - FLOOR_KEYS:
        raise CorpusError(f"{path}: {split}: expected a mapping of {', '.join(sorted(FLOOR_KEYS))}")
    return {k: float(v) for k, v in floors.items()}


def below_floors(scores: Scores, floors: dict[str, float]) -> list[str]:
    """What falls short of the floors, in words; empty when all hold."""
    short = []
    if "top1" in floors and scores.top1 < floors["top1"]:
        short.append(f"top-1 {scores.top1:.3f} < {floors['top1']:.3f}")
    if "macro_f1" in floors and scores.macro_f1 < floors["macro_f1"]:
        short.append(f"macro-F1 {scores.macro_f1:.3f} < {floors['macro_f1']:.3f}")
    if "healthy_alarmed_max" in floors and scores.healthy_alarmed > floors["healthy_alarmed_max"]:
        short.append(f"{scores.healthy_alarmed} healthy controls alarmed > {floors['healthy_alarmed_max']:g}")
    return short
