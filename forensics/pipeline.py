"""One run folder in, one Analysis out: discover, read in parallel, enrich, diagnose."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from forensics.analyses.checks import health_checks
from forensics.analyses.diagnosis import build_findings, diagnose
from forensics.analyses.dynamics.training import add_detector_findings, detect
from forensics.analyses.enrich import enrich
from forensics.analyses.flight_recorder import flight_recorder_findings
from forensics.analyses.ray_cluster import ray_report
from forensics.analyses.traces import review_traces
from forensics.discover import SKIPPED, TEXT_LOG, RunFile, discover, quiet_small_files
from forensics.model import Analysis, FileReport
from forensics.package_data import patterns_dir
from forensics.rules import Rule, load_rules
from forensics.scan import TextScanner
from forensics.sources import file_sources, line_extractors
from forensics.sources.base import FileResult, Sink
from forensics.textio import return_freed_buffers_to_the_os


@dataclass
class Options:
    patterns: list[Path] = field(default_factory=list)  # overlays on the bundled rules
    jobs: int = 0  # threads over files; 0 = one per CPU


def load_rule_set(overlays: list[Path]) -> list[Rule]:
    rules, _ = load_rules([patterns_dir(), *overlays])
    return rules


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


def analyze(
    paths: list[Path], options: Options | None = None, progress: Callable[[str], None] | None = None
) -> Analysis:
    """Analyse one run (a folder, a file, or several of them) and return everything learnt."""
    options = options or Options()
    return_freed_buffers_to_the_os()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    run = discover(paths)
    timings["discover"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    # only text logs need the rules and the scanner: a run of traces and structured files is spared them
    has_text = any(f.kind == TEXT_LOG for f in run.files)
    rules = load_rule_set(options.patterns) if has_text else []
    scanner = TextScanner(rules, line_extractors()) if has_text else None
    timings["rules"] = time.perf_counter() - t1

    t1 = time.perf_counter()
    quiet = quiet_small_files(run.files, scanner.may_match) if scanner is not None else {}
    results = {f.rel: _read_one(f, scanner, quiet_lines=quiet[f.rel]) for f in run.files if f.rel in quiet}
    jobs = options.jobs or os.cpu_count() or 1
    ordered = sorted((f for f in run.files if f.rel not in quiet), key=lambda f: -f.bytes)  # big files first
    # a file larger than an even share of the work cannot be balanced by the pool: it reads ahead instead
    fair_share = sum(f.bytes for f in ordered) / jobs
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = pool.map(lambda f: _read_one(f, scanner, read_ahead=f.bytes > fair_share), ordered)
        results.update(zip([f.rel for f in ordered], done, strict=True))
    warnings = list(run.warnings)
    reports, sinks, marks = [], [], []
    config: dict = {}
    environment: dict = {}
    extras: dict[str, list] = {}
    for rf in run.files:
        sink, report, result = results[rf.rel]
        reports.append(report)
        sinks.append(sink)
        marks.extend(sink.step_marks)
        warnings.extend(result.warnings)
        config.update(result.config)
        config.update(sink.config)
        environment.update(result.environment)
        environment.update(sink.environment)
        for key, value in result.extras.items():
            extras.setdefault(key, []).append(value)
    events, series = Sink.merge(sinks)  # one conversion for all files, not one per file
    timings["read/scan"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    events = enrich(events)
    timings["enrich"] = time.perf_counter() - t2
    t2 = time.perf_counter()
    file_order = {rf.rel: i for i, rf in enumerate(run.files)}
    by_id = {r.id: r for r in rules}
    findings = build_findings(events, by_id, file_order)
    findings += flight_recorder_findings(extras.get("flight_recorder", []))
    findings = add_detector_findings(findings, detect(series, events, marks, file_order, environment, config, warnings))
    traces = review_traces(extras, file_order, findings, environment, warnings)
    verdict = diagnose(events, findings, marks, series)
    ray = ray_report(events, verdict)
    timings["diagnose"] = time.perf_counter() - t2
    timings["total"] = time.perf_counter() - t0
    return Analysis(
        run_path=", ".join(str(p) for p in paths),
        run_name=run.name,
        files=reports,
        events=events,
        series=series,
        findings=findings,
        verdict=verdict,
        checks=health_checks(events, series, findings, config, environment),
        config=config,
        environment=environment,
        warnings=warnings,
        timings=timings,
        extras=extras,
        ray=ray,
        traces=traces,
    )
