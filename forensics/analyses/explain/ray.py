"""Ray: a RayTaskError chain read down to the innermost task, and why a dead actor's worker vanished.

The chain's tasks (`task`, `task_pid`, `task_ip`) and an actor's exit (`exit_type`, `exit_detail`) are
extracted by the Ray reader (sources/ray_session.py) on each line; they are read here from the evidence's
facts. The story of a node death (killed raylet vs missed heartbeats, actors lost) is told by the Ray
cluster reading, which sees every node's logs.
"""

from __future__ import annotations

import itertools

from forensics.analyses.explain.context import Reading
from forensics.analyses.explain.text import join
from forensics.model import Finding

ACTOR_GONE = ("ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError")


def explain_ray_wrapper(finding: Finding, reading: Reading) -> None:
    """A RayTaskError chain printed outer first: name the innermost task and show its line first (after the
    exception lines of the task itself, where the log has them)."""
    chain = [e for e in finding.evidence if e.facts.get("task") and e.facts.get("cause")]
    if not chain:
        return
    inner = chain[-1]
    task, pid, ip = inner.facts["task"], inner.facts.get("task_pid"), inner.facts.get("task_ip")
    outer = list(dict.fromkeys(e.facts["task"] for e in chain[:-1] if e.facts["task"] != task))
    finding.evidence.remove(inner)
    own = sum(1 for _ in itertools.takewhile(lambda e: not e.facts.get("cause"), finding.evidence))
    finding.evidence.insert(own, inner)
    finding.host = ip  # where the error was raised, not where the driver re-raised it
    finding.fields.update(task=task, task_pid=pid, task_ip=ip)
    where = f"{task} (pid {pid} on {ip})"
    cause = str(inner.facts["cause"]).rsplit(".", 1)[-1]
    if cause in ACTOR_GONE:
        text = f"{where} got {cause}: an actor it called had died"
    else:
        text = f"{cause} was raised in {where}"
    text += f" and was re-raised by {', '.join(outer)}." if outer else "."
    finding.explanation = join(finding.explanation, text)


def explain_actor_death(finding: Finding, reading: Reading) -> None:
    explain_ray_wrapper(finding, reading)
    for e in finding.evidence:
        detail = str(e.facts.get("exit_detail", ""))
        if "connection error code 2" in detail:
            finding.explanation = join(
                finding.explanation,
                f"Ray saw the worker process vanish ({e.facts.get('exit_type')}: {detail.split('. ')[0]}) without "
                "an exception: it was killed (SIGKILL - the kernel OOM killer is the usual sender) or crashed in "
                "native code. Nothing in these logs says which; the worker's host kernel log (dmesg) and raylet.out "
                "will.",
            )
            return


def explain_node_death(finding: Finding, reading: Reading) -> None:
    """The node's address; the rest of the story is the cluster reading's."""
    finding.host = finding.host or finding.fields.get("node_ip")
