"""Per-rank measurement rows: one line per rank with the same text and its own timing or bandwidth.

Benchmarks and debugging prints report a collective's time, a step's latency or a bandwidth once per rank
("Rank 0 has data ... time cost 23.3 bandwidth 17.1", "[rank3]: allreduce took 2.8 ms"). Such a row names its
rank (in a torchrun/MPI prefix or a leading "Rank N" label) and holds numbers that are measurements: a
timing or bandwidth word before them or a unit after them. Every other number is kept as part of what the
rows of one table share, so rows of different steps or sizes never mix. The comparison across ranks is in
analyses/rank_timings.py.
"""

from __future__ import annotations

import re

from forensics.line_prefixes import ISO_TS, MONTHDAY_TS
from forensics.sources.base import LineExtractor, LineRecord, Sink

SOURCE = "rank_measurements"
TIMESTAMP = re.compile(re.sub(r"\(\?P<\w+>", "(?:", f"{ISO_TS.pattern}|{MONTHDAY_TS.pattern}"))
KIND = "rank_measurement"
LEADING_RANK = re.compile(
    r"^\W{0,3}(?:global[_ ])?(?:rank|gpu|device|process|proc|worker)\s*[:#=]?\s*(?P<rank>\d{1,5})\b\]?", re.I
)
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")
MEASURE_WORD = re.compile(
    r"(?:time|times|cost|latency|duration|elapsed|took|takes|bandwidth|bw|busbw|algbw|throughput|tput)$", re.I
)
RATE = re.compile(r"(?:bandwidth|bw|busbw|algbw|throughput|tput)$|/s$|bps$", re.I)  # higher is faster
MEASURE_UNIT = re.compile(
    r"^\s?(?:s|sec|secs|seconds?|ms|msec|millisec(?:ond)?s?|us|usec|µs|ns|[KMGT]i?B/s|[KMGT]bps|[KMGT]b/s)\b", re.I
)
RANKISH_WORD = re.compile(r"(?:cuda|gpu|device|dev|rank|local_rank|node|pid|tid|host|worker|process)$", re.I)
LABEL = re.compile(r"([A-Za-z_][\w-]*)[\s:=(\[,]*$")
MEASURE_HINT = re.compile(
    r"(?i)time|cost|latency|duration|elapsed|took|takes|bandwidth|bw|throughput|tput|\d\s?(?:s|sec|ms|us)\b|/s\b"
)


def _measurements(body: str) -> tuple[str, list[str], dict[str, float], list[str]] | None:
    """The row's text with its numbers masked, the numbers that are not measurements, the measurements by
    their label, and which of them are rates (bandwidths); None when no number is a measurement."""
    template: list[str] = []
    shared: list[str] = []
    measures: dict[str, float] = {}
    rates: list[str] = []
    last = 0
    for m in NUMBER.finditer(body):
        before, after = body[last : m.start()], body[m.end() : m.end() + 12]
        template.append(before)
        template.append("#")
        last = m.end()
        label = LABEL.search(body[max(0, m.start() - 40) : m.start()])
        word = label[1] if label else ""
        unit = MEASURE_UNIT.match(after)
        if MEASURE_WORD.search(word) or unit:
            key = word if MEASURE_WORD.search(word) or not unit else unit[0].strip()
            while key in measures:
                key += "'"
            measures[key] = float(m[0])
            if RATE.search(word) or (unit and RATE.search(unit[0].strip())):
                rates.append(key)
        elif not RANKISH_WORD.search(word):  # a device index or pid differs per rank; it is not shared
            shared.append(m[0])
    if not measures:
        return None
    template.append(body[last:])
    return "".join(template), shared, measures, rates


def _handle(rec: LineRecord, sink: Sink) -> None:
    if rec.kind is not None:  # another reader already knows this line
        return
    body = TIMESTAMP.sub("", rec.hit.ctx.body)
    if not MEASURE_HINT.search(body):
        return
    rank = rec.hit.ctx.rank
    label = LEADING_RANK.match(body)
    if label:
        rank = int(label["rank"])
        body = body[label.end() :]
    if rank is None:
        return
    found = _measurements(body)
    if found is None:
        return
    template, shared, measures, rates = found
    rec.hit.ctx.rank = rank
    rec.kind = KIND
    rec.source = SOURCE
    rec.level = "info"
    rec.fields.update(template=template[:300], shared=shared, measures=measures, rates=rates)


EXTRACTORS = [
    LineExtractor(
        "rank_measurements",
        SOURCE,
        r"(?i)(?:rank|gpu|device|process|proc|worker|default)\s*[:#=]?\s*\d+",
        _handle,
        # a line `_handle` reads holds a measurement hint (MEASURE_HINT, searched in the whole line here): Rust
        # leaves out the rest, a run's NCCL INFO and ProcessGroupNCCL lines that name ranks by the thousand
        requires=MEASURE_HINT.pattern,
        # its words are in most lines of a large run (every ProcessGroupNCCL line names a rank and a GPU, every
        # Ray worker line says "WorkerDict", NCCL's host names hold "gpu"): Rust searches the batch instead
        literal_prefilter=False,
    ),
]
