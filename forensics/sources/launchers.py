"""Job launchers other than torchrun (Slurm's srun, Open MPI's mpirun, pdsh): their reports of a task that
exited with a non-zero code. Such a report says a rank failed, not why: it is a crash of unknown cause unless
a rule explains the task's own failure (a signal has its rules: Killed, Segmentation fault, signal 9).
"""

from __future__ import annotations

import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "launcher"
KIND = "child_exit"
SRUN_TASK_EXIT = re.compile(
    r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,-]+): Exited with exit code (?P<code>\d+)"
)
MPI_CHILD_EXIT = re.compile(r"\b(?P<count>\d+) process(?:es)? returned a non-zero exit code\b")
PDSH_EXIT = re.compile(r"^pdsh@\S+: (?P<host>[\w.-]+): ssh exited with exit code (?P<code>\d+)")


def _handle(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = SRUN_TASK_EXIT.search(body) or PDSH_EXIT.search(body)
    code = int(m["code"]) if m else 1
    if (m is None and not MPI_CHILD_EXIT.search(body)) or code == 0:
        return
    rec.kind = KIND
    rec.source = SOURCE
    rec.level = "error"
    rec.fields["exitcode"] = code
    if m is not None:
        rec.hit.ctx.host = m["host"]
        rec.fields["host"] = m["host"]
        tasks = m.groupdict().get("tasks")
        if tasks and tasks.isdigit():  # srun's task number is the job's global rank (SLURM_PROCID)
            rec.hit.ctx.rank = int(tasks)


EXTRACTORS = [
    LineExtractor(
        KIND,
        SOURCE,
        r"Exited with exit code \d+|returned a non-zero exit code|ssh exited with exit code \d+",
        _handle,
    )
]
