"""forensics against HolisticTraceAnalysis (HTA) on the same Kineto traces: wall time and peak memory.

    python bench/traces.py TRACE_DIR [--hta-python /tmp/hta-venv/bin/python] [--copies 4 16] [--repeat 3]

TRACE_DIR holds one `*.pt.trace.json[.gz]` per rank. HTA is not a dependency of forensics: install it in a
separate environment (`python -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis`).
Each tiling in --copies (the captured events repeated that many times, on every rank) is measured in turn; the
last lines give, per size, how many times faster and leaner forensics is than HTA, and how forensics' peak memory
and time grow from the smallest size to the largest (goals: >= 10x faster than HTA; peak memory flat, <= 1.1x,
for 4x the trace).
Each tool runs in its own subprocess, `--repeat` times; the median time is reported. Peak memory is the
larger of the child's own high-water mark (VmHWM; not `ru_maxrss`, which Linux carries over exec from the
forking parent, here the bench holding the tiled traces) and the summed proportional set size of its
process tree sampled every 20 ms from /proc (HTA parses ranks in worker processes). HTA computes its
temporal breakdown and comm/comp overlap; forensics runs `analyze` on the folder (discovery, every reader,
rules, detectors, checks, trace review), the path a user takes.

Traces are made larger, deterministically, by tiling:
each rank's events are repeated with timestamps shifted by the trace's span (plus 1 ms), with
`External id`, `correlation`, flow ids and `ProfilerStep#N` numbers offset so that every copy stays
unique; metadata events are kept once. Both tools then read the same tiled files (gzip, as captured).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ID_KEYS = ("External id", "correlation", "Record function id", "Ev Idx")

FORENSICS_CHILD = """
import json, resource, sys, time
from pathlib import Path
from forensics.pipeline import analyze
def vm_hwm_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
t = time.perf_counter()
a = analyze([Path(sys.argv[1])])
seconds = time.perf_counter() - t
rows = {d["label"]: d["breakdown_ms"] for d in a.traces.get("devices", [])}
ru = resource.getrusage(resource.RUSAGE_SELF)
cost = (a.traces.get("what_if") or {}).get("worst") or {}
keys = ("rank", "faster_pct", "compute_faster_pct", "host_faster_pct")
print(json.dumps({"seconds": seconds, "cpu_seconds": ru.ru_utime + ru.ru_stime, "hwm_kib": vm_hwm_kib(),
                  "breakdown": rows, "straggler": (a.traces.get("straggler") or {}).get("label"),
                  "what_if": {k: cost.get(k) for k in keys}}))
"""

HTA_CHILD = """
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
def vm_hwm_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
t = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
breakdown = analyzer.get_temporal_breakdown(visualize=False)
overlap = analyzer.get_comm_comp_overlap(visualize=False)
seconds = time.perf_counter() - t
own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": seconds, "hwm_kib": vm_hwm_kib(),
                  "cpu_seconds": own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime,
                  "breakdown": json.loads(breakdown.to_json(orient="records")),
                  "overlap": json.loads(overlap.to_json(orient="records"))}))
"""


def _open(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _uncompressed_mb(path: Path) -> float:
    with _open(path) as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 24), "")) / 2**20


def _shifted(event: dict, k: int, period: float, id_stride: int, step_stride: int) -> dict:
    e = dict(event)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * period
    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * id_stride
    name = e.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#") and name[13:].isdigit():
        e["name"] = f"ProfilerStep#{int(name[13:]) + k * step_stride}"
    args = e.get("args")
    if isinstance(args, dict):
        e["args"] = {
            a: (v + k * id_stride if a in ID_KEYS and isinstance(v, int) and v >= 0 else v) for a, v in args.items()
        }
    return e


def tile(source: Path, target: Path, copies: int) -> None:
    """Write `source` with its events repeated `copies` times, shifted in time and ids (see the module doc)."""
    with _open(source) as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + float(e.get("dur", 0) or 0) for e in timed)
    period = end - start + 1000.0
    ids = [v for e in events for a, v in (e.get("args") or {}).items() if a in ID_KEYS and isinstance(v, int)]
    ids += [e["id"] for e in events if isinstance(e.get("id"), int)]
    id_stride = max(ids, default=0) + 1
    steps = [int(e["name"][13:]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_stride = max(steps, default=0) - min(steps, default=0) + 1
    with gzip.open(target, "wt", encoding="utf-8", compresslevel=1) as out:
        head = json.dumps(doc, indent=2)[:-2]
        out.write(head + ',\n  "traceEvents": [\n')
        first = True
        for k in range(copies):
            for event in events:
                if k and event.get("ph") == "M":
                    continue
                out.write(("" if first else ",\n") + json.dumps(_shifted(event, k, period, id_stride, step_stride)))
                first = False
        out.write("\n  ]\n}\n")


def tiled_traces(trace_dir: Path, copies: int, work: Path) -> Path:
    """The traces with their events repeated `copies` times (as captured for 1), and their size."""
    files = sorted(p for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))
    if copies == 1:
        print(f"as captured: {', '.join(f'{p.name} {_uncompressed_mb(p):.1f} MB' for p in files)}")
        return trace_dir
    out = work / f"tiled-{copies}"
    out.mkdir()
    for p in files:
        target = out / p.name.replace(".json.gz", ".json").replace(".json", ".json.gz")
        tile(p, target, copies)
        print(f"tiled {p.name} x {copies}: {_uncompressed_mb(target):.1f} MB uncompressed")
    return out


def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))


def _tree_pss_kib(pid: int) -> int:
    """Proportional set size of a process and its descendants (HTA's parser workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, StopIteration, ValueError):  # the process may have just ended
            total += _pss_kib(p)
        todo += children.get(p, [])
    return total


def run_child(python: str, code: str, trace_dir: Path, env: dict[str, str]) -> dict:
    proc = subprocess.Popen(
        [python, "-c", code, str(trace_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_pss_kib(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{python} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_kib"] = max(result["hwm_kib"], peak[0])
    return result


def _measure(traces: Path, repeat: int, hta_python: str, env: dict[str, str]) -> dict[str, tuple[float, float, float]]:
    """tool -> (median wall s, median CPU s, peak MiB) over `repeat` runs of each, interleaved."""
    runs: dict[str, list[dict]] = {"forensics": [], "HTA": []}
    for _ in range(repeat):
        runs["forensics"].append(run_child(sys.executable, FORENSICS_CHILD, traces, env))
        runs["HTA"].append(run_child(hta_python, HTA_CHILD, traces, {**os.environ}))
    summary = {}
    for tool, results in runs.items():
        summary[tool] = (
            statistics.median(r["seconds"] for r in results),
            statistics.median(r["cpu_seconds"] for r in results),
            max(r["peak_kib"] for r in results) / 1024,
        )
        wall, cpu, peak = summary[tool]
        print(f"{tool:>9}: {wall:7.2f} s wall, {cpu:7.2f} s CPU (medians of {repeat})   peak memory {peak:6.0f} MiB")
    first = runs["forensics"][0]
    print(f"forensics breakdown (ms): {json.dumps(first['breakdown'])}")
    print(f"forensics straggler: {first['straggler']}; what-if: {json.dumps(first['what_if'])}")
    print(f"HTA temporal breakdown: {json.dumps(runs['HTA'][0]['breakdown'])}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    parser.add_argument("--copies", type=int, nargs="+", default=[4, 16], help="tilings of the captured traces")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as tmp:
        for copies in sorted(args.copies):
            print(f"--- x{copies}")
            results[copies] = _measure(
                tiled_traces(args.trace_dir, copies, Path(tmp)), args.repeat, args.hta_python, env
            )
    for copies, summary in results.items():
        (ft, fc, fm), (ht, hc, hm) = summary["forensics"], summary["HTA"]
        print(
            f"x{copies}, HTA/forensics: wall time {ht / ft:.1f}x, CPU time {hc / fc:.1f}x, "
            f"peak memory {hm / fm:.1f}x (goal: >= 10x faster)"
        )
    small, large = min(results), max(results)
    (fs, _, ms), (fl, _, ml) = results[small]["forensics"][:3], results[large]["forensics"][:3]
    print(
        f"forensics from x{small} to x{large} ({large / small:.1f}x the trace): peak memory {ml / ms:.2f}x, "
        f"wall time {fl / fs:.2f}x (goal: memory flat, <= 1.1x)"
    )


if __name__ == "__main__":
    main()
