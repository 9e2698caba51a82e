"""NCCL debug output: version, communicator init (which host:pid is which rank), WARN lines.

The `[N]` after `host:pid:tid` is the CUDA device, not the rank; ranks come from `Init COMPLETE` /
`Init START` lines, which map each process to its rank for the whole run.
"""

from __future__ import annotations

import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "nccl"
VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?P<suffix>[^\s+]*)(?:\+cuda(?P<cuda>[\d.]+))?")
INIT = re.compile(
    r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+)"
    r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-f]+))?(?: commId (?P<cid>0x[0-9a-f]+))?"
    r" - Init (?P<phase>START|COMPLETE)"
)
WARN = re.compile(r"NCCL WARN (?P<msg>.*)$")


def _handle(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    rec.source = SOURCE
    m = INIT.search(body)
    if m:
        rec.kind = "nccl_init"
        rec.level = "info"
        rec.hit.ctx.rank = int(m["rank"])
        rec.fields.update(
            rank=int(m["rank"]), nranks=int(m["nranks"]), cuda_dev=int(m["dev"]), phase=m["phase"], comm=m["comm"]
        )
        if m["bus"]:
            rec.fields["bus_id"] = m["bus"]
        return
    m = WARN.search(body)
    if m:
        rec.kind = "nccl_warn"
        rec.level = "warning"
        rec.fields["warn"] = m["msg"][:500]
        return
    m = VERSION.search(body)
    if m:
        rec.kind = "nccl_version"
        rec.level = "info"
        rec.fields["nccl_version"] = m["version"] + (m["suffix"] or "")
        if m["cuda"]:
            rec.fields["cuda_version"] = m["cuda"]


EXTRACTORS = [
    LineExtractor(
        "nccl",
        SOURCE,
        r"NCCL WARN |NCCL version \d|rank \d+ nranks \d+ cudaDev \d+.* - Init (?:START|COMPLETE)",
        _handle,
    ),
]
