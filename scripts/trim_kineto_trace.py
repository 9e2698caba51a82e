"""Trim a Kineto trace to a few profiler steps, keeping its structure and its text byte for byte.

    python scripts/trim_kineto_trace.py IN.pt.trace.json.gz OUT.pt.trace.json.gz --steps 5 6

Kept: every metadata event (`ph: M`) and every event that starts inside the window from the first kept
`ProfilerStep#N` (CPU side) to the end of the last kept one (GPU side, which runs later). The top-level keys
before and after `traceEvents` are copied unchanged; each kept event keeps Kineto's own layout. Used to make
the small fixtures under tests/fixtures/traces/ from captured traces.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

EVENT_SEPARATOR = re.compile(r"\n  \},\n  \{\n")  # Kineto writes each event as "  {\n ... \n  }"


def _window(events: list[dict], steps: set[int]) -> tuple[float, float]:
    marks = [
        e for e in events if re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name"))) and int(e["name"][13:]) in steps
    ]
    if not marks:
        raise SystemExit(f"no ProfilerStep#N for steps {sorted(steps)}")
    return min(e["ts"] for e in marks), max(e["ts"] + e["dur"] for e in marks)


def trim(source: Path, target: Path, steps: set[int]) -> tuple[int, int]:
    text = gzip.decompress(source.read_bytes()).decode() if source.suffix == ".gz" else source.read_text()
    events = json.loads(text)["traceEvents"]
    start = text.index('"traceEvents": [') + len('"traceEvents": [')
    end = text.rindex("]")
    body = text[start:end].strip()
    pieces = EVENT_SEPARATOR.split(body.removeprefix("{\n").removesuffix("\n  }"))
    if len(pieces) != len(events):
        raise SystemExit(f"{source}: {len(pieces)} pieces for {len(events)} events; not Kineto's layout")
    low, high = _window(events, steps)
    kept = [
        "  {\n" + piece + "\n  }"
        for piece, e in zip(pieces, events, strict=True)
        if e.get("ph") == "M" or (isinstance(e.get("ts"), (int, float)) and low <= e["ts"] <= high)
    ]
    out = text[:start] + "\n" + ",\n".join(kept) + "\n  " + text[end:]
    json.loads(out)  # still one valid document
    target.write_bytes(gzip.compress(out.encode(), 9, mtime=0))
    return len(kept), len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    args = parser.parse_args()
    kept, total = trim(args.source, args.target, set(args.steps))
    print(f"{args.target}: kept {kept} of {total} events, {args.target.stat().st_size} bytes")


if __name__ == "__main__":
    main()
