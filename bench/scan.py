"""How fast forensics reads a run folder, against the practical floor (grep) and what a user would write.

    python bench/make_run.py 2G /tmp/bench_runs/run2g --seed 7
    python bench/scan.py /tmp/bench_runs/run2g [--memory /tmp/bench_runs/run1g /tmp/bench_runs/run4g]

On the same text files, in one run, each timed `--repeat` times (median), page cache warm:

- forensics CLI: `forensics analyze RUN -o report.html --json report.json -q` in a fresh process, as a user
  runs it (start-up, rule loading, every stage, the HTML and JSON reports): the ratios against grep;
- forensics in-process: `analyze()` (discovery, scanning, enrichment, diagnosis; no report), for the
  time of each stage;
- grep: `LC_ALL=C grep -c -E` with one alternation of every rule regex and extractor trigger, converted
  to POSIX ERE (the constructs that have no ERE form are listed, and the closest form is used);
- Python loop: every line of every file through every pattern with the `re` module, as one would write it.

Then the peak RSS of forensics in a child process, for RUN_DIR and every `--memory` folder, and whether the
verdict is the injected one (read from `<RUN_DIR>.truth.json`, written by make_run.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forensics.discover import TEXT_LOG, discover  # noqa: E402
from forensics.pipeline import Options, analyze, load_catalogue  # noqa: E402
from forensics.sources import line_extractors  # noqa: E402

CLASS_ESCAPES = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}
ATOM_ESCAPES = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "s": "[[:space:]]",
    "S": "[^[:space:]]",
    "w": "[[:alnum:]_]",
    "W": "[^[:alnum:]_]",
    "b": r"\b",
    "B": r"\B",
    "A": "^",
    "Z": "$",
    "t": "\t",
}
ERE_SPECIAL = set(".[]()*+?{}|^$\\")
BOUND_DROPPED_FROM = 16


class EreConverter:
    """Python-regex → POSIX ERE (GNU grep dialect), recording what could only be approximated."""

    def __init__(self) -> None:
        self.notes: set[str] = set()
        self.icase = [False]  # case-insensitivity of each open group, innermost last

    def convert(self, pattern: str) -> str:
        out: list[str] = []
        i = 0
        n = len(pattern)
        self.icase = [False]
        while i < n:
            c = pattern[i]
            if c == "\\":
                i, text = self._escape(pattern, i)
                out.append(text)
            elif c == "[":
                i, text = self._bracket(pattern, i)
                out.append(text)
            elif c == "(":
                i, text = self._group_open(pattern, i)
                out.append(text)
            elif c == ")":
                if len(self.icase) > 1:
                    self.icase.pop()
                out.append(c)
                i += 1
            elif c.isascii() and c.isalpha() and self.icase[-1]:
                out.append(f"[{c.lower()}{c.upper()}]")
                i += 1
            elif c in "*+?}" and i + 1 < n and pattern[i + 1] in "?+":
                out.append(c)
                i += 2
                self.notes.add("lazy or possessive quantifier -> greedy (same lines match)")
            elif c == "{":
                m = re.match(r"\{\d*(?:,\d*)?\}", pattern[i:])
                if m and m.group() != "{}":
                    out.append(self._bound(m.group()))
                    i += m.end()
                else:
                    out.append(r"\{")
                    i += 1
            elif c == "}":
                out.append(r"\}")
                i += 1
            else:
                out.append(c)
                i += 1
        return "".join(out)

    def _bound(self, repeat: str) -> str:
        """`{m,n}` as grep is given it: a large upper bound is dropped, since GNU grep's DFA grows with it (the
        bounded rules took grep 3.0 -> 12 s CPU on 1 GiB, for the same lines)."""
        low, comma, high = repeat[1:-1].partition(",")
        if comma and high and int(high) >= BOUND_DROPPED_FROM:
            self.notes.add(f"bounded repeat {{m,n}} with n >= {BOUND_DROPPED_FROM} -> {{m,}} (a superset)")
            return "{" + (low or "0") + ",}"
        return repeat

    def _escape(self, p: str, i: int) -> tuple[int, str]:
        e = p[i + 1] if i + 1 < len(p) else "\\"
        if e in ATOM_ESCAPES:
            if e in "sSwW":
                self.notes.add(r"\s \w classes are ASCII under LC_ALL=C (Unicode in forensics)")
            return i + 2, ATOM_ESCAPES[e]
        if e == "x":
            char = chr(int(p[i + 2 : i + 4], 16))
            return i + 4, ("\\" + char) if char in ERE_SPECIAL else char
        if e.isdigit():
            self.notes.add("backreference -> dropped")
            return i + 2, ""
        return i + 2, ("\\" + e) if e in ERE_SPECIAL else e

    def _group_open(self, p: str, i: int) -> tuple[int, str]:
        if not p.startswith("(?", i):
            self.icase.append(self.icase[-1])
            return i + 1, "("
        if p.startswith("(?:", i):
            self.icase.append(self.icase[-1])
            return i + 3, "("
        m = re.match(r"\(\?P<\w+>", p[i:])
        if m:
            self.icase.append(self.icase[-1])
            return i + m.end(), "("
        m = re.match(r"\(\?([aiLmsux]+)(-[imsx]+)?(:|\))", p[i:])
        if m:
            icase = ("i" in m[1]) or (self.icase[-1] and not (m[2] and "i" in m[2]))
            if m[3] == ")":  # a flag for the rest of the pattern
                self.icase[-1] = icase
                return i + m.end(), ""
            self.icase.append(icase)
            return i + m.end(), "("
        m = re.match(r"\(\?(?:=|!|<=|<!)", p[i:])
        if m:
            self.notes.add("lookaround -> dropped (the rest of the pattern is kept, a superset)")
            return self._skip_group(p, i), ""
        raise ValueError(f"no ERE form for the group at {p[i : i + 12]!r} in {p!r}")

    @staticmethod
    def _skip_group(p: str, i: int) -> int:
        depth = 0
        j = i
        while j < len(p):
            if p[j] == "\\":
                j += 2
                continue
            if p[j] == "[":
                j = EreConverter._bracket_end(p, j)
                continue
            if p[j] == "(":
                depth += 1
            elif p[j] == ")":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return j

    @staticmethod
    def _bracket_end(p: str, i: int) -> int:
        j = i + 1
        if j < len(p) and p[j] == "^":
            j += 1
        if j < len(p) and p[j] == "]":
            j += 1
        while j < len(p) and p[j] != "]":
            j += 2 if p[j] == "\\" else 1
        return j + 1

    def _bracket(self, p: str, i: int) -> tuple[int, str]:
        end = self._bracket_end(p, i)
        body = p[i + 1 : end - 1]
        negate = body.startswith("^")
        if negate:
            body = body[1:]
        items: list[str] = []
        close = dash = caret = False
        j = 0
        while j < len(body):
            c = body[j]
            if c == "\\" and j + 1 < len(body):
                e = body[j + 1]
                j += 2
                if e in CLASS_ESCAPES:
                    items.append(CLASS_ESCAPES[e])
                elif e in "SWD":
                    self.notes.add(r"negated class escape inside [...] -> dropped")
                elif e == "]":
                    close = True
                elif e == "-":
                    dash = True
                elif e == "^":
                    caret = True
                elif e == "x":
                    items.append(chr(int(body[j : j + 2], 16)))
                    j += 2
                elif e == "t":
                    items.append("\t")
                else:
                    items.append(e)
                continue
            if c == "]":
                close = True
            elif c == "^":
                caret = True
            elif c == "-" and (j == 0 or j == len(body) - 1):
                dash = True
            elif c == "-" and items and len(items[-1]) == 1 and body[j + 1] != "\\":
                items[-1] += "-" + body[j + 1]  # a range, one item
                j += 1
            else:
                items.append(c)
            j += 1
        if self.icase[-1]:  # letters and letter ranges in both cases
            items = [x.lower() + x.upper() if x.isascii() and x.replace("-", "").isalpha() else x for x in items]
        text = ("]" if close else "") + "".join(items) + ("^" if caret else "") + ("-" if dash else "")
        if text.startswith("^"):  # a lone literal caret cannot come first
            text = text[1:] + "^"
        return end, "[" + ("^" if negate else "") + text + "]"


def patterns(overlays: list[Path]) -> list[str]:
    """The same patterns the scanner looks for: every extractor trigger and every rule clause."""
    rules = load_catalogue(overlays).rules
    found = [e.trigger for e in line_extractors()]
    found += [clause.regex for rule in rules for clause in rule.match]
    return found


def text_files(run_dir: Path) -> list[Path]:
    return [f.path for f in discover([run_dir]).files if f.kind == TEXT_LOG]


@dataclass
class Timing:
    """Wall and CPU seconds of each run of one contender."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    def line(self, extra: str) -> str:
        return (
            f"{self.name:24} median {self.median:7.2f} s wall, {self.median_cpu:7.2f} s CPU"
            f"   runs {fmt(self.wall)}   {extra}"
        )


def run_in_process(fn, timing: Timing):
    """Run `fn` here, adding its wall and CPU (all threads) time to `timing`."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    timing.wall.append(time.perf_counter() - t0)
    timing.cpu.append(time.process_time() - c0)
    return result


def run_child(argv: list[str], timing: Timing, env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> bytes:
    """Run a command, adding its wall and CPU time (its own rusage) to `timing`; returns its stdout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        timing.wall.append(time.perf_counter() - t0)
        timing.cpu.append(usage.ru_utime + usage.ru_stime)
        if os.waitstatus_to_exitcode(status) not in ok_codes:
            err.seek(0)
            raise RuntimeError(f"{argv[0]} failed: {err.read().decode(errors='replace').strip()[-2000:]}")
        out.seek(0)
        return out.read()


def run_grep(ere: str, files: list[Path], timing: Timing) -> int:
    """`grep -c` over every file; counts the matching lines."""
    argv = ["grep", "-a", "-c", "-E", "-e", ere, "--", *map(str, files)]
    out = run_child(argv, timing, {**os.environ, "LC_ALL": "C"}, ok_codes=(0, 1))
    return sum(int(line.rsplit(b":", 1)[-1]) for line in out.splitlines())


def run_cli(run_dir: Path, overlays: list[Path], timing: Timing, peaks: list[float]) -> dict:
    """`forensics analyze` in a fresh process, writing both reports; returns the JSON report and adds the
    process's peak RSS (MiB) to `peaks`.

    The peak is GNU time's (`%M`): its child is forked from a small process, so the bench's own memory is
    not charged to it as it would be to a child of this one (see `peak_rss`).
    """
    with tempfile.TemporaryDirectory() as out:
        argv = ["/usr/bin/time", "-f", "%M", "-o", f"{out}/rss"] if Path("/usr/bin/time").is_file() else []
        argv += [sys.executable, "-m", "forensics.cli", "analyze", str(run_dir), "-q"]
        argv += ["-o", f"{out}/report.html", "--json", f"{out}/report.json"]
        argv += [arg for folder in overlays for arg in ("--patterns", str(folder))]
        run_child(argv, timing, {**os.environ, "PYTHONPATH": str(REPO)})
        if Path(out, "rss").is_file():
            peaks.append(int(Path(out, "rss").read_text().split()[-1]) / 1024)
        return json.loads(Path(out, "report.json").read_text(encoding="utf-8"))


def run_python_loop(compiled: list[re.Pattern], files: list[Path]) -> int:
    total = 0
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                for pattern in compiled:
                    if pattern.search(line):
                        total += 1
                        break
    return total


def run_forensics(run_dir: Path, overlays: list[Path]):
    return analyze([run_dir], Options(patterns=overlays))


CHILD = """
import json, re, sys
from pathlib import Path
from forensics.pipeline import Options, analyze
a = analyze([Path(sys.argv[1])], Options(patterns=[Path(p) for p in sys.argv[2:]]))
r = a.verdict.root_cause
status = Path("/proc/self/status").read_text()
print(json.dumps({"verdict": f"{r.cls} on rank {r.rank}" if r else "healthy",
                  "hwm_kib": int(re.search(r"VmHWM:\\s*(\\d+) kB", status)[1])}))
"""


def peak_rss(run_dir: Path, overlays: list[Path]) -> tuple[float, float, str]:
    """(peak RSS in MiB, seconds, verdict) of `analyze` in a fresh child process.

    The child reads its own high-water mark (VmHWM) rather than leaving it to rusage: with vfork, the
    kernel charges the parent's peak to the child's ru_maxrss at exec.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), *map(str, overlays)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"analyze failed on {run_dir}: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["hwm_kib"] / 1024, seconds, result["verdict"]


def folder_bytes(files: list[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def verdict_check(run_dir: Path, analysis) -> str:
    truth_file = Path(f"{run_dir}.truth.json")
    root = analysis.verdict.root_cause
    got = f"{root.cls} on rank {root.rank}" if root else "healthy"
    if not truth_file.is_file():
        return f"verdict: {got} (no {truth_file.name} to check against)"
    truth = json.loads(truth_file.read_text())["root_cause"]
    ok = root is not None and root.cls == truth["class"] and root.rank == truth["rank"]
    return f"verdict: {got}; injected: {truth['class']} on rank {truth['rank']} -> {'RIGHT' if ok else 'WRONG'}"


def truth_line(run_dir: Path) -> str:
    truth_file = Path(f"{run_dir}.truth.json")
    if not truth_file.is_file():
        return "no truth file"
    truth = json.loads(truth_file.read_text())["root_cause"]
    return f"injected: {truth['class']} on rank {truth['rank']}"


def report_verdict(report: dict) -> str:
    root = report["verdict"].get("root_cause")
    return f"verdict: {root['class']} on rank {root['rank']}" if root else "verdict: healthy"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of forensics and grep (median)")
    parser.add_argument("--python-repeat", type=int, default=1, help="timed runs of the (slow) Python loop")
    parser.add_argument("--memory", type=Path, nargs="*", default=[], help="more run folders to measure peak RSS on")
    parser.add_argument("--skip-python", action="store_true", help="leave out the Python loop")
    parser.add_argument("--skip-in-process", action="store_true", help="time the CLI only, not analyze() here")
    parser.add_argument("--rss-repeat", type=int, default=3, help="child runs per folder for peak RSS (median)")
    parser.add_argument(
        "--patterns", type=Path, action="append", default=[], help="extra rule folder, for every contender"
    )
    args = parser.parse_args(argv)

    files = text_files(args.run_dir)
    size = folder_bytes(files)
    pats = patterns(args.patterns)
    conv = EreConverter()
    ere = "|".join(f"({conv.convert(p)})" for p in pats)
    print(f"run: {args.run_dir}  text files: {len(files)}  bytes: {size / 2**30:.2f} GiB  patterns: {len(pats)}")
    for note in sorted(conv.notes):
        print(f"  ERE conversion: {note}")

    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache

    # interleaved, so that all see the same load on a shared machine
    grep, cli, fx = Timing("grep -c -E (LC_ALL=C)"), Timing("forensics analyze (CLI)"), Timing("analyze() in-process")
    cli_peaks: list[float] = []
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeat):
        grep_lines = run_grep(ere, files, grep)
        report = run_cli(args.run_dir, args.patterns, cli, cli_peaks)
        if not args.skip_in_process:
            analysis = run_in_process(lambda: run_forensics(args.run_dir, args.patterns), fx)
        loads.append(os.getloadavg()[0])
    print(grep.line(f"matching lines {grep_lines}"))
    print(cli.line(f"findings {len(report['findings'])}, HTML and JSON reports written"))
    if cli_peaks:
        print(f"  CLI peak RSS {statistics.median(cli_peaks):.1f} MiB (median of {fmt(cli_peaks)})")
    print(
        f"  forensics CLI / grep    = {cli.median / grep.median:5.2f}x wall   (goal <= 1.0x);"
        f"  {cli.median_cpu / grep.median_cpu:5.2f}x CPU"
    )
    if not args.skip_in_process:
        print(fx.line(f"events {analysis.events.height}, samples {analysis.series.height}"))
        print(f"  stages (last run): {', '.join(f'{k} {v:.2f} s' for k, v in analysis.timings.items())}")
        print(
            f"  in-process / grep       = {fx.median / grep.median:5.2f}x wall;"
            f"  {fx.median_cpu / grep.median_cpu:5.2f}x CPU"
        )
    if not args.skip_python:
        compiled = [re.compile(p) for p in pats]
        py = Timing("Python re loop")
        for _ in range(args.python_repeat):
            py_lines = run_in_process(lambda: run_python_loop(compiled, files), py)
        print(py.line(f"matching lines {py_lines}"))
        print(
            f"  Python loop / forensics CLI = {py.median / cli.median:5.2f}x wall   (goal >= 5x);"
            f"  {py.median_cpu / cli.median_cpu:5.2f}x CPU"
        )
    print(
        f"  throughput: forensics CLI {size / cli.median / 2**20:.0f} MiB/s,"
        f" grep {size / grep.median / 2**20:.0f} MiB/s"
    )
    if not args.skip_in_process:
        print(verdict_check(args.run_dir, analysis))
    print(f"  CLI report {report_verdict(report)}; {truth_line(args.run_dir)}")
    switched_off = [w for w in report["warnings"] if "switched off" in w]
    print(f"  rules switched off: {len(switched_off)}" + "".join(f"\n    {w}" for w in switched_off))
    print(f"  load average (1 min) during the runs: {fmt(loads)} on {os.cpu_count()} CPUs")

    measured = []
    for folder in [args.run_dir, *args.memory]:
        folder_size = folder_bytes(text_files(folder))
        runs = [peak_rss(folder, args.patterns) for _ in range(args.rss_repeat)]
        rss = statistics.median(r[0] for r in runs)
        measured.append((folder_size, rss))
        print(
            f"peak RSS {rss:7.1f} MiB (median of {fmt([r[0] for r in runs])})  input {folder_size / 2**30:5.2f} GiB"
            f"  verdict {runs[-1][2]}  {folder}"
        )
    if len(measured) > 1:
        small, large = min(measured), max(measured)
        print(
            f"  peak RSS at {large[0] / 2**30:.1f} GiB / at {small[0] / 2**30:.1f} GiB = {large[1] / small[1]:.2f}"
            "   (goal <= 1.20, each <= 300 MiB)"
        )
    return 0


def fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
