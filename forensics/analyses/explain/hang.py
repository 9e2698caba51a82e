"""Hangs seen in the text: what a stack dump of the stuck process shows, how long a process says it waited."""

from __future__ import annotations

from forensics.analyses.explain.context import Reading
from forensics.model import Finding


def explain_stall(finding: Finding, reading: Reading) -> None:
    """Name the frame the stuck thread waits in, or the wait the program reported; a detector's own words stay."""
    if finding.explanation:
        return
    waiting_in = finding.fields.get("waiting_in")
    waited = finding.fields.get("waited_s")
    if isinstance(waiting_in, str):
        finding.explanation = (
            f"Someone dumped the stacks of a live process that had stopped making progress; its innermost frame "
            f"is {waiting_in}. Compare with the same dump of the other ranks: the one not waiting in the same "
            "place (a collective, a queue, a lock) is the one they wait for."
        )
    elif waited is not None:
        times = f", {finding.count} times in these logs" if finding.count > 1 else ""
        finding.explanation = (
            f"The process reports waiting {waited} s without progress{times}; repeated, it is hung rather than slow."
        )
