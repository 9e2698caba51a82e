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
from datetime import datetime
from typing import Any

import polars as pl

from forensics.analyses.collectives import op_mismatches, rank_waits
from forensics.analyses.coverage import INTERRUPTS, interrupted
from forensics.analyses.explain import Reading, explain
from forensics.analyses.ray_cluster import RayCluster
from forensics.analyses.story import tell
from forensics.catalogue import Catalogue, Detection
from forensics.model import FAR_FUTURE, Evidence, Finding, Inconclusive, Symptom, Verdict, empty_series, severity_rank
from forensics.rules.model import USER_REGEX_TIMEOUT_S, Rule

MAX_EVIDENCE = 5
READINGS_PER_LINE = 1 << 12  # room in the sequence number to order several rules' readings of one line
CUT_TRACEBACK_CONFIDENCE = 0.6  # a class read off the frames of a traceback cut before its exception line
# A root whose rule lists this many other classes as possible causes (a killed process, a dead actor, a watchdog
# timeout, a stall) is usually a consequence standing in for a cause the logs do not hold: at most this confident.
STAND_IN_CAUSES = 10
TOGETHER_S = 0.1  # seconds between two lines of one burst of output
TOGETHER_LINES = 5  # lines between them, where the lines carry no time
STAND_IN_CONFIDENCE = 0.6
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
_PYTHON_EXCEPTION_START = re.compile(
    r"^\s*(?:[A-Za-z_]\w*\.)*(?:_?[A-Z]\w*Error|(?:_?[A-Z]\w*)?Exception)\b(?:\([\w.]+\))?(?::|\s*$)"
)


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
        order = (file_order.get(row["file"], 0), row["line"] or 0, seq * READINGS_PER_LINE)
        out.append(_Occurrence(row, fields, order))
    return out


def _reading_order(occ: _Occurrence, rule: Rule) -> tuple[int, int, int]:
    """Where one rule's reading of a line sorts when several rules read it: the further right it matched, the
    earlier. A wrapper prints its reason after itself ("watchdog thread terminated with exception: <reason>",
    "communicator was aborted ... Original reason for failure was: <reason>"), so of two readings that would
    each explain the other, the reason is the cause."""
    file, line, seq = occ.order
    if len(occ.fields.get("rules", [])) < 2 or not rule.match:
        return occ.order
    text = occ.row["message"] or ""
    clause = rule.matches(text)
    found = clause.compiled.search(text, timeout=USER_REGEX_TIMEOUT_S) if clause else None
    at = min(found.start(), READINGS_PER_LINE - 1) if found else 0
    return (file, line, seq - at)


def _occ_key(o: _Occurrence) -> tuple[datetime, tuple[int, int, int]]:
    return (o.row["ts"] or FAR_FUTURE, o.order)


def _evidence(occ: _Occurrence) -> Evidence:
    return Evidence(occ.row["file"], occ.row["line"], occ.row["message"], occ.fields)


def _detection(entry: str, occ: _Occurrence, order: tuple[int, int, int] | None = None) -> Detection:
    """What one event line is, as the start of a finding of catalogue entry `entry`."""
    row = occ.row
    return Detection(
        id=entry,
        rank=row["rank"],
        host=row["host"],
        role=row["role"],
        ts=row["ts"],
        ts_inferred=bool(row["ts_inferred"]),
        order=order or occ.order,
        count=0,
        fields={k: v for k, v in occ.fields.items() if k != "rules"},
    )


def build_findings(events: pl.DataFrame, catalogue: Catalogue, file_order: dict[str, int]) -> list[Finding]:
    """One finding per (rule, rank), keeping the first occurrence and a few evidence lines."""
    candidates = events.filter(pl.col("fields").str.contains('"rules"', literal=True))
    grouped: dict[tuple[str, int | None], Finding] = {}
    for occ in sorted(_rows(candidates, file_order), key=_occ_key):
        for rule_id in occ.fields.get("rules", []):
            if rule_id not in catalogue.entries:
                continue
            key = (rule_id, occ.row["rank"])
            finding = grouped.get(key)
            if finding is None:
                order = _reading_order(occ, catalogue.entries[rule_id])
                finding = grouped[key] = catalogue.describe(_detection(rule_id, occ, order))
            finding.count += occ.fields.get("repeats", {}).get("count", 1)  # lines the scanner counted into it
            _keep_evidence(finding, _evidence(occ))
            for k, v in occ.fields.items():
                if k != "rules":
                    finding.fields.setdefault(k, v)
    findings = _fold_unranked(list(grouped.values()))
    findings.extend(catalogue.describe_all(_collective_op_mismatch(events, file_order)))
    findings.extend(catalogue.describe_all(_unknown_crash(events, findings, file_order)))
    return sorted(findings, key=Finding.sort_key)


def _keep_evidence(finding: Finding, line: Evidence) -> None:
    """A few lines per finding, the exceptions themselves before the wrappers that re-raise them
    (`RayTaskError(X)` lines come first in a log, the X line of the task that raised it later)."""
    if len(finding.evidence) < MAX_EVIDENCE:
        finding.evidence.append(line)
    elif not line.facts.get("cause") and any(e.facts.get("cause") for e in finding.evidence):
        last_wrapper = max(i for i, e in enumerate(finding.evidence) if e.facts.get("cause"))
        del finding.evidence[last_wrapper]
        finding.evidence.append(line)
    else:
        return
    finding.evidence.sort(key=lambda e: bool(e.facts.get("cause")))  # stable: line order within each kind


def _only_wrappers(f: Finding) -> bool:
    """Every line of the finding is a `RayTaskError(X)` whose printout also shows X's own line."""
    return bool(f.evidence) and all(e.facts.get("cause") and "cause_message" in e.facts for e in f.evidence)


def _own_line(root: Finding, pool: list[Finding]) -> Finding:
    """A root read only from the driver's re-raise (`RayTaskError(X)`) gives way to a finding of its class read
    from X's own line in the task: that line is the better evidence, and it comes from where the error was."""
    if not _only_wrappers(root):
        return root
    own = [g for g in pool if g.cls == root.cls and not _only_wrappers(g) and g.rank in (root.rank, None)]
    return min(own, key=Finding.sort_key) if own else root


def _fold_unranked(findings: list[Finding]) -> list[Finding]:
    """Lines of a rule with no known rank (torchrun's and Ray's re-prints of a rank's error) join that rule's
    earliest ranked finding instead of standing as a failure of their own."""
    ranked: dict[str, Finding] = {}
    for f in sorted(findings, key=Finding.sort_key):
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


def _collective_op_mismatch(events: pl.DataFrame, file_order: dict[str, int]) -> list[Detection]:
    """Ranks of one group timed out in different collectives at the same SeqNum: they called different ones."""
    mismatches = op_mismatches(rank_waits(events))
    if not mismatches:
        return []
    seq, ops = mismatches[0]
    timeouts = events.filter(pl.col("kind") == "watchdog_timeout")
    occs = [o for o in _rows(timeouts, file_order) if o.fields.get("seq") == seq]
    occs.sort(key=_occ_key)
    found = _detection("collective-op-mismatch", occs[0])
    found.count = len(occs)
    found.evidence = [_evidence(o) for o in occs[:MAX_EVIDENCE]]
    sizes = sorted(ops.items(), key=lambda kv: len(kv[1]))
    minority = sizes[0][1] if len(sizes[0][1]) < len(sizes[1][1]) else []
    waits = "; ".join(f"{op} on rank(s) {ranks}" for op, ranks in ops.items())
    found.explanation = f"At SeqNum {seq} the ranks wait in different collectives: {waits}."
    found.rank = minority[0] if len(minority) == 1 else None
    if found.rank is not None:
        found.explanation += f" Rank {found.rank} is the odd one out."
    else:
        found.explanation += " The logs cannot tell which side deviated; candidates: " + ", ".join(
            f"rank(s) {r} ({op})" for op, r in ops.items()
        )
        found.explanation += "."
    found.fields.update(seq=seq, ops=ops)
    return [found]


def _is_python_exception(occ: _Occurrence) -> bool:
    """An exception line as Python prints it (at the start of the line, or right after a traceback frame)."""
    return bool(occ.fields.get("raised_at")) or bool(_PYTHON_EXCEPTION_START.match(occ.row["message"] or ""))


def _innermost(occ: _Occurrence) -> int:
    """0 for a plain exception, 1 for a wrapper that names its cause (RayTaskError(X)): prefer the inner one."""
    return 0 if occ.fields.get("exception") not in WRAPPER_EXCEPTIONS else 1


def _serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if severity_rank(f.severity) >= severity_rank("error")]


def _unknown_crash(events: pl.DataFrame, findings: list[Finding], file_order: dict[str, int]) -> list[Detection]:
    """When no rule explains a failure, the first real exception (innermost, else a non-zero exit) is the lead.

    Beside serious findings that are only consequences (every one lists unknown_crash in symptom_of), only an
    exception can be their cause; a bare non-zero exit is then one of the consequences too.
    """
    serious = _serious(findings)
    if not all("unknown_crash" in f.symptom_of for f in serious):
        return []
    failures = events.filter(
        pl.col("kind").is_in(["exception", "torchrun_failure", "torchrun_child_failed", "child_exit"])
    )
    exceptions: list[_Occurrence] = []
    cut: list[_Occurrence] = []
    exits: list[_Occurrence] = []
    for occ in _rows(failures, file_order):
        if occ.fields.get("rules") or occ.fields.get("retried"):
            continue  # a line a rule already explains, or an attempt that Ray retried
        if occ.row["kind"] == "exception":
            exc, cause = occ.fields.get("exception"), occ.fields.get("cause")
            if occ.fields.get("truncated"):
                cut.append(occ)
            elif exc in WRAPPER_EXCEPTIONS and (not cause or cause in WRAPPER_EXCEPTIONS):
                if exc not in INTERRUPTS and exc != "SystemExit":  # stopped by hand or by the program itself
                    exits.append(occ)  # a failure reported, its cause not named: like a non-zero exit
            elif _is_python_exception(occ):
                exceptions.append(occ)
        elif occ.fields.get("exitcode", 1) != 0:
            exits.append(occ)
    pool = exceptions or cut or ([] if serious else exits)
    if not pool:
        return []
    best = min(pool, key=lambda o: (_innermost(o), *_occ_key(o)))
    found = _detection("unknown-crash", best)
    found.count = 1
    found.evidence = [_evidence(best)]
    found.explanation = _unknown_explanation(best.fields)
    return [found]


def _unknown_explanation(fields: dict[str, Any]) -> str:
    """What little an unrecognised exception says: the wrapped class of a Ray wrapper, the last frame of a cut
    traceback."""
    if fields.get("cause"):
        return (
            f"{fields['exception']}({fields['cause']}) wraps a {fields['cause']} raised in a Ray task; its own "
            "traceback is not in these logs."
        )
    raised = fields.get("raised_at") or {}
    if fields.get("truncated") and raised:
        return (
            f"The log ends inside a traceback, before its exception line: an exception was raised in "
            f"{raised.get('func')} ({raised.get('file')}:{raised.get('line')}), of a class the log does not show."
        )
    return ""


def _explains(cause: Finding, effect: Finding) -> bool:
    """Whether `cause` explains `effect` (effect lists cause's class, and not the other way round earlier)."""
    if cause is effect or cause.cls not in effect.symptom_of:
        return False
    if cause.cls == "unknown_crash" and cause.sort_key() > effect.sort_key():
        return False  # an unrecognised exception cannot explain what happened before it
    if cause.strength != "direct" and effect.strength != "direct" and _before(effect, cause):
        return False  # a reading of the curves explains only what came after it
    if effect.cls in cause.symptom_of:  # mutual: the earlier one is the cause, but of two printed together
        if _together(cause, effect) and len(cause.symptom_of) != len(effect.symptom_of):
            return len(cause.symptom_of) < len(effect.symptom_of)  # the one fewer causes explain
        return cause.sort_key() <= effect.sort_key()
    return True


def _together(a: Finding, b: Finding) -> bool:
    """Whether two findings were printed in one burst (within TOGETHER_S of each other, or, without times,
    within TOGETHER_LINES lines of one file): their order in the log then says nothing about which came first
    (a watchdog prints its wrapper line before its reason)."""
    if a.ts is not None and b.ts is not None:
        return abs((a.ts - b.ts).total_seconds()) <= TOGETHER_S
    return a.ts is None and b.ts is None and a.order[0] == b.order[0] and abs(a.order[1] - b.order[1]) <= TOGETHER_LINES


def _before(a: Finding, b: Finding) -> bool:
    """Whether `a` began before `b`: by step where both have one (detector findings carry no time of their
    own), else by time and position."""
    if a.step is not None and b.step is not None:
        return a.step < b.step
    return a.sort_key() < b.sort_key()


def _symptoms(others: list[Finding]) -> list[Symptom]:
    by_class: dict[str, list[Finding]] = defaultdict(list)
    for f in others:
        by_class[f.cls].append(f)
    symptoms = []
    for cls, group in by_class.items():
        group.sort(key=Finding.sort_key)
        ranks = sorted({f.rank for f in group if f.rank is not None})
        evidence = [e for f in group for e in f.evidence[:1]]
        symptoms.append(Symptom(cls, group[0].rule, ranks, group[0].ts, sum(f.count for f in group), evidence))
    symptoms.sort(key=lambda s: s.first_ts or FAR_FUTURE)
    return symptoms


def diagnose(
    events: pl.DataFrame,
    findings: list[Finding],
    step_marks: list[tuple[str, int, int]],
    series: pl.DataFrame | None = None,
    cluster: RayCluster | None = None,
    unread: Inconclusive | None = None,
) -> Verdict:
    """The first domino among the findings, its story, and what it explains.

    Without an alarm (a finding above info) the run is healthy only when something was read (`unread` says why
    not) and it was not stopped by hand: nothing read is not healthy (analyses/coverage.py).
    """
    alarms = [f for f in findings if severity_rank(f.severity) > severity_rank("info")]
    if not alarms:
        reason = unread or interrupted(events, step_marks)
        if reason is not None:
            return Verdict("inconclusive", None, 0.0, [], [], reason.text, reason)
        note = f" ({len(findings)} informational finding(s))" if findings else ""
        return Verdict("healthy", None, 0.9, [], [], f"No failure signature found{note}.")
    findings = alarms
    reading = Reading(
        series if series is not None else empty_series(),
        frozenset(f.fields["leads_to"] for f in findings if f.fields.get("leads_to")),
    )
    for finding in findings:
        explain(finding, reading)
    independent = [f for f in findings if not any(_explains(g, f) for g in findings)]
    serious = [f for f in independent if severity_rank(f.severity) >= severity_rank("error")]
    pool = serious or independent or findings
    root = _own_line(min(pool, key=lambda f: (f.sort_key(), -severity_rank(f.severity))), pool)
    root, ranking, crash_follows = _rank_by_evidence(root, independent, findings)
    failed = severity_rank(root.severity) >= severity_rank("error") and root.strength != STATISTICAL
    status = "failed" if failed or crash_follows else "degraded"
    tell(root, findings, events, step_marks, cluster)
    explained = [f for f in findings if f not in independent]
    rival_classes = {f.cls for f in pool if f.cls != root.cls}
    confidence = 0.9 if not rival_classes else max(0.5, 0.9 - 0.15 * len(rival_classes))
    if root.cls == "unknown_crash":
        confidence = 0.4
    if root.strength == STATISTICAL:
        confidence = _statistical_confidence(root, findings)
    if root.fields.get("truncated") and root.cls != "unknown_crash":
        confidence = min(confidence, CUT_TRACEBACK_CONFIDENCE)
    if len(set(root.symptom_of) - {root.cls}) >= STAND_IN_CAUSES:
        confidence = min(confidence, STAND_IN_CONFIDENCE)
    if root.rank is None and any(f.rank is not None for f in findings):
        confidence -= 0.1
    where = f" on rank {root.rank}" if root.rank is not None else ""
    host = f" ({root.host})" if root.host else ""
    consequence = f"; {len(explained)} other finding(s) are its consequences" if explained else ""
    summary = f"{root.title}{where}{host}{consequence}." + (f" {ranking}" if ranking else "")
    candidates = sorted((f for f in pool if f is not root), key=Finding.sort_key)
    return Verdict(
        status, root, round(max(0.1, confidence), 2), _symptoms(explained), candidates, summary, ranking=ranking
    )


STATISTICAL = "statistical"
NON_FINITE_WORDS = re.compile(r"\b(?:nan|inf|non-finite|not finite)\b", re.IGNORECASE)
CORROBORATION_WINDOW = 0.1  # findings within 10% of the root's step (at least 10 steps) corroborate it


def _is_crash(f: Finding) -> bool:
    return f.strength == "direct" and severity_rank(f.severity) >= severity_rank("error")


def _linked(soft: Finding, crash: Finding) -> bool:
    """Whether the logs show the soft finding causing the crash: the crash's entry lists the soft finding's class
    in `symptom_of`, or a non-finite value was followed by a crash whose own lines speak of NaN/inf."""
    if soft.cls in crash.symptom_of:
        return True
    if soft.strength == "measured" and soft.cls == "training_instability":
        return any(NON_FINITE_WORDS.search(e.text) for e in crash.evidence)
    return False


def _rank_by_evidence(root: Finding, independent: list[Finding], findings: list[Finding]) -> tuple[Finding, str, bool]:
    """(root, why, a crash follows from it): crash evidence outranks an earlier statistical or measured finding
    unless the logs link the two; a crash that the soft root explains still makes the run failed."""
    crashes = sorted((f for f in findings if _is_crash(f)), key=Finding.sort_key)
    if root.strength != "direct":
        linked = [c for c in crashes if _explains(root, c) or _linked(root, c)]
        if linked:
            why = (
                f"It comes before {linked[0].title} and leads to it, so the {root.strength} finding is the cause "
                "and the crash its consequence."
            )
            return root, why, True
        unexplained = [c for c in crashes if c in independent]
        if not unexplained:
            return root, "", False
        soft, root = root, unexplained[0]
    else:
        earlier = [f for f in independent if f.strength != "direct" and _before(f, root) and not _linked(f, root)]
        if not earlier:
            return root, "", False
        soft = min(earlier, key=lambda f: (f.step if f.step is not None else 1 << 30, f.sort_key()))
    when = f" at step {soft.step}" if soft.step is not None else ""
    why = (
        f"It outranks {soft.title}{when}, a {soft.strength} finding that came earlier: crash evidence outranks "
        "a finding read from the curves unless the logs link the two."
    )
    return root, why, False


def _statistical_confidence(root: Finding, findings: list[Finding]) -> float:
    """How strong a statistical root cause is: a lone reading of one curve is weak; other detectors that
    saw the same class of trouble at about the same step make it stronger."""
    if root.step is None:
        return 0.5
    window = max(10, CORROBORATION_WINDOW * root.step)
    others = {
        (f.rule, f.fields.get("metric"))
        for f in findings
        if f.cls == root.cls and f.step is not None and abs(f.step - root.step) <= window
    } - {(root.rule, root.fields.get("metric"))}  # another detector, or the same one on another curve
    return min(0.85, 0.55 + 0.1 * len(others))
