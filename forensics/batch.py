"""Many runs at once: find the runs, analyse each in parallel, keep a fleet table and skip what is unchanged.

What a run is (given PATH arguments, after expanding globs):
- a file is a one-file run;
- a folder that directly holds at least one file is one run, with everything below it (hidden files
  and notes such as README, *.md or *.html do not count);
- a folder that holds only folders (and notes) is a folder of runs: each immediate non-hidden
  subfolder is one run, whatever it holds; so is each tar archive (`run.tgz`) beside them. Only one
  level is expanded: pass a glob (`'jobs/*/'`) for deeper layouts, or `paths_are_runs` to take every
  PATH as one run as given.

Each run is analysed by `analyse_run`, a pure function of the run's path and the settings (no writes),
so the local process pool and Ray tasks give the same rows; the caller writes the reports. The fleet
table is the cache too: a run whose files (paths, sizes, modification times), rules, forensics version
and settings are unchanged keeps its previous row, so a nightly batch over a growing folder only
analyses new runs. Runs that could not be analysed are retried every time.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from queue import Empty
from typing import Any

import polars as pl

from forensics import __version__
from forensics.archive import ARCHIVE_SUFFIXES
from forensics.fingerprint import fingerprint, root_fingerprint, run_hosts
from forensics.model import Analysis, iso, severity_rank
from forensics.package_data import patterns_dir
from forensics.pipeline import Options, analyze
from forensics.redact import redact_tree
from forensics.report.batch_html import render_batch_html
from forensics.report.html import render_html
from forensics.report.json_report import format_json, to_json_dict
from forensics.rules.loader import rule_files

FLEET_FILE = "fleet.parquet"
INDEX_FILE = "index.html"
RUNS_DIR = "runs"
ERROR = "error"
ENGINES = ("local", "ray")
NOTE_FILE = re.compile(r"(?i)^(?:readme|notes?|license|index)(?:\.\w+)?$|\.(?:md|rst|html?)$")
# subfolders that are parts of one run, never runs of their own: ranks, nodes, attempts, Ray session folders
PART_OF_A_RUN = re.compile(
    r"(?i)^(?:\d+|(?:rank|node|worker|host|attempt|gpu)[_-]?\d+|session_.*|logs?|events|\d+\.\d+\.\d+\.\d+)$"
)

FLEET_SCHEMA: dict[str, pl.DataType] = {
    "run": pl.String(),
    "path": pl.String(),
    "status": pl.String(),  # failed | degraded | healthy | inconclusive | error
    "reason": pl.String(),  # why an inconclusive run has no verdict (model.INCONCLUSIVE_CODES)
    "class": pl.String(),
    "rule": pl.String(),
    "rank": pl.Int64(),
    "host": pl.String(),
    "step": pl.Int64(),
    "first_failure": pl.Datetime("us", "UTC"),
    "started": pl.Datetime("us", "UTC"),
    "ended": pl.Datetime("us", "UTC"),
    "duration_s": pl.Float64(),
    "fingerprint": pl.String(),
    "signature": pl.String(),
    "summary": pl.String(),
    "error": pl.String(),
    "confidence": pl.Float64(),
    "findings": pl.Int64(),
    "ranks": pl.Int64(),
    "hosts": pl.List(pl.String()),
    "failed_hosts": pl.List(pl.String()),
    "files": pl.Int64(),
    "bytes": pl.Int64(),
    "modified": pl.Datetime("us", "UTC"),  # newest input file
    "report_html": pl.String(),  # relative to the batch folder
    "report_json": pl.String(),
    "analysis_s": pl.Float64(),
    "cache_key": pl.String(),
}


BATCH_SCHEMA = "forensics.batch/v1"
POLL_S = 0.25  # how often the pool is looked at for runs that began or ran past their time


class BatchError(Exception):
    """A problem with the batch as a whole (bad paths, a missing engine): reported, nothing analysed."""


@dataclass(frozen=True)
class RunSpec:
    """One run to analyse: its id in the table, its path and the stem of its report files."""

    run: str
    path: str
    slug: str


@dataclass(frozen=True)
class Settings:
    """What every run's analysis depends on besides its files (part of the cache key)."""

    patterns: tuple[str, ...] = ()
    redact: bool = True
    threads: int = 1  # file threads inside one run

    def salt(self) -> str:
        return json.dumps([__version__, _rules_digest(self.patterns), self.redact])


@dataclass
class RunOutcome:
    """What a worker sends back: the fleet row and the report texts, which the caller writes."""

    row: dict[str, Any]
    html: str | None = None
    json: str | None = None


@dataclass
class InputState:
    """A run's files as they are now: what the cache is keyed on."""

    files: int
    bytes: int
    modified: datetime | None
    signature: str


@dataclass
class BatchResult:
    fleet: pl.DataFrame
    out: Path
    analysed: int = 0
    cached: int = 0
    seconds: float = 0.0
    new_fingerprints: set[str] = field(default_factory=set)
    interrupted: bool = False  # Ctrl-C: the table and index hold the runs finished before it
    total: int = 0  # runs asked for (the table may hold fewer when interrupted)

    def to_json(self) -> dict[str, Any]:
        """The batch as JSON (schema `forensics.batch/v1`): one object per fleet row, times as ISO 8601."""
        rows = [
            {k: (iso(v) if isinstance(v, datetime) else v) for k, v in row.items()}
            for row in self.fleet.iter_rows(named=True)
        ]
        return {
            "schema": BATCH_SCHEMA,
            "out": str(self.out),
            "runs": self.total,
            "analysed": self.analysed,
            "cached": self.cached,
            "interrupted": self.interrupted,
            "new_fingerprints": sorted(self.new_fingerprints),
            "rows": rows,
        }


# ---------------------------------------------------------------- finding the runs


def _is_hidden(path: Path) -> bool:
    return path.name.startswith(".")


def _is_note(name: str) -> bool:
    """Files that describe a folder of runs rather than belong to a run: hidden files, READMEs, notes."""
    return name.startswith(".") or NOTE_FILE.match(name) is not None


def _holds_files(folder: Path) -> bool:
    """A run's own files (an archive is a run of its own, not a file of the folder's run)."""
    try:
        return any(
            entry.is_file() and not _is_note(entry.name) and not _is_archive_name(entry.name)
            for entry in os.scandir(folder)
        )
    except OSError:
        return True  # an unreadable folder is a run whose analysis will say why


def _is_archive_name(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def several_runs(folder: Path) -> list[str]:
    """The runs a folder holds when it holds more than one, else [] (`forensics analyze` refuses to merge them).

    Stricter than `find_runs`, which takes every subfolder of a folder of folders as a run: here at least two
    subfolders must each directly hold files of their own, and folders named like the parts of one run (the
    ranks, nodes and attempts of torchrun and Ray layouts, Ray's `session_*` and `logs`) do not count.
    """
    if not folder.is_dir() or _holds_files(folder):
        return []
    try:
        children = sorted(c for c in folder.iterdir() if c.is_dir() and not c.is_symlink() and not _is_hidden(c))
    except OSError:
        return []
    runs = [c.name for c in children if not PART_OF_A_RUN.match(c.name) and _holds_files(c)]
    archives = [c.name for c in folder.iterdir() if c.is_file() and _is_archive_name(c.name)]
    found = runs + sorted(archives)
    return found if len(found) > 1 else []


def _expand(pattern: str) -> list[Path]:
    if not any(ch in pattern for ch in "*?["):
        path = Path(pattern)
        if not path.exists():
            raise BatchError(f"{pattern}: no such file or folder")
        return [path]
    matches = sorted(Path(p) for p in glob.glob(pattern))
    if not matches:
        raise BatchError(f"{pattern}: no file or folder matches this pattern")
    return matches


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def find_runs(paths: Iterable[str], paths_are_runs: bool = False, out: Path | None = None) -> list[RunSpec]:
    """Every run under the given paths (see the module docstring for the rule), in a stable order."""
    out_dir = out.resolve() if out else None
    found: dict[Path, None] = {}
    for given in paths:
        for path in _expand(given):
            resolved = path.resolve()
            if not resolved.is_dir() or paths_are_runs or _holds_files(resolved):
                found.setdefault(resolved)
                continue
            for child in sorted(resolved.iterdir()):
                if _is_hidden(child) or child.resolve() == out_dir:
                    continue
                if child.is_dir() or (child.is_file() and _is_archive_name(child.name)):
                    found.setdefault(child.resolve())
    runs = list(found)
    if out_dir is not None:
        for run in runs:
            if _inside(out_dir, run):
                raise BatchError(f"--out {out} is inside the run {run}, which forensics never modifies")
    return _name_runs(runs)


def _name_runs(runs: list[Path]) -> list[RunSpec]:
    """Ids relative to the runs' common parent, so that runs with the same folder name stay apart."""
    if not runs:
        return []
    common = Path(os.path.commonpath([r.parent for r in runs]))
    specs = []
    for run in runs:
        run_id = run.relative_to(common).as_posix()
        stem = re.sub(r"[^\w.-]+", "_", run_id).strip("_.")[:80] or "run"
        digest = hashlib.sha1(str(run).encode(), usedforsecurity=False).hexdigest()[:6]
        specs.append(RunSpec(run=run_id, path=str(run), slug=f"{stem}-{digest}"))
    return specs


# ---------------------------------------------------------------- the cache key


def _rules_digest(overlays: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path, root in rule_files([patterns_dir(), *map(Path, overlays)]):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def input_state(path: Path) -> InputState:
    """Paths, sizes and modification times of every file of a run, hashed; links are not followed."""
    entries: list[tuple[str, int, int]] = []
    if path.is_dir():
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                entries.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    else:
        try:
            st = path.stat()
            entries.append((path.name, st.st_size, st.st_mtime_ns))
        except OSError:
            pass
    digest = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    newest = max((e[2] for e in entries), default=None)
    modified = datetime.fromtimestamp(newest / 1e9, timezone.utc) if newest is not None else None
    return InputState(len(entries), sum(e[1] for e in entries), modified, digest)


def cache_key(state: InputState, salt: str) -> str:
    return hashlib.sha256(f"{salt}\n{state.signature}".encode()).hexdigest()[:24]


# ---------------------------------------------------------------- one run


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _failed_hosts(a: Analysis) -> list[str]:
    """Hosts where a finding of error severity or worse happened."""
    return sorted({f.host for f in a.findings if f.host and severity_rank(f.severity) >= severity_rank("error")})


def _row(spec: RunSpec, a: Analysis, doc: dict[str, Any]) -> dict[str, Any]:
    verdict = doc["verdict"]
    root = verdict["root_cause"]
    started, ended = _ts(doc["run"]["first_ts"]), _ts(doc["run"]["last_ts"])
    row: dict[str, Any] = {
        "run": spec.run,
        "path": spec.path,
        "status": verdict["status"],
        "summary": verdict["summary"],
        "findings": len(doc["findings"]),
        "ranks": doc["run"]["ranks"],
        "hosts": run_hosts(a),
        "failed_hosts": _failed_hosts(a),
        "started": started,
        "ended": ended,
        "duration_s": (ended - started).total_seconds() if started and ended else None,
    }
    if verdict["reason"] is not None:  # inconclusive runs group by why nothing could be said
        row["reason"] = verdict["reason"]["code"]
        row["fingerprint"], row["signature"] = fingerprint("inconclusive", verdict["reason"]["code"])
    if root is not None:
        digest, signature = root_fingerprint(a)
        row |= {
            "class": root["class"],
            "rule": root["rule"],
            "rank": root["rank"],
            "host": root["host"],
            "step": root["step"],
            "first_failure": _ts(root["ts"]),
            "confidence": root["confidence"],
            "fingerprint": digest,
            "signature": signature,
        }
    return row


def error_row(spec: RunSpec, message: str) -> dict[str, Any]:
    digest, signature = fingerprint("analysis-error", message)
    return {
        "run": spec.run,
        "path": spec.path,
        "status": ERROR,
        "error": message,
        "summary": f"Could not be analysed: {message}",
        "fingerprint": digest,
        "signature": signature,
    }


def analyse_run(spec: RunSpec, settings: Settings) -> RunOutcome:
    """Analyse one run and render its reports; never raises: a failure becomes an `error` row."""
    t0 = time.perf_counter()
    try:
        options = Options(patterns=[Path(p) for p in settings.patterns], jobs=settings.threads)
        analysis = analyze([Path(spec.path)], options)
        doc = to_json_dict(analysis, settings.redact)
        outcome = RunOutcome(
            row=redact_tree(_row(spec, analysis, doc)) if settings.redact else _row(spec, analysis, doc),
            html=render_html(analysis, settings.redact, doc),
            json=format_json(doc) + "\n",
        )
    except Exception as exc:  # one bad run must not stop the batch
        outcome = RunOutcome(row=error_row(spec, f"{type(exc).__name__}: {exc}"))
    outcome.row["analysis_s"] = round(time.perf_counter() - t0, 3)
    return outcome


# ---------------------------------------------------------------- engines

Done = Callable[[RunSpec, RunOutcome], None]
Began = Callable[[RunSpec], None]
_BEGAN_QUEUE: Any = None  # in a pool worker: where it says which run it begins (see _analyse_in_worker)


def _run_in_process(specs: list[RunSpec], settings: Settings, done: Done, began: Began) -> None:
    for spec in specs:
        began(spec)
        done(spec, analyse_run(spec, settings))


def _worker_init(began_queue: Any) -> None:
    """A pool worker leaves Ctrl-C to the batch (which keeps the finished work), and reports what it begins."""
    global _BEGAN_QUEUE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _BEGAN_QUEUE = began_queue


def _analyse_in_worker(spec: RunSpec, settings: Settings) -> RunOutcome:
    _BEGAN_QUEUE.put((spec.path, os.getpid()))
    return analyse_run(spec, settings)


def _timeout_row(spec: RunSpec, timeout: float) -> RunOutcome:
    return RunOutcome(
        row=error_row(spec, f"the analysis ran past the per-run timeout of {timeout:g} s and was stopped")
    )


def _kill(pids: Iterable[int]) -> None:
    """Stop pool workers this batch started, by their process ids."""
    for pid in set(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class _Round:
    """One process pool over some runs: who began where, who ran past the timeout."""

    by_path: dict[str, RunSpec]
    running: dict[str, tuple[int, float]] = field(default_factory=dict)  # path -> (worker pid, start)
    began: set[str] = field(default_factory=set)
    timed_out: set[str] = field(default_factory=set)

    def drain(self, queue: Any, began: Began) -> None:
        while True:
            try:
                path, pid = queue.get_nowait()
            except (Empty, OSError, ValueError):
                return
            self.running[path] = (pid, time.monotonic())
            self.began.add(path)
            began(self.by_path[path])

    def stop_overdue(self, timeout: float | None) -> None:
        if not timeout:
            return
        now = time.monotonic()
        for path, (pid, start) in list(self.running.items()):
            if now - start > timeout and path not in self.timed_out:
                self.timed_out.add(path)
                _kill([pid])


def _pool_round(
    todo: list[RunSpec], settings: Settings, jobs: int, done: Done, began: Began, timeout: float | None, tries: Counter
) -> list[RunSpec]:
    """Analyse `todo` in one pool; return the runs to try again in a fresh one.

    A worker that dies (the OOM killer, a crash in native code, or this batch stopping a run past its
    timeout) breaks the whole pool. The run that ran past its timeout becomes an `error` row; the runs that
    had not begun, and those in flight beside a run stopped here, are tried again at no cost; a run in
    flight when a worker died on its own is tried once more, then becomes an `error` row.
    """
    context = get_context("spawn")  # forking a process that runs polars threads can deadlock
    queue = context.Queue()
    state = _Round({s.path: s for s in todo})
    again: list[RunSpec] = []
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)), mp_context=context, initializer=_worker_init, initargs=(queue,)
    )
    try:
        futures: dict[Future[RunOutcome], RunSpec] = {pool.submit(_analyse_in_worker, s, settings): s for s in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            state.drain(queue, began)
            for future in finished:
                spec = futures[future]
                state.running.pop(spec.path, None)
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    if spec.path in state.timed_out:
                        outcome = _timeout_row(spec, timeout or 0)
                    elif spec.path not in state.began or state.timed_out:
                        again.append(spec)
                        continue
                    elif tries[spec.path] < 1:
                        tries[spec.path] += 1
                        again.append(spec)
                        continue
                    else:
                        message = "the worker process died while analysing this run (killed, or out of memory)"
                        outcome = RunOutcome(row=error_row(spec, message))
                done(spec, outcome)
            state.stop_overdue(timeout)
    except BaseException:  # Ctrl-C: stop the runs in flight now rather than wait for them
        _kill([pid for pid, _ in state.running.values()] + list(getattr(pool, "_processes", None) or {}))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        queue.close()
    return again


def _run_process_pool(
    specs: list[RunSpec], settings: Settings, jobs: int, done: Done, began: Began, timeout: float | None
) -> None:
    """Spawned worker processes, rounds of them while workers die (see `_pool_round`)."""
    todo, tries = list(specs), Counter()
    for _ in range(len(specs) + 2):  # every round settles at least one run, or pays a try of one
        if not todo:
            return
        todo = _pool_round(todo, settings, jobs, done, began, timeout, tries)
    for spec in todo:
        done(spec, RunOutcome(row=error_row(spec, "the worker processes kept dying; not analysed")))


def _run_ray(
    specs: list[RunSpec],
    settings: Settings,
    jobs: int,
    address: str | None,
    done: Done,
    began: Began,
    timeout: float | None,
) -> None:
    """The same `analyse_run` as Ray tasks: on the cluster at `address`, or on a local one started here.

    On a cluster, every node needs forensics installed and must see the run folders at the same paths;
    reports come back to this process, which writes them. A task past the timeout is cancelled (its
    worker is killed); Ctrl-C cancels the tasks in flight.
    """
    try:
        import ray
    except ImportError as exc:
        raise BatchError("the ray engine needs Ray: pip install 'forensics[ray]'") from exc
    started_here = not ray.is_initialized()
    if started_here:
        init: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
        if address:
            ray.init(address=address, **init)
        else:
            ray.init(num_cpus=jobs or None, include_dashboard=False, **init)
    in_flight: dict[Any, tuple[RunSpec, float]] = {}
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(analyse_run)
        limit = jobs or len(specs)
        queue = list(reversed(specs))
        overdue: set[Any] = set()
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                spec = queue.pop()
                began(spec)
                in_flight[task.remote(spec, settings)] = (spec, time.monotonic())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                spec, _start = in_flight.pop(ref)
                try:
                    outcome = _timeout_row(spec, timeout or 0) if ref in overdue else ray.get(ref)
                except Exception as exc:  # a task whose worker died, or a cluster problem for this run
                    outcome = RunOutcome(row=error_row(spec, f"Ray task failed: {type(exc).__name__}: {exc}"))
                done(spec, outcome)
            now = time.monotonic()
            for ref, (_spec, start) in in_flight.items():
                if timeout and now - start > timeout and ref not in overdue:
                    overdue.add(ref)
                    ray.cancel(ref, force=True)
    except BaseException:
        for ref in in_flight:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()


# ---------------------------------------------------------------- the fleet table


def fleet_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows in the fixed schema, sorted by run id so that every engine writes the same table."""
    if not rows:
        return pl.DataFrame(schema=FLEET_SCHEMA)
    filled = [{name: row.get(name) for name in FLEET_SCHEMA} for row in rows]
    return pl.DataFrame(filled, schema=FLEET_SCHEMA).sort("run")


def read_fleet(out: Path) -> pl.DataFrame | None:
    path = out / FLEET_FILE
    if not path.is_file():
        return None
    try:
        previous = pl.read_parquet(path)
    except Exception:  # a damaged table is only a lost cache
        return None
    return previous if set(FLEET_SCHEMA) <= set(previous.columns) else None


def _cached_rows(previous: pl.DataFrame | None, out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Rows of the last batch that can be reused: analysed without error, reports still on disk."""
    if previous is None:
        return {}
    reusable = {}
    for row in previous.filter(pl.col("status") != ERROR).iter_rows(named=True):
        reports = [row["report_html"], row["report_json"]]
        if all(r and (out / r).is_file() for r in reports):
            reusable[(row["path"], row["cache_key"])] = row
    return reusable


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def run_batch(
    specs: list[RunSpec],
    out: Path,
    settings: Settings | None = None,
    engine: str = "local",
    jobs: int = 0,
    address: str | None = None,
    force: bool = False,
    progress: Callable[[RunSpec], None] | None = None,
    title: str | None = None,
    began: Began | None = None,
    timeout: float | None = None,
) -> BatchResult:
    """Analyse every run that changed since the last batch in `out`, then write the fleet table and index.html.

    `progress` is called as each run is settled, `began` as its analysis begins. A run whose analysis runs past
    `timeout` seconds is stopped and becomes an `error` row (the local engine then always uses worker
    processes, which can be stopped). On Ctrl-C the runs settled so far are written and the result says
    `interrupted`; runs not reached keep the row of the previous batch, if any.

    With the local engine and more than one worker (or a timeout), runs are analysed in spawned processes: a
    script calling this needs the `if __name__ == "__main__":` guard.
    """
    if engine not in ENGINES:
        raise BatchError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    t0 = time.perf_counter()
    settings = settings or Settings()
    workers = jobs or os.cpu_count() or 1
    settings = replace(settings, threads=max(1, (os.cpu_count() or 1) // workers))
    salt = settings.salt()
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    previous = read_fleet(out)
    reusable = {} if force else _cached_rows(previous, out)

    rows: dict[str, dict[str, Any]] = {}
    todo: list[RunSpec] = []
    states: dict[str, tuple[InputState, str]] = {}
    for spec in specs:
        state = input_state(Path(spec.path))
        key = cache_key(state, salt)
        states[spec.path] = (state, key)
        hit = reusable.get((spec.path, key))
        if hit is not None:
            rows[spec.path] = hit | {"run": spec.run}
            if progress:
                progress(spec)
        else:
            todo.append(spec)

    def done(spec: RunSpec, outcome: RunOutcome) -> None:
        state, key = states[spec.path]
        row = outcome.row | {"files": state.files, "bytes": state.bytes, "modified": state.modified, "cache_key": key}
        if outcome.html is not None and outcome.json is not None:
            html_rel, json_rel = f"{RUNS_DIR}/{spec.slug}.html", f"{RUNS_DIR}/{spec.slug}.json"
            (out / html_rel).write_text(outcome.html, encoding="utf-8")
            (out / json_rel).write_text(outcome.json, encoding="utf-8")
            row |= {"report_html": html_rel, "report_json": json_rel}
        rows[spec.path] = row
        if progress:
            progress(spec)

    interrupted = False
    try:
        _analyse_all(todo, settings, engine, workers, jobs, address, done, began or (lambda _: None), timeout)
    except KeyboardInterrupt:
        interrupted = True
        rows |= _unreached_rows(previous, [s for s in todo if s.path not in rows])

    fleet = fleet_frame(list(rows.values()))
    _write_atomically(out / FLEET_FILE, fleet.write_parquet)
    known = set(previous.get_column("fingerprint").drop_nulls().to_list()) if previous is not None else None
    new = set() if known is None else set(fleet.get_column("fingerprint").drop_nulls().to_list()) - known
    html = render_batch_html(fleet, new, title or out.resolve().name)
    _write_atomically(out / INDEX_FILE, lambda p: p.write_text(html, encoding="utf-8"))
    analysed = sum(1 for s in todo if s.path in rows) if interrupted else len(todo)
    return BatchResult(
        fleet, out, analysed, len(specs) - len(todo), time.perf_counter() - t0, new, interrupted, len(specs)
    )


def _analyse_all(
    todo: list[RunSpec],
    settings: Settings,
    engine: str,
    workers: int,
    jobs: int,
    address: str | None,
    done: Done,
    began: Began,
    timeout: float | None,
) -> None:
    if not todo:
        return
    if engine == "ray":
        _run_ray(todo, settings, jobs, address, done, began, timeout)
    elif not timeout and (workers == 1 or len(todo) == 1):
        _run_in_process(todo, settings, done, began)
    else:
        _run_process_pool(todo, settings, workers, done, began, timeout)


def _unreached_rows(previous: pl.DataFrame | None, unreached: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """After Ctrl-C, the previous batch's rows of the runs not reached this time: an interrupted batch loses
    nothing that the table held before."""
    if previous is None or not unreached:
        return {}
    wanted = {s.path: s for s in unreached}
    kept = previous.filter(pl.col("path").is_in(list(wanted)))
    return {row["path"]: row | {"run": wanted[row["path"]].run} for row in kept.iter_rows(named=True)}
