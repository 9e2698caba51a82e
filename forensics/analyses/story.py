"""The root cause's story, told in one place once the root is chosen.

The explain rooms have read each finding's own evidence. The story adds what only the whole run tells: the
collective reports of every rank (who ran what), the rank the others waited for and its host, a rank-less
root's rank where its class names one elsewhere, torchrun's misleading summary, the warnings that were
heading for the failure (memory growing towards an OOM), the step it happened in, and the Ray actor and
node behind it.
"""

from __future__ import annotations

import json

import polars as pl

from forensics.analyses.collectives import judge_ranks, rank_waits
from forensics.analyses.explain.nccl import explain_collective_mismatch
from forensics.analyses.explain.text import join
from forensics.analyses.ray_cluster import RayCluster, root_story
from forensics.model import Evidence, Finding

CROSS_RANK_CLASSES = ("nccl_timeout", "hang", "collective_mismatch")
WAITING_RULES = ("nccl-watchdog-timeout", "watchdog-hang", "rendezvous-timeout")  # their rank is a waiter's


def tell(
    root: Finding,
    findings: list[Finding],
    events: pl.DataFrame,
    step_marks: list[tuple[str, int, int]],
    cluster: RayCluster | None = None,
) -> None:
    """Complete the root's explanation, rank, host, step and remediation order from the whole run."""
    if root.cls == "collective_mismatch" and root.rule != "collective-op-mismatch":
        reports = [e.text for f in findings if f.cls == "collective_mismatch" for e in f.evidence]
        if not explain_collective_mismatch(root, reports):
            _transfer_ends(root, findings)
    elif root.cls in CROSS_RANK_CLASSES and root.rule != "collective-op-mismatch":
        _cross_rank(events, root)
    _adopt_rank(root, findings)
    _launcher_rank(root, events)
    root.explanation = join(root.explanation, _torchrun_note(events, root), *_precursors(root, findings))
    if root.step is None:  # a detector finding knows its step
        root.step = _step_of(root, step_marks)
    if cluster is not None:
        root.explanation = join(root.explanation, root_story(root, cluster))


def _cross_rank(events: pl.DataFrame, root: Finding) -> None:
    """Name the rank the others waited for (and its host), or say why the logs cannot."""
    waits = rank_waits(events)
    verdict = judge_ranks(events, waits)
    if not verdict.explanation:
        return
    if verdict.suspect is not None:
        root.rank, root.host = verdict.suspect, verdict.host or root.host
    elif root.rule in WAITING_RULES and (verdict.candidates or len(waits) > 1):
        # the rank that logged the timeout only waited; another rank in the logs may be the culprit. A lone
        # rank's timeout with no other rank to suspect keeps that rank: it is the failure these logs show.
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
    if verdict.suspect is not None:
        root.explanation = join(root.explanation, _stopped_by_torchrun(events, root))


def _stopped_by_torchrun(events: pl.DataFrame, root: Finding) -> str:
    """The suspect's own entry in torchrun's summary, when torchrun had to stop it (SIGTERM): it was still
    running after the ranks that waited for it had failed. The line joins the evidence."""
    rows = events.filter((pl.col("kind") == "torchrun_failure") & (pl.col("rank") == root.rank)).sort(["file", "line"])
    for row in rows.iter_rows(named=True):
        if json.loads(row["fields"] or "{}").get("signal") != "SIGTERM":
            continue
        if (row["file"], row["line"]) not in {(e.file, e.line) for e in root.evidence}:
            root.evidence.append(Evidence(row["file"], row["line"], row["message"]))
        return (
            f"torchrun had to stop rank {root.rank} (SIGTERM in its summary) once the others had failed: it had "
            "not failed itself."
        )
    return ""


def _transfer_ends(root: Finding, findings: list[Finding]) -> None:
    """A size mismatch of one transfer is seen by one end only: the rank that logs it posted one size and got
    another. The rank whose call differs is that rank (it posted the odd size) or the peer at the other end
    (it sent one), and with more than two ranks that peer is any of the ranks that lost their connection to it
    when it aborted (failing those, any rank in the logs). Unless no other rank is in the logs, the rank that
    saw it is where it was observed, not the culprit: name the candidates instead of guessing."""
    seen = root.rank
    if seen is None or root.fields.get("local_size") is None or root.fields.get("remote_size") is None:
        return
    others = {f.rank for f in findings if f.rank is not None and f.rank != seen}
    if not others:
        return
    peers = sorted({f.rank for f in findings if f.rule == "comm-transport-error" and f.rank not in (None, seen)})
    candidates = sorted({seen, *(peers or others)})  # without a broken connection to go by, any rank here
    root.fields["observed_on_rank"] = seen
    root.fields["candidate_ranks"] = candidates
    root.rank = None
    lost = ""
    if peers:
        who = f"rank {peers[0]} lost its" if len(peers) == 1 else f"ranks {peers} lost their"
        lost = f"; {who} connection to it when it aborted"
    root.explanation = join(
        root.explanation,
        f"Rank {seen} is the end that noticed{lost}. The rank whose call differs is rank {seen} itself or the peer "
        f"that sent to it, and the logs do not say which: compare the collective's shapes on ranks {candidates}.",
    )


def _adopt_rank(root: Finding, findings: list[Finding]) -> None:
    """A rank-less root (torchrun's agent line, a driver line) takes the rank its class names elsewhere."""
    if root.rank is not None or root.cls in (*CROSS_RANK_CLASSES, "unknown_crash"):
        return
    ranks = {f.rank for f in findings if f.cls == root.cls and f.rank is not None}
    if len(ranks) == 1:
        root.rank = ranks.pop()
        root.host = root.host or next((f.host for f in findings if f.rank == root.rank and f.host), None)


def _launcher_rank(root: Finding, events: pl.DataFrame) -> None:
    """A root whose lines name no rank takes the rank of the one worker the launcher (torchrun's agent, srun,
    DeepSpeed's) saw fail: the process that raised it (a timeout or hang is seen on every rank, so the one that
    exited is not the one to blame)."""
    if root.rank is not None or root.cls in CROSS_RANK_CLASSES or events.is_empty():
        return
    failed = events.filter(pl.col("kind").is_in(["torchrun_child_failed", "child_exit"]) & pl.col("rank").is_not_null())
    ranks = set(failed.get_column("rank").to_list())
    hosts = {h for h in failed.get_column("host").to_list() if h}
    if len(ranks) != 1 or len(hosts) > 1 or (root.host and hosts and root.host not in hosts):
        return
    root.rank = ranks.pop()
    root.host = root.host or (hosts.pop() if hosts else None)
    root.explanation = join(
        root.explanation, f"Its lines name no rank; rank {root.rank} is the only worker the launcher saw fail."
    )


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
