"""From events to a verdict: group rule hits into findings, then find the first domino.

The root cause is the earliest finding that no other finding explains (`symptom_of` in the rules).
torchrun's "Root Cause (first observed failure)" is only the first process to exit; it is kept as a
finding like any other and never trusted on its own. Consequences that only say "something died"
(a dead Ray actor, a collective timeout) never win while a real cause is in the logs - not even an
exception that no rule knows: such an exception becomes an `unknown_crash` finding that explains them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import polars as pl

from forensics.analyses.collectives import judge_ranks, op_mismatches, rank_waits
from forensics.analyses.evidence import explain_collective_mismatch, read_evidence
from forensics.model import Evidence, Finding, Symptom, Verdict, empty_series, severity_rank
from forensics.rules.model import Rule

MAX_EVIDENCE = 5
WRAPPER_EXCEPTIONS = {
    "RayTaskError",
    "ActorDiedError",
    "RayActorError",
    "ActorUnavailableError",
    "ChildFailedError",
    "DistBackendError",
    "WorkerCrashedError",
    "CalledProcessError",
    "SystemExit",
    "KeyboardInterrupt",
}
CROSS_RANK_CLASSES = ("nccl_timeout", "hang", "collective_mismatch")
WAITING_RULES = ("nccl-watchdog-timeout", "watchdog-hang", "rendezvous-timeout")  # their rank is a waiter's
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=timezone.utc)
_PYTHON_EXCEPTION_START = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b(?:\([\w.]+\))?(?::|\s*$)")


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


def _occ_key(o: _Occurrence) -> tuple[datetime, tuple[int, int, int]]:
    return (o.row["ts"] or _FAR_FUTURE, o.order)


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
    for occ in sorted(_rows(candidates, file_order), key=_occ_key):
        for rule_id in occ.fields.get("rules", []):
            rule = rules.get(rule_id)
            if rule is None:
                continue
            key = (rule_id, occ.row["rank"])
            finding = grouped.get(key)
            if finding is None:
                finding = grouped[key] = _new_finding(rule, occ)
            finding.count += occ.fields.get("repeats", {}).get("count", 1)  # lines the scanner counted into it
            if len(finding.evidence) < MAX_EVIDENCE:
                finding.evidence.append(Evidence(occ.row["file"], occ.row["line"], occ.row["message"]))
            for k, v in occ.fields.items():
                if k != "rules":
                    finding.fields.setdefault(k, v)
    findings = _fold_unranked(list(grouped.values()))
    findings.extend(_collective_op_mismatch(events, rules, file_order))
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


def _collective_op_mismatch(events: pl.DataFrame, rules: dict[str, Rule], file_order: dict[str, int]) -> list[Finding]:
    """Ranks of one group timed out in different collectives at the same SeqNum: they called different ones."""
    mismatches = op_mismatches(rank_waits(events))
    if not mismatches:
        return []
    seq, ops = mismatches[0]
    template = rules.get("collective-mismatch")
    rule = Rule(
        id="collective-op-mismatch",
        title="Ranks wait in different collectives at the same sequence number",
        cls="collective_mismatch",
        severity="critical",
        layer="script",
        description="Watchdog timeouts of one process group name different OpTypes for the same SeqNum.",
        match=(),
        symptom_of=template.symptom_of if template else (),
        remediation=template.remediation if template else (),
    )
    timeouts = events.filter(pl.col("kind") == "watchdog_timeout")
    occs = [o for o in _rows(timeouts, file_order) if o.fields.get("seq") == seq]
    occs.sort(key=_occ_key)
    finding = _new_finding(rule, occs[0])
    finding.count = len(occs)
    finding.evidence = [Evidence(o.row["file"], o.row["line"], o.row["message"]) for o in occs[:MAX_EVIDENCE]]
    sizes = sorted(ops.items(), key=lambda kv: len(kv[1]))
    minority = sizes[0][1] if len(sizes[0][1]) < len(sizes[1][1]) else []
    waits = "; ".join(f"{op} on rank(s) {ranks}" for op, ranks in ops.items())
    finding.explanation = f"At SeqNum {seq} the ranks wait in different collectives: {waits}."
    finding.rank = minority[0] if len(minority) == 1 else None
    if finding.rank is not None:
        finding.explanation += f" Rank {finding.rank} is the odd one out."
    else:
        finding.explanation += " The logs cannot tell which side deviated; candidates: " + ", ".join(
            f"rank(s) {r} ({op})" for op, r in ops.items()
        )
        finding.explanation += "."
    finding.fields.update(seq=seq, ops=ops)
    return [finding]


def _is_python_exception(occ: _Occurrence) -> bool:
    """An exception line as Python prints it (at the start of the line, or right after a traceback frame)."""
    return bool(occ.fields.get("raised_at")) or bool(_PYTHON_EXCEPTION_START.match(occ.row["message"] or ""))


def _innermost(occ: _Occurrence) -> int:
    """0 for a plain exception, 1 for a wrapper that names its cause (RayTaskError(X)): prefer the inner one."""
    return 0 if occ.fields.get("exception") not in WRAPPER_EXCEPTIONS else 1


def _serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if severity_rank(f.severity) >= severity_rank("error")]


def _unknown_crash(events: pl.DataFrame, findings: list[Finding], file_order: dict[str, int]) -> list[Finding]:
    """When no rule explains a failure, the first real exception (innermost, else a non-zero exit) is the lead.

    Beside serious findings that are only consequences (every one lists unknown_crash in symptom_of), only an
    exception can be their cause; a bare non-zero exit is then one of the consequences too.
    """
    serious = _serious(findings)
    if not all("unknown_crash" in f.symptom_of for f in serious):
        return []
    failures = events.filter(pl.col("kind").is_in(["exception", "torchrun_failure", "torchrun_child_failed"]))
    exceptions: list[_Occurrence] = []
    exits: list[_Occurrence] = []
    for occ in _rows(failures, file_order):
        if occ.fields.get("rules"):
            continue  # a line a rule already explains
        if occ.row["kind"] == "exception":
            exc, cause = occ.fields.get("exception"), occ.fields.get("cause")
            if exc in WRAPPER_EXCEPTIONS and (not cause or cause in WRAPPER_EXCEPTIONS):
                continue
            if _is_python_exception(occ):
                exceptions.append(occ)
        elif occ.fields.get("exitcode", 1) != 0:
            exits.append(occ)
    pool = exceptions or ([] if serious else exits)
    if not pool:
        return []
    best = min(pool, key=lambda o: (_innermost(o), *_occ_key(o)))
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
    if best.fields.get("cause"):
        finding.explanation = (
            f"{best.fields['exception']}({best.fields['cause']}) wraps a {best.fields['cause']} raised in a "
            "Ray task; its own traceback is not in these logs."
        )
    return [finding]


def _explains(cause: Finding, effect: Finding) -> bool:
    """Whether `cause` explains `effect` (effect lists cause's class, and not the other way round earlier)."""
    if cause is effect or cause.cls not in effect.symptom_of:
        return False
    if cause.cls == "unknown_crash" and _sort_key(cause) > _sort_key(effect):
        return False  # an unrecognised exception cannot explain what happened before it
    if effect.cls in cause.symptom_of:  # mutual: the earlier one is the cause
        return _sort_key(cause) <= _sort_key(effect)
    return True


def _cross_rank(events: pl.DataFrame, root: Finding) -> None:
    """Name the rank the others waited for (and its host), or say why the logs cannot."""
    verdict = judge_ranks(events, rank_waits(events))
    if not verdict.explanation:
        return
    if verdict.suspect is not None:
        root.rank, root.host = verdict.suspect, verdict.host or root.host
    elif root.rule in WAITING_RULES:  # the rank that logged the timeout only waited; it is not the culprit
        root.fields["observed_on_rank"] = root.rank
        root.rank = None
    if verdict.candidates:
        root.fields["candidate_ranks"] = verdict.candidates
    if verdict.first_collective_never_completed:
        root.remediation = [r for r in root.remediation if "NCCL_SOCKET_IFNAME" in r] + [
            r for r in root.remediation if "NCCL_SOCKET_IFNAME" not in r
        ]
    root.explanation = " ".join(
        x for x in (root.explanation, verdict.explanation[:1].upper() + verdict.explanation[1:]) if x
    )


def _adopt_rank(root: Finding, findings: list[Finding]) -> None:
    """A rank-less root (torchrun's agent line, a driver line) takes the rank its class names elsewhere."""
    if root.rank is not None or root.cls in (*CROSS_RANK_CLASSES, "unknown_crash"):
        return
    ranks = {f.rank for f in findings if f.cls == root.cls and f.rank is not None}
    if len(ranks) == 1:
        root.rank = ranks.pop()
        root.host = root.host or next((f.host for f in findings if f.rank == root.rank and f.host), None)


def _torchrun_note(events: pl.DataFrame, root: Finding) -> str:
    named = events.filter(pl.col("kind") == "torchrun_failure")
    for row in named.iter_rows(named=True):
        fields = json.loads(row["fields"] or "{}")
        named = row["rank"]
        if fields.get("torchrun_root_cause") and named is not None and root.rank is not None and named != root.rank:
            return (
                f"torchrun's summary names rank {named} (exit code {fields.get('exitcode')}) as the first "
                f"observed failure; that rank only exited first — it is a symptom."
            )
    return ""


def _step_of(root: Finding, step_marks: list[tuple[str, int, int]]) -> int | None:
    first = root.evidence[0] if root.evidence else None  # a detector's finding may carry no line
    same_file = [step for file, line, step in step_marks if first and file == first.file and line < first.line]
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


def diagnose(
    events: pl.DataFrame,
    findings: list[Finding],
    step_marks: list[tuple[str, int, int]],
    series: pl.DataFrame | None = None,
) -> Verdict:
    if not findings:
        return Verdict("healthy", None, 0.9, [], [], "No failure signature found.")
    series = series if series is not None else empty_series()
    foretold = {f.fields.get("leads_to") for f in findings}  # classes a detector saw coming
    for finding in findings:
        read_evidence(finding, series, quote_history=finding.cls not in foretold)
    independent = [f for f in findings if not any(_explains(g, f) for g in findings)]
    serious = [f for f in independent if severity_rank(f.severity) >= severity_rank("error")]
    pool = serious or independent or findings
    root = min(pool, key=lambda f: (_sort_key(f), -severity_rank(f.severity)))
    status = "failed" if severity_rank(root.severity) >= severity_rank("error") else "degraded"
    if root.cls == "collective_mismatch" and root.rule != "collective-op-mismatch":
        reports = [e.text for f in findings if f.cls == "collective_mismatch" for e in f.evidence]
        explain_collective_mismatch(root, reports)
    elif root.cls in CROSS_RANK_CLASSES and root.rule != "collective-op-mismatch":
        _cross_rank(events, root)
    _adopt_rank(root, findings)
    note = _torchrun_note(events, root)
    if note:
        root.explanation = " ".join(x for x in (root.explanation, note) if x)
    root.explanation = " ".join([root.explanation, *_precursors(root, findings)]).strip()
    if root.step is None:  # a detector finding knows its step
        root.step = _step_of(root, step_marks)
    explained = [f for f in findings if f not in independent]
    rival_classes = {f.cls for f in pool if f.cls != root.cls}
    confidence = 0.9 if not rival_classes else max(0.5, 0.9 - 0.15 * len(rival_classes))
    if root.cls == "unknown_crash":
        confidence = 0.4
    if root.rank is None and any(f.rank is not None for f in findings):
        confidence -= 0.1
    where = f" on rank {root.rank}" if root.rank is not None else ""
    host = f" ({root.host})" if root.host else ""
    consequence = f"; {len(explained)} other finding(s) are its consequences" if explained else ""
    summary = f"{root.title}{where}{host}{consequence}."
    candidates = sorted((f for f in pool if f is not root), key=_sort_key)
    return Verdict(status, root, round(max(0.1, confidence), 2), _symptoms(explained), candidates, summary)
