"""A run folder of many tiny files (e.g. one log per Ray task): discovery and per-file cost, against a baseline.

    python bench/many_files.py --files 100000

The baseline, measured in the same run on the same folder, is the least any reader must do: walk the
tree and read the first 4 KiB of every file (os.walk + open + read). Printed as ratios to it: discovery
(walk, sniff, kinds), the whole analysis (also scanning every file), and the JSON and HTML reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import forensics.pipeline as analyze_module
from forensics.discover import discover
from forensics.pipeline import analyze
from forensics.report.html import render_html
from forensics.report.json_report import dumps

OOM = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity"


def make_run(root: Path, files: int, per_folder: int = 1000) -> Path:
    run = root / "many_files"
    for i in range(files):
        folder = run / f"worker-{i // per_folder:04d}"
        if i % per_folder == 0:
            folder.mkdir(parents=True)
        text = OOM if i == files // 2 else f"(task pid={1000 + i}) step {i % 50} done in {i % 7}.{i % 10} s"
        (folder / f"task-{i:06d}.log").write_text(f"(task pid={1000 + i}) started\n{text}\n")
    return run


def baseline(run: Path) -> float:
    start = time.perf_counter()
    for dirpath, _, filenames in os.walk(run):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as fh:
                fh.read(4096)
    return time.perf_counter() - start


def timed(label: str, fn, base: float) -> object:
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    print(f"{label:<28} {seconds:8.2f} s   {seconds / base:7.1f}x baseline")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--without-quiet-pass", action="store_true", help="also time every file through the scanner")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp), args.files)
        baseline(run)  # warm the page cache for both sides
        base = baseline(run)
        print(f"{args.files:,} files; baseline (walk + read 4 KiB each): {base:.2f} s")
        found = timed("discover", lambda: discover([run]), base)
        a = timed("analyze (discover+scan+...)", lambda: analyze([run]), base)
        if args.without_quiet_pass:
            real, analyze_module.quiet_small_files = analyze_module.quiet_small_files, lambda files, searches: {}
            timed("analyze, every file scanned", lambda: analyze([run]), base)
            analyze_module.quiet_small_files = real
        json_text = timed("JSON report", lambda: dumps(a), base)
        page = timed("HTML report", lambda: render_html(a), base)
        print(f"files found {len(found.files):,}; findings {[f.rule for f in a.findings]}")
        print("stages: " + ", ".join(f"{k} {v:.2f} s" for k, v in a.timings.items()))
        print(f"JSON {len(json_text) / 2**20:.1f} MiB, HTML {len(page.encode()) / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
