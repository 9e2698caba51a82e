"""One run folder in, one Analysis out: discover, read in parallel, enrich, diagnose."""

from __future__ import annotations

import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from forensics.analyses.checks import health_checks
from forensics.analyses.coverage import nothing_read
from forensics.analyses.diagnosis import build_findings, diagnose
from forensics.analyses.dynamics import detect, dynamics_findings
from forensics.analyses.enrich import enrich
from forensics.analyses.flight_recorder import review_flight_recorder
from forensics.analyses.rank_timings import rank_timing_spread
from forensics.analyses.ray_cluster import ray_summary
from forensics.analyses.traces import review_traces
from forensics.catalogue import Catalogue
from forensics.discover import SKIPPED, TEXT_LOG, Run, RunFile, discover, quiet_small_files
from forensics.metric_semantics import load_vocabulary
from forensics.model import Analysis, FileReport, Finding
from forensics.package_data import patterns_dir
from forensics.rules import load_rules
from forensics.scan import TextScanner
from forensics.sources import file_sources, line_extractors
from forensics.sources.base import FileResult, Sink
from forensics.textio import return_freed_buffers_to_the_os


@dataclass
class Options:
    patterns: list[Path] = field(default_factory=list)  # overlays on the bundled catalogue
    jobs: int = 0  # threads over files; 0 = one per CPU


def load_catalogue(overlays: list[Path], text_rules: bool = True) -> Catalogue:
    """The bundled catalogue with the overlays; without `text_rules` only the detectors' entries (a run
    without text logs is spared validating every regex)."""
    bundled = patterns_dir()
    entries, _ = load_rules([bundled, *overlays], detectors_only=not text_rules, tested=[bundled])
    return Catalogue(entries)


def _read_one(
    rf: RunFile, scanner: TextScanner | None, read_ahead: bool = False, quiet_lines: int | None = None
) -> tuple[Sink, FileReport, FileResult]:
    sink = Sink()
    report = FileReport(rf.rel, rf.kind, rf.bytes, note=rf.note)
    result = FileResult()
    if rf.kind == TEXT_LOG and quiet_lines is not None:
        result.lines = quiet_lines  # nothing in it can match: see quiet_small_files
    elif rf.kind == TEXT_LOG and scanner is not None:
        result.lines, result.warnings = scanner.scan(rf.path, rf.rel, sink, read_ahead=read_ahead)
    elif rf.kind != SKIPPED:
        source = next(s for s in file_sources() if s.kind == rf.kind)
        try:
            result = source.read(rf.path, rf.rel, sink)
        except Exception as exc:  # a damaged structured file must not stop the run's analysis
            result.warnings.append(f"{rf.rel}: could not be read as {rf.kind}: {type(exc).__name__}: {exc}")
    report.lines = result.lines
    report.events = sink.event_count
    report.samples = sink.sample_count
    if result.note:
        report.note = result.note
    if result.warnings and not report.note:
        report.note = result.warnings[0].split(": ", 1)[-1]
    return sink, report, result


@dataclass
class _Read:
    """What reading every file gave."""

    reports: list[FileReport]
    sinks: list[Sink]
    marks: list[tuple[str, int, int]]
    warnings: list[str]
    config: dict
    environment: dict
    extras: dict[str, list]


def _read_all(files: list[RunFile], scanner: TextScanner | None, jobs: int) -> _Read:
    """Every file, big ones first in a thread pool; small ones that nothing can match are only counted."""
    quiet = quiet_small_files(files, scanner.may_match) if scanner is not None else {}
    results = {f.rel: _read_one(f, scanner, quiet_lines=quiet[f.rel]) for f in files if f.rel in quiet}
    ordered = sorted((f for f in files if f.rel not in quiet), key=lambda f: -f.bytes)
    # a file larger than an even share of the work cannot be balanced by the pool: it reads ahead instead
    fair_share = sum(f.bytes for f in ordered) / jobs
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = pool.map(lambda f: _read_one(f, scanner, read_ahead=f.bytes > fair_share), ordered)
        results.update(zip([f.rel for f in ordered], done, strict=True))
    read = _Read([], [], [], [], {}, {}, {})
    for rf in files:
        sink, report, result = results[rf.rel]
        read.reports.append(report)
        read.sinks.append(sink)
        read.marks.extend(sink.step_marks)
        read.warnings.extend(result.warnings)
        read.config.update(result.config)
        read.config.update(sink.config)
        read.environment.update(result.environment)
        read.environment.update(sink.environment)
        for key, value in result.extras.items():
            read.extras.setdefault(key, []).append(value)
    return read


def peak_rss_mib() -> float:
    """The process's peak resident memory so far, in MiB (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


class _Clock:
    """Seconds per stage, and the peak memory once each ended, for `--profile`."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.start = self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self.last
        self.peaks[stage] = peak_rss_mib()
        self.last = now

    def total(self) -> dict[str, float]:
        return {**self.timings, "total": time.perf_counter() - self.start}


def analyze(paths: list[Path], options: Options | None = None) -> Analysis:
    """Analyse one run (a folder, a file, or several of them) and return everything learnt.

    Each stage returns what it adds; nothing is changed behind another stage's back.
    """
    options = options or Options()
    return_freed_buffers_to_the_os()
    clock = _Clock()
    with discover(paths) as run:  # an archive's members live in a private folder until this ends
        return _analyse(run, paths, options, clock)


def _analyse(run: Run, paths: list[Path], options: Options, clock: _Clock) -> Analysis:
    clock.lap("discover")

    # only text logs need the rules and the scanner: a run of traces and structured files is spared them
    has_text = any(f.kind == TEXT_LOG for f in run.files)
    catalogue = load_catalogue(options.patterns, text_rules=has_text)
    scanner = TextScanner(catalogue.rules, line_extractors()) if has_text else None
    clock.lap("rules")

    read = _read_all(run.files, scanner, options.jobs or os.cpu_count() or 1)
    events, series = Sink.merge(read.sinks)  # one conversion for all files, not one per file
    clock.lap("read/scan")

    events, cluster = enrich(events)
    clock.lap("enrich")

    file_order = {rf.rel: i for i, rf in enumerate(run.files)}
    findings = build_findings(events, catalogue, file_order)
    fr_detections, fr_warnings = review_flight_recorder(read.extras.get("flight_recorder", []))
    findings += catalogue.describe_all(fr_detections)
    findings += catalogue.describe_all(rank_timing_spread(events, file_order))
    vocabulary = load_vocabulary(options.patterns)
    detections, detector_warnings = detect(
        series, events, read.marks, file_order, read.environment, read.config, vocabulary
    )
    findings += dynamics_findings(findings, detections, catalogue)
    traces = review_traces(read.extras, file_order)
    findings += catalogue.describe_all(traces.detections)
    findings.sort(key=Finding.sort_key)
    environment = {**read.environment, **traces.environment}
    clock.lap("findings")

    verdict = diagnose(events, findings, read.marks, series, cluster, unread=nothing_read(read.reports))
    clock.lap("diagnose")

    checks = health_checks(events, series, findings, read.config, environment)
    clock.lap("checks")
    return Analysis(
        run_path=", ".join(str(p) for p in paths),
        run_name=run.name,
        files=read.reports,
        events=events,
        series=series,
        findings=findings,
        verdict=verdict,
        checks=checks,
        config=read.config,
        environment=environment,
        warnings=[*run.warnings, *read.warnings, *fr_warnings, *detector_warnings, *traces.warnings],
        timings=clock.total(),
        peak_rss_mib=clock.peaks,
        extras=read.extras,
        ray=ray_summary(cluster),
        traces=traces.summary,
    )
