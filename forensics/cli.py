"""The command line: thin click commands over the library."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from forensics import __version__
from forensics.batch import ENGINES, BatchError, RunSpec, Settings, find_runs, run_batch, several_runs
from forensics.diff import compare
from forensics.discover import run_name
from forensics.evaluation import SPLITS, CorpusError, below_floors, evaluate, read_corpus, read_floors
from forensics.metric_semantics import MetricFileError, load_vocabulary
from forensics.model import SEVERITIES, Analysis, severity_rank
from forensics.package_data import patterns_dir
from forensics.pipeline import Options, analyze, peak_rss_mib
from forensics.report.batch_terminal import print_batch_summary
from forensics.report.diff_html import render_diff_html
from forensics.report.diff_terminal import print_diff_summary
from forensics.report.eval_terminal import print_scores
from forensics.report.html import render_html
from forensics.report.json_report import check_json, format_json, to_json_dict
from forensics.report.markdown import render_markdown
from forensics.report.terminal import make_console, print_checks, print_summary
from forensics.rules import RuleLoadError, load_rules
from forensics.rules.lint import slow_regexes

INCONCLUSIVE = "inconclusive"
CHECK_LEVELS = ("warn", "fail")
EXIT_GATE = 1  # --fail-on or --floors tripped
EXIT_INPUT = 2  # bad usage, invalid rules, unreadable input (click's own usage errors exit 2 too)
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
BATCH_TIMEOUT_S = 1800.0


class InputError(click.ClickException):
    """Bad input (rules, paths): `Error: …` and exit status 2, as for bad usage."""

    exit_code = EXIT_INPUT


class Gate(click.ParamType):
    """`--fail-on` values: one level (a severity, or a check status) and/or `inconclusive`, comma-separated
    or repeated (`--fail-on error,inconclusive`)."""

    name = "gate"

    def __init__(self, levels: tuple[str, ...]) -> None:
        self.levels = levels

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = tuple(v.strip() for v in str(value).split(",") if v.strip())
        allowed = (*self.levels, INCONCLUSIVE)
        wrong = [v for v in items if v not in allowed]
        if not items or wrong:
            self.fail(f"{', '.join(wrong) or repr(value)}: use one of {', '.join(allowed)}", param, ctx)
        return items


def _gates(values: tuple[tuple[str, ...], ...], levels: tuple[str, ...]) -> tuple[str | None, bool]:
    """The lowest level asked for (None when only `inconclusive` was), and whether `inconclusive` was asked."""
    flat = [v for group in values for v in group]
    asked = [v for v in flat if v != INCONCLUSIVE]
    return (min(asked, key=levels.index) if asked else None), INCONCLUSIVE in flat


def _at_or_above(level: str) -> tuple[str, ...]:
    return CHECK_LEVELS[CHECK_LEVELS.index(level) :]


class Forensics(click.Group):
    """The command group: Ctrl-C ends any command with exit status 130 and one line, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@contextmanager
def rules_checked():
    """Invalid rules (bundled or `--patterns`) end any command the same way: `Error: …` and exit status 2."""
    try:
        yield
    except RuleLoadError as exc:
        raise InputError(f"invalid rules:\n{exc}\nRun `forensics patterns lint DIR` for every problem.") from exc
    except MetricFileError as exc:
        raise InputError(f"invalid metrics file: {exc}") from exc


def _inside(path: Path, folders: list[Path]) -> bool:
    target = path.resolve()
    for folder in folders:
        root = folder.resolve()
        if root.is_dir() and (target == root or root in target.parents):
            return True
    return False


def _write(path: str, text: str, inputs: list[Path]) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate from a hostile file cannot be written
    if path == "-":
        sys.stdout.write(text)
        return
    out = Path(path)
    if _inside(out, inputs):
        raise click.UsageError(f"{path} is inside the run folder, which forensics never modifies; write it elsewhere")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _one_stdout(**targets: str | None) -> None:
    """At most one output may go to stdout (`-`): two would interleave into something neither reader parses."""
    dashes = [f"--{name}" for name, target in targets.items() if target == "-"]
    if len(dashes) > 1:
        raise click.UsageError(f"{' and '.join(dashes)} both write to stdout (-); send one of them to a file")


def _refuse_several_runs(paths: list[Path]) -> None:
    """`analyze` of a folder of runs would merge them into one verdict: refuse, and say what to do instead."""
    if len(paths) != 1:
        return
    runs = several_runs(paths[0])
    if runs:
        shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
        raise click.UsageError(
            f"{paths[0]} holds {len(runs)} runs ({shown}); one verdict for all of them would mix their failures.\n"
            f"  forensics batch {paths[0]} --out DIR    analyses each run apart (fleet table and index.html)\n"
            f"  forensics analyze {paths[0] / runs[0]}    analyses one of them\n"
            f"  forensics analyze {paths[0]}/*          reads them together as the parts of ONE run (nodes, ranks)"
        )


def _analysis(paths: list[Path], options: Options | None = None) -> Analysis:
    """`analyze()` with its input and rule errors as exit status 2."""
    try:
        with rules_checked():
            return analyze(paths, options)
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from exc


def _exit_for(
    result: Analysis, fail_on: tuple[tuple[str, ...], ...], levels: tuple[str, ...], reached: Callable[[str], bool]
) -> int:
    """2 when no file of the run could be read, 1 when a --fail-on gate trips (`reached(level)`: something is at
    or above that level), else 0."""
    reason = result.verdict.reason
    if reason is not None and reason.code == "unreadable":
        return EXIT_INPUT
    level, on_inconclusive = _gates(fail_on, levels)
    if on_inconclusive and result.verdict.status == INCONCLUSIVE:
        return EXIT_GATE
    return EXIT_GATE if level and reached(level) else 0


def rule_and_redaction_options(command):
    """The options every analysing command shares: rule overlays and secret redaction."""
    command = click.option(
        "--no-redact", is_flag=True, help="Show secrets found in the logs instead of redacting them."
    )(command)
    return click.option(
        "--patterns",
        "pattern_dirs",
        multiple=True,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="A folder of extra rules; overlays the bundled rules by id. Repeatable.",
    )(command)


@click.group(cls=Forensics)
@click.version_option(__version__, prog_name="forensics")
def main() -> None:
    """What failed first in a multi-GPU LLM RL run, on which rank, why, and what to change.

    Exit status of every command: 0 done (whatever was found), 1 a --fail-on gate or --floors tripped, 2 bad
    usage, invalid rules or unreadable input, 130 interrupted (Ctrl-C).
    """


@main.command("analyze")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON result (schema forensics.report/v1).")
@click.option("-o", "--output", metavar="FILE", help="HTML report path [default: ./<run-name>.forensics.html].")
@click.option("--no-html", is_flag=True, help="Do not write the HTML report.")
@click.option("--md", "md_out", metavar="FILE|-", help="Write a ticket-sized Markdown summary.")
@click.option(
    "--fail-on",
    type=Gate(SEVERITIES),
    multiple=True,
    metavar="SEVERITY[,inconclusive]",
    help="Exit 1 when a finding is at or above this severity, and/or (`inconclusive`) when nothing could be said.",
)
@rule_and_redaction_options
@click.option("--jobs", type=int, default=0, show_default="one per CPU", help="Files read in parallel.")
@click.option("--profile", is_flag=True, help="Print the time spent in each stage and the peak memory after it.")
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
def analyze_cmd(
    paths: tuple[Path, ...],
    json_out: str | None,
    output: str | None,
    no_html: bool,
    md_out: str | None,
    fail_on: tuple[tuple[str, ...], ...],
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
    jobs: int,
    profile: bool,
    quiet: bool,
) -> None:
    """Analyse one run: a folder, a log file, a .tgz/.tar.gz/.tar of a run folder, or several of them (e.g. the
    Ray session folders of each node). A folder that holds several runs is refused: use `forensics batch`."""
    inputs = list(paths)
    for p in inputs:
        if not p.exists():
            raise click.BadParameter(f"{p}: no such file or folder", param_hint="PATHS")
    _one_stdout(json=json_out, md=md_out)
    _refuse_several_runs(inputs)
    report_path = None if no_html else output or f"{run_name(inputs)}.forensics.html"
    for target in (report_path, json_out, md_out):  # refused before the work, not after it
        if target and target != "-" and _inside(Path(target), inputs):
            raise click.UsageError(
                f"{target} is inside the run folder, which forensics never modifies; write it elsewhere (-o FILE)"
            )
    result = _analysis(inputs, Options(patterns=list(pattern_dirs), jobs=jobs))
    redact_secrets = not no_redact
    t_report = time.perf_counter()
    doc = to_json_dict(result, redact_secrets)
    console = make_console(stderr=json_out == "-" or md_out == "-")
    if report_path:
        _write(report_path, render_html(result, redact_secrets, doc), inputs)
    if json_out:
        _write(json_out, format_json(doc) + "\n", inputs)
    if md_out:
        _write(md_out, render_markdown(doc), inputs)
    if not quiet:
        print_summary(doc, console, report_path)
    if profile:
        timings = {k: v for k, v in result.timings.items() if k != "total"}
        timings["report"] = time.perf_counter() - t_report
        timings["total"] = result.timings.get("total", 0.0) + timings["report"]
        peaks = {**result.peak_rss_mib, "report": peak_rss_mib(), "total": peak_rss_mib()}
        for stage, seconds in timings.items():
            console.print(f"[dim]{stage:>10}: {seconds:8.3f} s   peak RSS {peaks.get(stage, 0.0):7.0f} MiB[/]")
    findings = [severity_rank(f.severity) for f in result.findings]
    sys.exit(_exit_for(result, fail_on, SEVERITIES, lambda level: any(r >= severity_rank(level) for r in findings)))


@main.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the checklist as JSON (schema forensics.check/v1).")
@click.option(
    "--fail-on",
    type=Gate(CHECK_LEVELS),
    multiple=True,
    metavar="warn|fail[,inconclusive]",
    help="Exit 1 when a check is at or above this status (warn, fail), and/or (`inconclusive`) when nothing was read.",
)
@rule_and_redaction_options
def check_cmd(
    paths: tuple[Path, ...],
    json_out: str | None,
    fail_on: tuple[tuple[str, ...], ...],
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
) -> None:
    """The health checklist alone: memory headroom, throughput, parallel and batch sizes, versions."""
    inputs = list(paths)
    _refuse_several_runs(inputs)
    result = _analysis(inputs, Options(patterns=list(pattern_dirs)))
    doc = check_json(result, redact_secrets=not no_redact)
    if json_out:
        _write(json_out, format_json(doc) + "\n", inputs)
    if json_out != "-":
        print_checks(doc, make_console())
    statuses = {c["status"] for c in doc["checks"]}
    sys.exit(_exit_for(result, fail_on, CHECK_LEVELS, lambda level: bool(statuses & set(_at_or_above(level)))))


@main.command("batch")
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for fleet.parquet, index.html and runs/ (one report per run).",
)
@click.option("--json", "json_out", metavar="FILE|-", help="Write the fleet rows as JSON (schema forensics.batch/v1).")
@click.option("--jobs", type=int, default=0, show_default="one per CPU", help="Runs analysed at once.")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True, help="Process pool or Ray.")
@click.option("--address", help="Ray cluster address for --engine ray; without it a local Ray is started.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    default=BATCH_TIMEOUT_S,
    show_default=True,
    help="Seconds one run's analysis may take before it is stopped (an `error` row); 0 for no limit.",
)
@click.option("--paths-are-runs", is_flag=True, help="Take each PATH as one run, never as a folder of runs.")
@click.option("--force", is_flag=True, help="Analyse every run again, even those unchanged since the last batch.")
@rule_and_redaction_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def batch_cmd(
    paths: tuple[str, ...],
    out_dir: Path,
    json_out: str | None,
    jobs: int,
    engine: str,
    address: str | None,
    timeout: float,
    paths_are_runs: bool,
    force: bool,
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
    quiet: bool,
) -> None:
    """Analyse many runs: run folders, folders of runs (each subfolder or .tgz is a run), files, or quoted globs.

    A folder that directly holds a file (notes such as README aside) is one run; a folder that holds only
    folders holds runs, one per subfolder. Runs whose files have not changed since the last batch into --out
    are not analysed again. Ctrl-C keeps the runs finished so far (fleet table and index) and exits 130.
    See docs/batch.md.
    """
    if address and engine != "ray":
        raise click.UsageError("--address is for --engine ray")
    try:
        with rules_checked():
            load_rules([patterns_dir(), *pattern_dirs])
        specs = find_runs(paths, paths_are_runs, out_dir)
    except BatchError as exc:
        raise click.UsageError(str(exc)) from exc
    if not specs:
        raise click.UsageError("no run found under the given paths")
    settings = Settings(tuple(str(p.resolve()) for p in pattern_dirs), redact=not no_redact)
    console = make_console(stderr=True)
    in_hand: dict[str, None] = {}  # runs begun and not settled, oldest first

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task("analysing runs", total=len(specs))

        def show(spec: RunSpec, begun: bool) -> None:
            if begun:
                in_hand[spec.run] = None
            else:
                in_hand.pop(spec.run, None)
                bar.advance(task)
            names = list(in_hand)
            more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
            bar.update(task, description=escape(f"{names[-1][-48:]}{more}" if names else "analysing runs"))

        try:
            result = run_batch(
                specs,
                out_dir,
                settings,
                engine,
                jobs,
                address,
                force,
                progress=lambda spec: show(spec, begun=False),
                began=lambda spec: show(spec, begun=True),
                timeout=timeout or None,
            )
        except BatchError as exc:
            raise click.UsageError(str(exc)) from exc
    if json_out:
        _write(json_out, format_json(result.to_json()) + "\n", [Path(p) for p in paths])
    if not quiet:
        print_batch_summary(result, make_console(stderr=json_out == "-"))
    if result.interrupted:
        click.echo(
            f"interrupted: {result.fleet.height} of {len(specs)} runs are in {out_dir / 'fleet.parquet'}; "
            "run the same command again to finish (finished runs are not analysed again)",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)


@main.command("diff")
@click.argument("run_a", type=click.Path(exists=True, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, path_type=Path))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the comparison as JSON (schema forensics.diff/v1).")
@click.option("-o", "--output", metavar="FILE", help="HTML report path [default: ./<A>-vs-<B>.forensics-diff.html].")
@click.option("--no-html", is_flag=True, help="Do not write the HTML report.")
@rule_and_redaction_options
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
def diff_cmd(
    run_a: Path,
    run_b: Path,
    json_out: str | None,
    output: str | None,
    no_html: bool,
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
    quiet: bool,
) -> None:
    """Did a change fix the problem? Compare RUN_A (before) with RUN_B (after): numbers, metrics, failures, config."""
    options = Options(patterns=list(pattern_dirs))
    for run in (run_a, run_b):
        _refuse_several_runs([run])
    a, b = _analysis([run_a], options), _analysis([run_b], options)
    doc = compare(a, b, redact_secrets=not no_redact)
    inputs = [run_a, run_b]
    report_path = None
    if not no_html:
        report_path = output or f"{a.run_name}-vs-{b.run_name}.forensics-diff.html"
        _write(report_path, render_diff_html(a, b, doc), inputs)
    if json_out:
        _write(json_out, format_json(doc) + "\n", inputs)
    if not quiet:
        print_diff_summary(doc, make_console(stderr=json_out == "-"), report_path)


@main.command("eval")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--split", type=click.Choice(SPLITS), default="all", show_default=True, help="Which cases to score.")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the scores and every case's outcome as JSON.")
@click.option(
    "--floors",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A YAML file of minimum scores per split (top1, macro_f1, healthy_alarmed_max); exit 1 below them.",
)
@click.option(
    "--patterns",
    "pattern_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder of extra rules to score with the bundled ones. Repeatable.",
)
@click.option("--jobs", type=int, default=0, show_default="one per CPU", help="Cases analysed at once.")
@click.option("--misses/--no-misses", default=True, show_default=True, help="List every miss with its evidence line.")
def eval_cmd(
    corpus: Path,
    split: str,
    json_out: str | None,
    floors: Path | None,
    pattern_dirs: tuple[Path, ...],
    jobs: int,
    misses: bool,
) -> None:
    """Score the verdicts on a labelled corpus: CORPUS/manifest.csv and its cases (see corpus/README.md).

    Prints top-1 accuracy, macro-F1, per-class precision and recall, the worst cells of the confusion matrix,
    the faulty-rank accuracy and the misses with the evidence line the verdict stood on.
    """
    try:
        cases = read_corpus(corpus, split)
        limits = read_floors(floors, split) if floors else {}
        with rules_checked():
            load_rules([patterns_dir(), *pattern_dirs])
    except CorpusError as exc:
        raise InputError(str(exc)) from exc
    if not cases:
        raise InputError(f"{corpus}: no case in split {split!r}")
    scores = evaluate(cases, tuple(pattern_dirs), jobs, split)
    if json_out:
        _write(json_out, format_json(scores.to_json()) + "\n", [corpus])
    print_scores(scores, make_console(stderr=json_out == "-"), show_misses=misses)
    below = below_floors(scores, limits)
    if below:
        click.echo("below the floors: " + "; ".join(below), err=True)
        sys.exit(EXIT_GATE)


@main.group("patterns")
def patterns_group() -> None:
    """The catalogue: every finding the tool can emit (text rules and detectors); list, show, test, lint."""


def _rules(extra: tuple[Path, ...]):
    with rules_checked():
        rules, _ = load_rules([patterns_dir(), *extra])
    return rules


@patterns_group.command("list")
@click.option("--patterns", "extra", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_list(extra: tuple[Path, ...]) -> None:
    """One line per entry: id, class, severity, what finds it (`match` or the detector), title."""
    for rule in _rules(extra):
        kind = f"detector:{rule.detector}" if rule.is_detector else "match"
        click.echo(f"{rule.id:34} {rule.cls:22} {rule.severity:9} {kind:34} {rule.title}")


@patterns_group.command("show")
@click.argument("rule_id")
@click.option("--patterns", "extra", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_show(rule_id: str, extra: tuple[Path, ...]) -> None:
    """Print one rule's file."""
    for rule in _rules(extra):
        if rule.id == rule_id:
            click.echo(f"# {rule.path}")
            base = next((d for d in [*extra, patterns_dir()] if (d / rule.path).is_file()), patterns_dir())
            click.echo((base / rule.path).read_text(encoding="utf-8"))
            return
    raise InputError(f"no rule {rule_id!r}; `forensics patterns list` shows them")


@patterns_group.command("lint")
@click.argument("dirs", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_lint(dirs: tuple[Path, ...]) -> None:
    """Report every problem in the rules at once (the bundled ones when no DIR is given), regexes too slow
    on long lines included."""
    roots = list(dirs) or [patterns_dir()]
    rules, errors = load_rules(roots, collect=True)
    problems = [str(e) for e in [*errors, *slow_regexes(rules, roots)]]
    try:
        load_vocabulary(dirs)
    except MetricFileError as exc:
        problems.append(str(exc))
    for problem in problems:
        click.echo(problem)
    if problems:
        raise InputError(f"{len(problems)} problem(s)")
    click.echo("all rules are valid")


@patterns_group.command("test")
@click.option("--patterns", "extra", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_test(extra: tuple[Path, ...]) -> None:
    """Run every rule's own match / no_match examples."""
    _, errors = load_rules([patterns_dir(), *extra], collect=True)
    rules = _rules(extra) if not errors else []
    examples = sum(len(r.examples_match) + len(r.examples_no_match) for r in rules)
    for error in errors:
        click.echo(f"FAIL {error}")
    if errors:
        raise InputError(f"{len(errors)} rule problem(s)")
    detectors = sum(r.is_detector for r in rules)
    click.echo(f"{len(rules) - detectors} rules, {examples} examples: all pass; {detectors} detector entries valid")


if __name__ == "__main__":
    main()
