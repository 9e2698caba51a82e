"""From events to a verdict: group rule hits into findings, then find the first domino.

The root cause is the earliest finding that no other finding explains (`symptom_of` in the rules).
torchrun's "Root Cause (first observed failure)" is only the first process to exit; it is kept as a
finding like any other and never trusted on its own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.model import Evidence, Finding, Symptom, Verdict, severity_rank
from forensics.rules.model import Rule

MAX_EVIDENCE = 5
WRAPPER_EXCEPTIONS = {
    "RayTaskError",
    "ActorDiedError",
    "RayActorError",
    "ChildFailedError",
    "DistBackendError",
    "WorkerCrashedError",
    "CalledProcessError",
    "SystemExit",
    "KeyboardInterrupt",
}
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.utc)


@dataclass
class _Occurrence:
    row: dict[str, Any]
    fields: dict[str, Any]
    order: tuple[int, int, int]


def _rows(events: pl.DataFrame, file_order: dict[str, int]) -> list[_Occurrence]:
    out = []
    for seq, row in enumerate(events.iter_rows(named=True)):
        try:
            fields = json.loads(row["fields"] or "{}")
        except ValueError:
            fields = {}
        out.append(_Occurrence(row, fields, (file_order.get(row["file"], 0), row["line"] or 0, seq)))
    return out


def _sort_key(f: Finding) -> tuple[datetime, int, int, int]:
    return (f.ts or _FAR_FUTURE, *f.order)


def _new_finding(rule: Rule, occ: _Occurrence) -> Finding:
    row = occ.row
    fields = {k: v for k, v in occ.fields.items() if k not in ("rules",)}
    return Finding(
        rule=rule.id,
        cls=rule.cls,
        title=rule.title,
        severity=rule.severity,
        layer=rule.layer,
        rank=row["rank"],
        host=row["host"],
        role=row["role"],
        ts=row["ts"],
        ts_inferred=bool(row["ts_inferred"]),
        order=occ.order,
        count=0,
        evidence=[],
        fields=fields,
        remediation=list(rule.remediation),
        symptom_of=rule.symptom_of,
    )


def build_findings(events: pl.DataFrame, rules: dict[str, Rule], file_order: dict[str, int]) -> list[Finding]:
    """One finding per (rule, rank), keeping the first occurrence and a few evidence lines."""
    candidates = events.filter(pl.col("fields").str.contains('"rules"', literal=True))
    grouped: dict[tuple[str, int | None], Finding] = {}
    for occ in sorted(_rows(candidates, file_order), key=lambda o: (o.row["ts"] or _FAR_FUTURE, o.order)):
        for rule_id in occ.fields.get("rules", []):
            rule = rules.get(rule_id)
            if rule is None:
                continue
            key = (rule_id, occ.row["rank"])
            finding = grouped.get(key)
            if finding is None:
                finding = grouped[key] = _new_finding(rule, occ)
            finding.count += 1
            if len(finding.evidence) < MAX_EVIDENCE:
                finding.evidence.append(Evidence(occ.row["file"], occ.row["line"], occ.row["message"]))
            for k, v in occ.fields.items():
                if k != "rules":
                    finding.fields.setdefault(k, v)
    findings = _fold_unranked(list(grouped.values()))
    findings.extend(_unknown_crash(events, findings, file_order))
    return sorted(findings, key=_sort_key)


def _fold_unranked(findings: list[Finding]) -> list[Finding]:
    """Lines of a rule with no known rank (torchrun's and Ray's re-prints of a rank's error) join that rule's
    earliest ranked finding instead of standing as a failure of their own."""
    ranked: dict[str, Finding] = {}
    for f in sorted(findings, key=_sort_key):
        if f.rank is not None:
            ranked.setdefault(f.rule, f)
    kept = []
    for f in findings:
        target = ranked.get(f.rule) if f.rank is None else None
        if target is None:
            kept.append(f)
            continue
        target.count += f.count
        target.evidence.extend(f.evidence[: max(0, MAX_EVIDENCE - len(target.evidence))])
    return kept


def _unknown_crash(events: pl.DataFrame, findings: list[Finding], file_order: dict[str, int]) -> list[Finding]:
    """When no rule explains a failure, the first real exception (or non-zero exit) is the lead."""
    if any(severity_rank(f.severity) >= severity_rank("error") for f in findings):
        return []
    failures = events.filter(pl.col("kind").is_in(["exception", "torchrun_failure", "torchrun_child_failed"]))
    best: _Occurrence | None = None
    for occ in _rows(failures, file_order):
        exc = occ.fields.get("exception")
        if occ.row["kind"] == "exception" and (exc in WRAPPER_EXCEPTIONS and not occ.fields.get("cause")):
            continue
        if occ.row["kind"] != "exception" and occ.fields.get("exitcode", 1) == 0:
            continue
        if best is None or (occ.row["ts"] or _FAR_FUTURE, occ.order) < (best.row["ts"] or _FAR_FUTURE, best.order):
            best = occ
    if best is None:
        return []
    rule = Rule(
        id="unknown-crash",
        title="Unrecognised crash",
        cls="unknown_crash",
        severity="error",
        layer="script",
        description="A failure that no rule recognises.",
        match=(),
        remediation=(
            "Read the evidence line and its traceback; if it is a known failure, add a rule "
            "for it under patterns/ (see `forensics patterns show cuda-oom` for the format).",
        ),
    )
    finding = _new_finding(rule, best)
    finding.count = 1
    finding.evidence.append(Evidence(best.row["file"], best.row["line"], best.row["message"]))
    return [finding]


def _explains(cause: Finding, effect: Finding) -> bool:
    """Whether `cause` explains `effect` (effect lists cause's class, and not the other way round earlier)."""
    if cause is effect or cause.cls not in effect.symptom_of:
        return False
    if effect.cls in cause.symptom_of:  # mutual: the earlier one is the cause
        return _sort_key(cause) <= _sort_key(effect)
    return True


def _watchdog_suspect(events: pl.DataFrame) -> tuple[int | None, str]:
    """The rank that lags in collective sequence numbers, from watchdog and dump-signal lines."""
    state = events.filter(
        pl.col("kind").is_in(["watchdog_work_state", "watchdog_timeout", "fr_rank_state"])
        & pl.col("rank").is_not_null()
    )
    if state.is_empty():
        return None, ""
    per_rank: dict[int, int] = {}
    timed_out: set[int] = set()
    for row in state.iter_rows(named=True):
        fields = json.loads(row["fields"] or "{}")
        rank = row["rank"]
        if row["kind"] == "watchdog_timeout":
            timed_out.add(rank)
        enq = fields.get("last_enqueued")
        if enq is not None:
            per_rank[rank] = max(per_rank.get(rank, -1), int(enq))
    if len(set(per_rank.values())) > 1:
        laggard = min(per_rank, key=lambda r: (per_rank[r], r))
        return laggard, (
            f"rank {laggard} enqueued only up to collective {per_rank[laggard]} while others reached "
            f"{max(per_rank.values())}: it never joined the collective the others waited in"
        )
    return None, ""


def _torchrun_note(events: pl.DataFrame, root: Finding) -> str:
    named = events.filter(pl.col("kind") == "torchrun_failure")
    for row in named.iter_rows(named=True):
        fields = json.loads(row["fields"] or "{}")
        if fields.get("torchrun_root_cause") and row["rank"] is not None and row["rank"] != root.rank:
            return (
                f"torchrun's summary names rank {row['rank']} (exit code {fields.get('exitcode')}) as the first "
                f"observed failure; that rank only exited first — it is a symptom."
            )
    return ""


def _step_of(root: Finding, step_marks: list[tuple[str, int, int]]) -> int | None:
    same_file = [
        step for file, line, step in step_marks if file == root.evidence[0].file and line < root.evidence[0].line
    ]
    if same_file:
        return max(same_file) + 1
    if step_marks:
        return max(step for _, _, step in step_marks) + 1
    return None


def _precursors(root: Finding, findings: list[Finding]) -> list[str]:
    """Warnings that were heading for the root's failure (memory growing towards an OOM) tell how it came.

    A detector marks such a finding with `fields["leads_to"]` = the class it leads to; its projection
    (e.g. `projected_step`) is copied onto the root so the verdict names the step it was heading for, and
    its first remediation (find the leak) comes before the root's own (smaller batches would only delay it).
    """
    notes = []
    for f in findings:
        if f is not root and f.fields.get("leads_to") == root.cls:
            notes.append(f.explanation)
            root.remediation = [*f.remediation[:1], *(r for r in root.remediation if r not in f.remediation)]
            root.fields.setdefault("precursor", f.rule)
            for key in ("projected_step", "growth_gib_per_step", "capacity_gib"):
                if key in f.fields:
                    root.fields.setdefault(key, f.fields[key])
    return notes


def _symptoms(others: list[Finding]) -> list[Symptom]:
    by_class: dict[str, list[Finding]] = defaultdict(list)
    for f in others:
        by_class[f.cls].append(f)
    symptoms = []
    for cls, group in by_class.items():
        group.sort(key=_sort_key)
        ranks = sorted({f.rank for f in group if f.rank is not None})
        evidence = [e for f in group for e in f.evidence[:1]]
        symptoms.append(Symptom(cls, group[0].rule, ranks, group[0].ts, sum(f.count for f in group), evidence))
    symptoms.sort(key=lambda s: s.first_ts or _FAR_FUTURE)
    return symptoms


def diagnose(events: pl.DataFrame, findings: list[Finding], step_marks: list[tuple[str, int, int]]) -> Verdict:
    if not findings:
        return Verdict("healthy", None, 0.9, [], [], "No failure signature found.")
    independent = [f for f in findings if not any(_explains(g, f) for g in findings)]
    serious = [f for f in independent if severity_rank(f.severity) >= severity_rank("error")]
    pool = serious or independent or findings
    root = min(pool, key=lambda f: (_sort_key(f), -severity_rank(f.severity)))
    status = "failed" if severity_rank(root.severity) >= severity_rank("error") else "degraded"
    explanation: list[str] = [root.explanation] if root.explanation else []  # a detector may explain its own finding
    if root.cls in ("nccl_timeout", "hang", "collective_mismatch"):
        suspect, why = _watchdog_suspect(events)
        if suspect is not None:
            root.rank = suspect
            explanation.append(why)
    note = _torchrun_note(events, root)
    if note:
        explanation.append(note)
    explanation.extend(_precursors(root, findings))
    if root.step is None:  # a detector finding knows its step
        root.step = _step_of(root, step_marks)
    explained = [f for f in findings if f not in independent]
    rival_classes = {f.cls for f in pool if f.cls != root.cls}
    confidence = 0.9 if not rival_classes else max(0.5, 0.9 - 0.15 * len(rival_classes))
    if root.cls == "unknown_crash":
        confidence = 0.4
    if root.rank is None and any(f.rank is not None for f in findings):
        confidence -= 0.1
    root.explanation = " ".join([root.explanation, *explanation]).strip()
    where = f" on rank {root.rank}" if root.rank is not None else ""
    host = f" ({root.host})" if root.host else ""
    consequence = f"; {len(explained)} other finding(s) are its consequences" if explained else ""
    summary = f"{root.title}{where}{host}{consequence}."
    candidates = sorted((f for f in pool if f is not root), key=_sort_key)
    return Verdict(status, root, round(max(0.1, confidence), 2), _symptoms(explained), candidates, summary)
