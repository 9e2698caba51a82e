"""Version banners that libraries print into a run's logs, for the environment and the health checks.

vLLM names its version when an engine starts (`Initializing an LLM engine (v0.6.3) with config:`,
V1: `Initializing a V1 LLM engine (v0.8.5) with config:`) and in its API server banner. NCCL's
`NCCL version 2.21.5+cuda12.4` line is read by the NCCL source and becomes an event.
"""

from __future__ import annotations

import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "versions"
VLLM = re.compile(
    r"Initializing an? (?:V\d )?LLM engine \(v(?P<v>\d[\w.+-]*)\)|vLLM API server version (?P<v2>\d[\w.+-]*)"
)


def _handle_vllm(rec: LineRecord, sink: Sink) -> None:
    m = VLLM.search(rec.hit.ctx.body)
    if m:
        sink.environment.setdefault("vllm_version", m["v"] or m["v2"])


EXTRACTORS = [
    LineExtractor(
        "vllm_version",
        SOURCE,
        r"Initializing an? (?:V\d )?LLM engine \(v\d|vLLM API server version \d",
        _handle_vllm,
    )
]
