"""How fast a large Ray run is read: many nodes' session folders built from real captured session files.

    python bench/ray_session.py [--size-mb 100] [--nodes 16] [--from DIR] [--keep DIR]

The folder is made in a temporary directory (never in the repository): the driver log and head-node
session of the captured memory-monitor run (the one failure: Ray's memory monitor kills WorkerDict rank 1
on the head node), plus worker nodes whose session files are the captured healthy run's, with their own
node ids, worker ids and IP, each file's lines repeated until the folder reaches the size asked for.
Worker nodes hold what they hold in a real cluster (raylet, agents, the WorkerDict processes), not the
head's GCS, dashboard or the TaskRunner. `--from` takes a capture folder holding ray_healthy/ and
ray_memory_monitor/ (default: the trimmed test
fixtures; an untrimmed capture has Ray's periodic state dumps, the bulk of real raylet and GCS logs).

Printed: the full analysis time, and two baselines measured in the same run on the same files - reading
every line batch without matching anything (the floor), and the analysis without the Ray source modules
and rules (what Ray support costs on top).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import tempfile
import time
from pathlib import Path

from forensics import sources
from forensics.package_data import patterns_dir
from forensics.pipeline import analyze
from forensics.textio import iter_line_batches, open_binary

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "runs"
HEAD_IP = "192.0.2.2"
HEX_ID = re.compile(rb"\b[0-9a-f]{56}\b")


def _node_ip(index: int) -> bytes:
    return f"10.0.{index // 250}.{index % 250 + 1}".encode()


def _vary(data: bytes, index: int) -> bytes:
    """A worker node's copy: its own IP, node id and worker ids (the same id maps to the same new id)."""
    data = data.replace(HEAD_IP.encode(), _node_ip(index))
    return HEX_ID.sub(lambda m: hashlib.sha256(m.group(0) + str(index).encode()).hexdigest()[:56].encode(), data)


HEAD_ONLY = re.compile(r"^(?:gcs_server|dashboard(?:_[A-Z]\w*Head)?|monitor|python-core-driver-)[^/]*$|^dashboard\.")


def _session_files(run: Path) -> list[Path]:
    return [p for p in sorted(run.rglob("*")) if p.is_file() and "session_" in str(p) and p.name != "expected.yaml"]


def _worker_node_files(run: Path) -> list[tuple[Path, bytes]]:
    """What a node without the head or the driver's TaskRunner holds: raylet, agents, WorkerDict processes."""
    files = [(p, p.read_bytes()) for p in _session_files(run) if not HEAD_ONLY.match(p.name)]
    task_runner = {
        m.group(1)
        for p, data in files
        if (m := re.match(rb"^worker-([0-9a-f]+)-", p.name.encode())) and b":actor_name:TaskRunner" in data[:200]
    }
    return [(p, data) for p, data in files if not any(w.decode() in p.name for w in task_runner)]


def build(source: Path, out: Path, size_mb: int, nodes: int) -> int:
    """Write the run folder; returns its size in bytes."""
    oom, healthy = source / "ray_memory_monitor", source / "ray_healthy"
    shutil.copyfile(oom / "driver.log", out / "driver.log")
    for path in _session_files(oom):
        target = out / "node000" / path.relative_to(oom)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    template = [(p, p.relative_to(healthy), data) for p, data in _worker_node_files(healthy)]
    per_node = max(1, (size_mb * 2**20 - sum(f.stat().st_size for f in out.rglob("*") if f.is_file())) // (nodes - 1))
    repeat = max(1, per_node // sum(len(data) for _, _, data in template))
    for index in range(1, nodes):
        for _, rel, data in template:
            target = out / f"node{index:03d}" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            body = _vary(data, index)
            if body and not body.endswith(b"\n"):
                body += b"\n"
            target.write_bytes(body * (1 if rel.name.startswith("event_") else repeat))
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def read_floor(folder: Path) -> tuple[float, int]:
    """Seconds to read every file as line batches, and the line count: no matching at all."""
    t0 = time.perf_counter()
    lines = 0
    for path in folder.rglob("*"):
        if path.is_file():
            with open_binary(path) as stream:
                for batch in iter_line_batches(stream):
                    lines += batch.own_end - batch.own_start
    return time.perf_counter() - t0, lines


def without_ray(folder: Path) -> float:
    """Seconds for the analysis with Ray's source modules and rules left out."""
    import forensics.pipeline as analyze_module

    saved_modules, saved_patterns = list(sources.MODULES), analyze_module.patterns_dir
    rules = Path(tempfile.mkdtemp(prefix="forensics-rules-")) / "patterns"
    try:
        shutil.copytree(patterns_dir(), rules, ignore=shutil.ignore_patterns("ray"))
        sources.MODULES[:] = [m for m in saved_modules if not m.__name__.rsplit(".", 1)[-1].startswith("ray_")]
        analyze_module.patterns_dir = lambda: rules
        t0 = time.perf_counter()
        analyze([folder])
        return time.perf_counter() - t0
    finally:
        sources.MODULES[:] = saved_modules
        analyze_module.patterns_dir = saved_patterns
        shutil.rmtree(rules.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--from", dest="source", type=Path, default=FIXTURES)
    parser.add_argument("--keep", type=Path, help="build the folder here and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="forensics-ray-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        size = build(args.source, work, args.size_mb, args.nodes)
        files = sum(1 for f in work.rglob("*") if f.is_file())
        floor, lines = read_floor(work)
        t0 = time.perf_counter()
        result = analyze([work])
        full = time.perf_counter() - t0
        plain = without_ray(work)
        root = result.verdict.root_cause
        mb = size / 2**20
        print(f"run folder: {mb:.0f} MB, {files} files, {lines:,} lines, {args.nodes} nodes (from {args.source})")
        print(f"read every line, no matching (floor): {floor:6.2f} s")
        print(f"analysis without Ray support:         {plain:6.2f} s")
        print(f"full analysis:                        {full:6.2f} s  ({mb / full:.0f} MB/s)")
        print(f"  {full / floor:.2f}x the floor; {full / plain:.2f}x the analysis without Ray support")
        print(f"  stages: {', '.join(f'{k} {v:.2f} s' for k, v in result.timings.items())}")
        print(
            f"  {result.events.height:,} events; Ray map: {len(result.ray.get('nodes', []))} nodes, "
            f"{len(result.ray.get('actors', []))} actors"
        )
        if root is not None:
            print(f"verdict: {root.cls} ({root.rule}) {root.role} rank {root.rank} on {root.host}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
