"""The catalogue: every finding the tool can emit, described as data (`patterns/<area>/<id>.yaml`).

Text rules (`match:`) find their lines in the scanner. The other entries (`detector:`) describe a finding
that code computes: a detector over the metric series, the flight-recorder comparison, the trace straggler
analysis, the fallback for an exception no rule knows. Code hands over what it computed, a `Detection`;
the catalogue turns it into a `Finding` with the entry's title, class, severity, layer, remediation and
`symptom_of`, so that `forensics patterns list` shows every finding and `--patterns` can change any of them.
Titles and remediation may name the detection's fields: `{metric} diverged`, `before step {steps[0]}`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from forensics.model import Evidence, Finding
from forensics.rules.model import Rule

UNORDERED = (1 << 30, 0, 0)  # a detection with no line of its own sorts after every line of the run


@dataclass
class Detection:
    """What code found, before the catalogue describes it: the computed part of a `Finding`."""

    id: str  # the catalogue entry that describes it
    explanation: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    rank: int | None = None
    host: str | None = None
    role: str | None = None
    ts: datetime | None = None
    ts_inferred: bool = False
    order: tuple[int, int, int] = UNORDERED
    step: int | None = None
    count: int = 1


class MissingEntryError(KeyError):
    """Code emitted a finding that the catalogue does not describe."""

    def __str__(self) -> str:
        return (
            f"no catalogue entry for finding {self.args[0]!r}: add patterns/<area>/{self.args[0]}.yaml "
            "(`detector:` in place of `match:`)"
        )


class _KeepUnknown(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def fill(template: str, fields: Mapping[str, Any]) -> str:
    """The template with the fields it names; a placeholder with no such field is left as written."""
    try:
        return string.Formatter().vformat(template, (), _KeepUnknown(fields))
    except (IndexError, KeyError, TypeError, ValueError, AttributeError):
        return template


class Catalogue:
    """Every entry by id: text rules and the descriptions of computed findings."""

    def __init__(self, entries: Iterable[Rule]):
        self.entries: dict[str, Rule] = {e.id: e for e in entries}

    @property
    def rules(self) -> list[Rule]:
        """The text rules, for the scanner."""
        return [e for e in self.entries.values() if not e.is_detector]

    def entry(self, entry_id: str) -> Rule:
        try:
            return self.entries[entry_id]
        except KeyError:
            raise MissingEntryError(entry_id) from None

    def describe(self, detection: Detection) -> Finding:
        """The finding the entry of `detection.id` makes of it."""
        entry = self.entry(detection.id)
        fields = dict(detection.fields)
        named = {"rank": detection.rank, "host": detection.host, **fields}
        return Finding(
            rule=entry.id,
            cls=entry.cls,
            title=fill(entry.title, named),
            severity=entry.severity,
            layer=entry.layer,
            rank=detection.rank,
            host=detection.host,
            role=detection.role,
            ts=detection.ts,
            ts_inferred=detection.ts_inferred,
            order=detection.order,
            count=detection.count,
            evidence=list(detection.evidence),
            fields=fields,
            remediation=[fill(r, named) for r in entry.remediation],
            symptom_of=entry.symptom_of,
            step=detection.step,
            explanation=detection.explanation,
            strength=entry.evidence,
        )

    def describe_all(self, detections: Iterable[Detection]) -> list[Finding]:
        return [self.describe(d) for d in detections]
