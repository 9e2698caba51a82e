"""Many runs at once: find the runs, analyse each in parallel, keep a fleet table and skip what is unchanged.

What a run is (given PATH arguments, after expanding globs):
- a file is a one-file run;
- a folder that directly holds at least one file is one run, with everything below it (hidden files
  and notes such as README, *.md or *.html do not count);
- a folder that holds only folders (and notes) is a folder of runs: each immediate non-hidden
  subfolder is one run, whatever it holds. Only one level is expanded: pass a glob (`'jobs/*/'`) for deeper layouts, or
  `paths_are_runs` to take every PATH as one run as given.

Each run is analysed by `analyse_run`, a pure function of the run's path and the settings (no writes),
so the local process pool and Ray tasks give the same rows; the caller writes the reports. The fleet
table is the cache too: a run whose files (paths, sizes, modification times), rules, forensics version
and settings are unchanged keeps its previous row, so a nightly batch over a growing folder only
analyses new runs. Runs that could not be analysed are retried every time.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl

from forensics import __version__
from forensics.fingerprint import fingerprint, root_fingerprint, run_hosts
from forensics.model import Analysis, severity_rank
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

FLEET_SCHEMA: dict[str, pl.DataType] = {
    "run": pl.String(),
    "path": pl.String(),
    "status": pl.String(),  # failed | degraded | healthy | error
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


# ---------------------------------------------------------------- finding the runs


def _is_hidden(path: Path) -> bool:
    return path.name.startswith(".")


def _is_note(name: str) -> bool:
    """Files that describe a folder of runs rather than belong to a run: hidden files, READMEs, notes."""
    return name.startswith(".") or NOTE_FILE.match(name) is not None


def _holds_files(folder: Path) -> bool:
    try:
        return any(entry.is_file() and not _is_note(entry.name) for entry in os.scandir(folder))
    except OSError:
        return True  # an unreadable folder is a run whose analysis will say why


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
                if child.is_dir() and not _is_hidden(child) and child.resolve() != out_dir:
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


def _run_in_process(specs: list[RunSpec], settings: Settings, done: Done) -> None:
    for spec in specs:
        done(spec, analyse_run(spec, settings))


def _run_process_pool(specs: list[RunSpec], settings: Settings, jobs: int, done: Done) -> None:
    """A spawned process pool (forking a process that runs polars threads can deadlock).

    A worker that dies (killed by the OOM killer, a crash in native code) breaks the pool; the runs
    that were in flight are tried once more in a fresh pool, then become `error` rows.
    """
    todo = list(specs)
    for attempt in (1, 2):
        broken: list[RunSpec] = []
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
            futures: dict[Future[RunOutcome], RunSpec] = {pool.submit(analyse_run, s, settings): s for s in todo}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    spec = futures[future]
                    try:
                        done(spec, future.result())
                    except BrokenProcessPool:
                        if attempt == 1:
                            broken.append(spec)
                        else:
                            message = "the worker process died while analysing this run (killed, or out of memory)"
                            done(spec, RunOutcome(row=error_row(spec, message)))
        if not broken:
            return
        todo = broken


def _run_ray(specs: list[RunSpec], settings: Settings, jobs: int, address: str | None, done: Done) -> None:
    """The same `analyse_run` as Ray tasks: on the cluster at `address`, or on a local one started here.

    On a cluster, every node needs forensics installed and must see the run folders at the same paths;
    reports come back to this process, which writes them.
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
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(analyse_run)
        limit = jobs or len(specs)
        queue = list(reversed(specs))
        in_flight: dict[Any, RunSpec] = {}
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                spec = queue.pop()
                in_flight[task.remote(spec, settings)] = spec
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            spec = in_flight.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as exc:  # a task whose worker died, or a cluster problem for this run
                outcome = RunOutcome(row=error_row(spec, f"Ray task failed: {type(exc).__name__}: {exc}"))
            done(spec, outcome)
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
) -> BatchResult:
    """Analyse every run that changed since the last batch in `out`, then write the fleet table and index.html.

    With the local engine and more than one worker, runs are analysed in spawned processes: a script
    calling this needs the `if __name__ == "__main__":` guard.
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

    if todo:
        if engine == "ray":
            _run_ray(todo, settings, jobs, address, done)
        elif workers == 1 or len(todo) == 1:
            _run_in_process(todo, settings, done)
        else:
            _run_process_pool(todo, settings, workers, done)

    fleet = fleet_frame(list(rows.values()))
    _write_atomically(out / FLEET_FILE, fleet.write_parquet)
    known = set(previous.get_column("fingerprint").drop_nulls().to_list()) if previous is not None else None
    new = set() if known is None else set(fleet.get_column("fingerprint").drop_nulls().to_list()) - known
    html = render_batch_html(fleet, new, title or out.resolve().name)
    _write_atomically(out / INDEX_FILE, lambda p: p.write_text(html, encoding="utf-8"))
    return BatchResult(fleet, out, len(todo), len(specs) - len(todo), time.perf_counter() - t0, new)
