"""Fuzz `forensics analyze` with mutated copies of the real run folders: no crash, no hang, no write.

    python scripts/fuzz.py --count 10000 --seed 1            # the long run (reported once)
    python scripts/fuzz.py --count 150 --seed 7 --workers 2  # what CI runs (tests/test_fuzz.py)
    python scripts/fuzz.py --replay 1234 --seed 1            # one input again, in this process, with its traceback

Each input is a copy of one of tests/fixtures/runs/* or examples/* with one to three of its files mutated
(cut, bytes flipped, lines duplicated, deleted or swapped, gzip-wrapped, binary or a long line inserted,
markup and secrets planted) and sometimes a hostile entry added (a link out, a link loop, a FIFO, a
binary `.log`). Input `i` depends only on (seed, i), so any failure can be replayed alone.

Every input goes through the real CLI (JSON, Markdown, terminal summary; HTML every `--html-every`th)
in a worker process with a watchdog: an input that runs over `--timeout` seconds is a hang, the worker
is killed and replaced. A failure is any exit status but 0, an invalid result, markup that escaped into
the HTML, a report over 5 MB, or any change under the run folder (exit status 2 only where the reports say that
no file could be read). Failing inputs are kept under `--keep`.
Prints a JSON summary; exits 1 when anything failed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import shutil
import stat
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hostile import tree_state  # noqa: E402

# The CPU corpus (cpu_*) repeats a few input kinds over many runs: one seed per kind of file it holds.
CPU_SEEDS = {"cpu_lm_all_loggers", "cpu_lm_mlflow", "cpu_lm_plain_console", "cpu_grpo_nan", "cpu_lm_ddp2"}
SEED_RUNS = sorted(
    p
    for p in (REPO / "tests" / "fixtures" / "runs").iterdir()
    if p.is_dir() and (not p.name.startswith("cpu_") or p.name in CPU_SEEDS)
) + sorted(p for p in (REPO / "examples").iterdir() if p.is_dir())
STARTUP_S = 300  # a worker's imports and rules; not part of any input's time
REPORT_LIMIT_BYTES = 5 * 1024**2
MAX_INPUT_BYTES = 8 * 1024**2  # per mutated file: size is not what this fuzzes (tests/test_hostile_inputs.py is)
MARKUP = "<script>window.FUZZ_XSS=1</script>"
PLANTED = [
    MARKUP,
    "</script><img src=x onerror=window.FUZZ_XSS=2>",
    "<a href='javascript:window.FUZZ_XSS=3'>x</a>",
    "HF_TOKEN=hf_FuzzFuzzFuzzFuzzFuzzFuzzFuzz0123",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB",
    "step:3 - actor/pg_loss:nan - <b>metric</b>:1e309 - perf/throughput:-inf",
    "\ufeff\u202e\x1b[31mcolour\x1b[0m\r\x00",
]
SECRET = "hf_FuzzFuzzFuzzFuzzFuzzFuzzFuzz0123"

Mutator = Callable[[bytes, random.Random], bytes]


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


def _span(n: int, rng: random.Random, most: int) -> tuple[int, int]:
    start = rng.randrange(n)
    return start, min(n, start + rng.randint(1, most))


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    out = bytearray(data)
    for _ in range(rng.randint(1, 32)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def duplicate_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    start, end = _span(len(lines), rng, 200)
    copies = lines[start:end] * rng.randint(1, 20)
    at = rng.randrange(len(lines) + 1)
    return b"".join(lines[:at] + copies + lines[at:])


def delete_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    start, end = _span(len(lines), rng, 500)
    return b"".join(lines[:start] + lines[end:])


def swap_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    for _ in range(rng.randint(1, 20)):
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def gzip_wrap(data: bytes, rng: random.Random) -> bytes:
    packed = gzip.compress(data, rng.choice((1, 6, 9)))
    return packed[: rng.randrange(10, len(packed) + 1)] if rng.random() < 0.4 else packed


def insert_binary(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 8192)) + data[at:]


def long_line(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    at = rng.randrange(len(lines) + 1)
    filler = rng.choice([b"x", b"a", b"NCCL INFO ", b"\\u00", b"- k:1 ", b"(", b"\x00"])
    line = filler * (rng.randint(10_000, 1_000_000) // len(filler)) + b"\n"
    return b"".join([*lines[:at], line, *lines[at:]])


def plant_text(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    for _ in range(rng.randint(1, 5)):
        at = rng.randrange(len(lines))
        payload = rng.choice(PLANTED).encode("utf-8", "surrogatepass")
        line = lines[at]
        cut = rng.randrange(len(line) + 1)
        lines[at] = line[:cut] + payload + line[cut:]
    return b"".join(lines)


def invalid_utf8(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        at = rng.randrange(len(out) + 1)
        out[at:at] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"])
    return bytes(out)


def empty(data: bytes, rng: random.Random) -> bytes:
    return b""


MUTATORS: dict[str, Mutator] = {
    f.__name__: f
    for f in (
        truncate,
        flip_bytes,
        duplicate_lines,
        delete_lines,
        swap_lines,
        gzip_wrap,
        insert_binary,
        long_line,
        plant_text,
        invalid_utf8,
        empty,
    )
}


def _plant_entry(run: Path, rng: random.Random) -> str:
    """A hostile entry beside the files: a link out, a link loop, a FIFO, a binary .log or an empty folder."""
    kind = rng.choice(["link_out", "link_loop", "fifo", "binary_log", "empty_dir", "link_in"])
    if kind == "link_out":
        (run / "outside.log").symlink_to("/etc/hostname")
    elif kind == "link_loop":
        (run / "loop_a").symlink_to("loop_b")
        (run / "loop_b").symlink_to("loop_a")
    elif kind == "fifo":
        os.mkfifo(run / "pipe.log")
    elif kind == "binary_log":
        (run / "garbage.log").write_bytes(rng.randbytes(4096))
    elif kind == "empty_dir":
        (run / "empty" / "deeper").mkdir(parents=True)
    else:
        target = next((p for p in sorted(run.rglob("*")) if p.is_file()), None)
        if target is not None:
            (run / "latest.log").symlink_to(target.relative_to(run))
    return f"entry:{kind}"


def make_case(seed: int, index: int, root: Path) -> tuple[Path, list[str]]:
    """Input `index`: a mutated copy of a seed run under `root`; returns it and the mutations applied."""
    rng = random.Random(f"{seed}:{index}")
    source = SEED_RUNS[index % len(SEED_RUNS)]  # every seed run within the first len(SEED_RUNS) inputs
    run = root / f"case_{index}" / source.name
    shutil.copytree(source, run, symlinks=True)
    files = sorted(p for p in run.rglob("*") if p.is_file() and not p.is_symlink())
    applied = [f"seed:{source.name}"]
    for path in rng.sample(files, k=min(len(files), rng.randint(1, 3))):
        data = path.read_bytes()
        for name in rng.sample(sorted(MUTATORS), k=rng.randint(1, 3)):
            data = MUTATORS[name](data, rng)[:MAX_INPUT_BYTES]
            applied.append(name)
        if rng.random() < 0.1:  # a hostile name: markup, or a secret
            path = path.rename(path.with_name(rng.choice([f"<b>{path.name}", f"{SECRET}_{path.name}"])))
        path.write_bytes(data)
    if rng.random() < 0.3:
        applied.append(_plant_entry(run, rng))
    return run, applied


def check_case(run: Path, html: bool) -> list[str]:
    """Problems found running the CLI on one input: empty when it behaved."""
    from click.testing import CliRunner

    from forensics.cli import main

    out = run.parent / "out"
    before = tree_state(run)
    args = ["analyze", str(run), "--json", str(out / "r.json"), "--md", str(out / "r.md")]
    args += ["-o", str(out / "r.html")] if html else ["--no-html"]
    result = CliRunner().invoke(main, args)
    problems = []
    if result.exit_code not in (0, 2) or (result.exit_code == 2 and not _unreadable(out)):
        trace = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else result.output
        problems.append(f"exit {result.exit_code}: {trace[-4000:]}")
    if tree_state(run) != before:
        problems.append("the run folder changed")
    if result.exit_code == 0 or _unreadable(out):
        problems += _check_outputs(out, html)
    return problems


def _unreadable(out: Path) -> bool:
    """Exit status 2 is right when no file of the run could be read (the reports say so: inconclusive)."""
    try:
        reason = json.loads((out / "r.json").read_text(encoding="utf-8"))["verdict"]["reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(reason) and reason["code"] == "unreadable"


def _check_outputs(out: Path, html: bool) -> list[str]:
    problems = []
    doc = json.loads((out / "r.json").read_text(encoding="utf-8"))
    if doc.get("schema") != "forensics.report/v1" or not all(isinstance(w, str) for w in doc["warnings"]):
        problems.append("invalid JSON result")
    texts = {"json": (out / "r.json").read_text(encoding="utf-8"), "md": (out / "r.md").read_text(encoding="utf-8")}
    if html:
        page = (out / "r.html").read_text(encoding="utf-8")
        texts["html"] = page
        if len(page.encode()) > REPORT_LIMIT_BYTES:
            problems.append(f"HTML report of {len(page.encode()):,} bytes")
        escaped = [p.split("window.FUZZ")[0] + "window.FUZZ" for p in PLANTED if "FUZZ" in p]
        # report.js on every page; with plots also the figures, the series (when any), plotly and its loader
        if page.count("<script") not in (1, 4, 5) or any(markup in page for markup in escaped):
            problems.append("markup from the logs is live in the HTML")
    problems += [f"secret in {name}" for name, text in texts.items() if SECRET in text]
    return problems


def _worker(conn: Connection) -> None:
    """Serve inputs until told to stop; rules are loaded once (they are not what is fuzzed)."""
    import forensics.pipeline

    catalogue = forensics.pipeline.load_catalogue([])
    forensics.pipeline.load_catalogue = lambda overlays, text_rules=True: catalogue
    conn.send("ready")  # an input's time starts now, not while the worker imports (seconds on a busy machine)
    while True:
        task = conn.recv()
        if task is None:
            return
        index, run, html = task
        start = time.perf_counter()
        try:
            problems = check_case(Path(run), html)
        except Exception:  # the harness itself must keep going and say what happened
            problems = [f"harness error: {traceback.format_exc()[-4000:]}"]
        conn.send((index, problems, time.perf_counter() - start))


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.task: tuple[int, Path, list[str]] | None = None
        self.deadline = 0.0

    def wait_ready(self) -> _Worker:
        if not self.conn.poll(STARTUP_S) or self.conn.recv() != "ready":
            raise RuntimeError(f"a fuzz worker did not start within {STARTUP_S} s")
        return self

    def give(self, index: int, run: Path, applied: list[str], html: bool, timeout: float) -> None:
        self.task = (index, run, applied)
        self.deadline = time.monotonic() + timeout
        self.conn.send((index, str(run), html))

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _special_files(folder: str, names: list[str]) -> list[str]:
    """FIFOs and sockets, which a copy would block on or refuse; the kept case notes the mutation anyway."""
    modes = {n: os.lstat(os.path.join(folder, n)).st_mode for n in names}
    return [n for n, m in modes.items() if stat.S_ISFIFO(m) or stat.S_ISSOCK(m) or stat.S_ISCHR(m) or stat.S_ISBLK(m)]


def fuzz(count: int, seed: int, workers: int, timeout: float, html_every: int, keep: Path) -> dict:
    ctx = mp.get_context("spawn")
    root = Path(tempfile.mkdtemp(prefix="forensics-fuzz-"))
    pool = [_Worker(ctx) for _ in range(workers)]
    for w in pool:
        w.wait_ready()
    failures: list[dict] = []
    mutations: Counter[str] = Counter()
    slowest = (0.0, -1)
    next_index = 0
    done = 0
    start = time.perf_counter()

    def fail(index: int, run: Path, applied: list[str], problems: list[str]) -> None:
        failures.append({"input": index, "mutations": applied, "problems": problems})
        kept = keep / f"case_{index}"
        shutil.copytree(run.parent, kept, symlinks=True, dirs_exist_ok=True, ignore=_special_files)
        (kept / "problems.txt").write_text(f"seed {seed} input {index} {applied}\n\n" + "\n".join(problems))

    try:
        while done < count:
            for w in pool:
                if w.task is None and next_index < count:
                    run, applied = make_case(seed, next_index, root)
                    mutations.update(applied)
                    w.give(next_index, run, applied, html_every > 0 and next_index % html_every == 0, timeout)
                    next_index += 1
            busy = [w for w in pool if w.task is not None]
            wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for i, w in enumerate(pool):
                if w.task is None:
                    continue
                index, run, applied = w.task
                if w.conn.poll():
                    _, problems, seconds = w.conn.recv()
                    slowest = max(slowest, (seconds, index))
                    if problems:
                        fail(index, run, applied, problems)
                elif time.monotonic() > w.deadline:
                    fail(index, run, applied, [f"hang: no result within {timeout:g} s"])
                    w.kill()
                    pool[i] = w = _Worker(ctx).wait_ready()
                else:
                    continue
                w.task = None
                done += 1
                shutil.rmtree(run.parent, ignore_errors=True)
    finally:
        for w in pool:
            if w.process.is_alive() and w.task is None:
                w.conn.send(None)
            w.process.join(timeout=5)
            if w.process.is_alive():
                w.kill()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "inputs": done,
        "seed": seed,
        "workers": workers,
        "seconds": round(time.perf_counter() - start, 1),
        "slowest_input": {"seconds": round(slowest[0], 2), "input": slowest[1]},
        "timeout_s": timeout,
        "mutations": dict(sorted(mutations.items())),
        "failures": failures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="mutated inputs to run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one input may take before it is a hang")
    parser.add_argument("--html-every", type=int, default=10, help="render the HTML report for every Nth input")
    parser.add_argument("--keep", type=Path, default=REPO / "tests" / "artifacts" / "fuzz", help="failing inputs")
    parser.add_argument("--replay", type=int, help="run input N alone in this process and print its problems")
    args = parser.parse_args()
    if args.replay is not None:
        root = Path(tempfile.mkdtemp(prefix="forensics-replay-"))
        run, applied = make_case(args.seed, args.replay, root)
        print(json.dumps({"input": args.replay, "run": str(run), "mutations": applied}))
        problems = check_case(run, html=True)
        print("\n".join(problems) or "no problem")
        return 1 if problems else 0
    summary = fuzz(args.count, args.seed, args.workers, args.timeout, args.html_every, args.keep)
    print(json.dumps(summary, indent=2))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
