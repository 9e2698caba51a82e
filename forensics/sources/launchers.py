"""Job launchers other than torchrun (Slurm's srun, Open MPI's mpirun, pdsh, DeepSpeed's launcher): their reports
of a task that exited with a non-zero code. Such a report says a rank failed, not why: it is a crash of unknown
cause unless a rule explains the task's own failure (a signal has its rules: Killed, Segmentation fault, -9).
"""

from __future__ import annotations

import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "launcher"
KIND = "child_exit"
# Each names the exit code (`code`, 1 where only "non-zero" is said) and, where it says, the host, srun's task
# number (the job's global rank, SLURM_PROCID) or DeepSpeed's --local_rank (its code may be cut off with the line).
REPORTS = [
    re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<task>[\d,-]+): Exited with exit code (?P<code>\d+)"),
    re.compile(r"^pdsh@\S+: (?P<host>[\w.-]+): ssh exited with exit code (?P<code>\d+)"),
    re.compile(r"\b\d+ process(?:es)? returned a non-zero exit code\b"),
    re.compile(r"sigkill_handler\] \[.*?'--local_rank=(?P<local>\d+)'.*\] exits with return code = (?P<code>-?\d+)"),
    # the same report with its command hard-wrapped or cut before the code: DeepSpeed logs it at ERROR only for a
    # child that exited non-zero
    re.compile(r"\[ERROR\] \[launch\.py:\d+:sigkill_handler\] \[.*?'--local_rank=(?P<local>\d+)'"),
]


def _handle(rec: LineRecord, sink: Sink) -> None:
    m = next((m for m in (r.search(rec.hit.ctx.body) for r in REPORTS) if m), None)
    if m is None:
        return
    said = m.groupdict()
    code = int(said["code"]) if said.get("code") else None
    if code == 0:
        return
    rec.kind = KIND
    rec.source = SOURCE
    rec.level = "error"
    if code is not None or "local" not in said:
        rec.fields["exitcode"] = 1 if code is None else code
    if said.get("host"):
        rec.hit.ctx.host = rec.fields["host"] = said["host"]
    if (said.get("task") or "").isdigit():
        rec.hit.ctx.rank = int(said["task"])
    if said.get("local"):
        rec.fields["local_rank"] = int(said["local"])


EXTRACTORS = [
    LineExtractor(
        KIND,
        SOURCE,
        r"Exited with exit code \d+|returned a non-zero exit code|ssh exited with exit code \d+"
        r"|exits with return code = -?\d+|sigkill_handler\] \[",
        _handle,
    )
]
