"""Batch throughput: runs per second for 1 and 2 workers of each engine, and what a cached re-run costs.

Builds a fleet of copies and variants of real runs (the repository's fixture runs, the public corpus's
one-file runs beside the checkout, and any run folders given with --from) in a temporary folder:
each variant shifts pids, IP addresses and dates, so no two runs are byte-identical while each keeps
its source's failure. Then:
- analyses the whole fleet with the local engine (1 and 2 workers) and the Ray engine (a local Ray
  with 1 and 2 CPUs, its start-up timed apart), checks that every engine wrote the same table and
  that each run's verdict is its source's;
- runs `forensics batch` twice from the command line over the unchanged fleet and prints the second
  run's time as a fraction of the first.

    python bench/batch.py [--runs 240] [--from RUN_DIR ...] [--work DIR] [--no-ray]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forensics.batch import find_runs, run_batch  # noqa: E402
from forensics.fleet import FLEET_FILE  # noqa: E402
from forensics.pipeline import analyze  # noqa: E402

DEFAULT_SOURCES = [
    REPO / "tests" / "fixtures" / "diff",
    REPO / "tests" / "fixtures" / "runs",
    REPO.parent / "shared" / "corpus" / "public-issues" / "cases",
]
TEXT_SUFFIXES = {".log", ".out", ".err", ".txt", ".jsonl", ".json", ".yaml", ".yml", ".csv"}
PID = re.compile(r"\bpid=(\d+)")
IPV4 = re.compile(r"\b(\d{1,3}\.\d{1,3}\.\d{1,3})\.(\d{1,3})\b")
ISO_DATE = re.compile(r"\b(20\d\d)-(\d\d)-(\d\d)\b")


def source_runs(extra: list[Path]) -> list[Path]:
    """Run folders under the default places (a folder of runs, or a folder of one-file runs) and --from."""
    runs: list[Path] = []
    for place in DEFAULT_SOURCES:
        if not place.is_dir():
            continue
        runs += sorted(p for p in place.iterdir() if p.is_dir() or p.suffix == ".log")
    return runs + extra


def _shift_date(match: re.Match[str], days: int) -> str:
    try:
        moved = date(int(match[1]), int(match[2]), int(match[3])) - timedelta(days=days)
    except ValueError:
        return match[0]
    return moved.isoformat()


def vary(text: str, i: int) -> str:
    """The same run as another job would have logged it: other pids, addresses and days."""
    text = PID.sub(lambda m: f"pid={int(m[1]) + 7 * i}", text)
    text = IPV4.sub(lambda m: f"{m[1]}.{(int(m[2]) + i) % 250 + 1}", text)
    return ISO_DATE.sub(lambda m: _shift_date(m, i % 21), text)


def copy_variant(source: Path, target: Path, i: int) -> None:
    files = [source] if source.is_file() else [p for p in source.rglob("*") if p.is_file() and not p.is_symlink()]
    base = source.parent if source.is_file() else source
    for path in files:
        dest = target / path.relative_to(base)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix in TEXT_SUFFIXES:
            dest.write_text(vary(path.read_text(encoding="utf-8", errors="replace"), i), encoding="utf-8")
        else:
            shutil.copyfile(path, dest)


def build_fleet(sources: list[Path], runs: int, root: Path) -> dict[str, Path]:
    """`runs` variants, cycling over the sources; returns run folder name → its source."""
    origin = {}
    for i in range(runs):
        source = sources[i % len(sources)]
        name = f"run-{i:04d}-{source.stem}"
        copy_variant(source, root / name, i)
        origin[name] = source
    return origin


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the local pool's workers once it closes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed_batch(fleet: Path, out: Path, engine: str, jobs: int) -> tuple[float, float, pl.DataFrame]:
    """(wall seconds, CPU seconds, fleet table) of one batch into a fresh folder."""
    t0, c0 = time.perf_counter(), _cpu_seconds()
    result = run_batch(find_runs([str(fleet)]), out, engine=engine, jobs=jobs)
    return time.perf_counter() - t0, _cpu_seconds() - c0, result.fleet


def check_verdicts(fleet: pl.DataFrame, origin: dict[str, Path]) -> list[str]:
    """Each variant must get its source's verdict (status and root-cause rule)."""
    expected = {}
    for source in set(origin.values()):
        root = analyze([source]).verdict
        expected[source] = (root.status, root.root_cause.rule if root.root_cause else None)
    problems = []
    for row in fleet.iter_rows(named=True):
        want = expected[origin[row["run"]]]
        if (row["status"], row["rule"]) != want:
            problems.append(f"{row['run']}: {row['status']}/{row['rule']}, its source gives {want[0]}/{want[1]}")
    return problems


def cli_seconds(fleet: Path, out: Path) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "forensics.cli", "batch", str(fleet), "--out", str(out), "--jobs", "2", "-q"]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=240, help="runs in the fleet (at least 200 for the claim)")
    parser.add_argument("--from", dest="extra", type=Path, action="append", default=[], help="another run folder")
    parser.add_argument("--work", type=Path, help="build here and keep it (default: a temporary folder)")
    parser.add_argument("--no-ray", action="store_true", help="measure the local engine only")
    args = parser.parse_args()

    sources = source_runs(args.extra)
    if not sources:
        sys.exit("no source runs: the fixtures and ../shared/corpus are missing; give --from RUN_DIR")
    work = args.work or Path(tempfile.mkdtemp(prefix="forensics-bench-batch-"))
    fleet = work / "fleet"
    try:
        t0 = time.perf_counter()
        origin = build_fleet(sources, args.runs, fleet)
        files = sum(1 for p in fleet.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in fleet.rglob("*") if p.is_file())
        print(
            f"fleet: {args.runs} runs from {len(sources)} sources, {files} files, {size / 1e6:.1f} MB "
            f"(built in {time.perf_counter() - t0:.1f} s)"
        )

        measured: list[tuple[str, int, float, float | None, float]] = []  # engine, workers, wall, CPU, start-up
        tables = {}
        for jobs in (1, 2):
            seconds, cpu, tables[("local", jobs)] = timed_batch(fleet, work / f"local-{jobs}", "local", jobs)
            measured.append(("local", jobs, seconds, cpu, 0.0))
        ray = None
        if not args.no_ray:
            try:
                import ray
            except ImportError:
                print("ray: not installed (pip install 'forensics[ray]'); Ray rows skipped")
        if ray is not None:
            for jobs in (1, 2):
                t_init = time.perf_counter()
                ray.init(num_cpus=jobs, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
                startup = time.perf_counter() - t_init
                try:
                    seconds, _, tables[("ray", jobs)] = timed_batch(fleet, work / f"ray-{jobs}", "ray", jobs)
                finally:
                    ray.shutdown()
                measured.append(("ray", jobs, seconds, None, startup))  # Ray's workers are not our children

        base = measured[0][2]
        load = os.getloadavg()[0]
        print(f"\n{os.cpu_count()} CPUs, load average {load:.1f} at the end")
        if load > (os.cpu_count() or 1):
            print(
                "  the machine is busy: Linux shares CPU between sessions (autogroup), so a second worker of\n"
                "  this session gets no more CPU than one, and wall times follow the others' load. Compare CPU s,\n"
                "  or measure on an idle machine."
            )
        print(f"{'engine':8}{'workers':>8}{'wall s':>9}{'runs/s':>9}{'vs local×1':>12}{'CPU s':>8}{'start-up s':>12}")
        for engine, jobs, seconds, cpu, startup in measured:
            cpu_text = f"{cpu:.1f}" if cpu is not None else "–"
            print(
                f"{engine:8}{jobs:>8}{seconds:>9.1f}{args.runs / seconds:>9.2f}{base / seconds:>11.2f}×"
                f"{cpu_text:>8}{startup:>12.1f}"
            )

        reference = tables[("local", 1)].drop("analysis_s")
        same = all(t.drop("analysis_s").equals(reference) for t in tables.values())
        print(f"\nfleet tables identical across engines and worker counts: {'yes' if same else 'NO'}")
        problems = check_verdicts(tables[("local", 1)], origin)
        errors = reference.filter(pl.col("status") == "error").height
        print(f"verdicts equal to their source run's: {args.runs - len(problems)}/{args.runs}; error rows: {errors}")
        for line in problems[:10]:
            print(f"  {line}")
        lazy = pl.scan_parquet(work / "local-1" / FLEET_FILE).group_by("status").len().collect()
        print("by status (pl.scan_parquet):", dict(lazy.iter_rows()))

        out = work / "cli"
        first = cli_seconds(fleet, out)
        second = cli_seconds(fleet, out)
        print(
            f"\n`forensics batch --jobs 2` from the command line: first {first:.1f} s, second (unchanged fleet) "
            f"{second:.2f} s = {second / first:.1%} of the first"
        )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
