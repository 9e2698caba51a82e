"""The command line: thin click commands over the library."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from forensics import __version__
from forensics.batch import ENGINES, BatchError, Settings, find_runs, run_batch
from forensics.diff import compare
from forensics.discover import run_name
from forensics.model import severity_rank
from forensics.package_data import patterns_dir
from forensics.pipeline import Options, analyze
from forensics.report.batch_terminal import print_batch_summary
from forensics.report.diff_html import render_diff_html
from forensics.report.diff_terminal import print_diff_summary
from forensics.report.html import render_html
from forensics.report.json_report import format_json, to_json_dict
from forensics.report.markdown import render_markdown
from forensics.report.terminal import print_summary
from forensics.rules import RuleLoadError, load_rules
from forensics.rules.lint import slow_regexes

SEVERITY_CHOICES = click.Choice(["info", "warning", "error", "critical"])


class InputError(click.ClickException):
    """Bad input (rules, paths): `Error: …` and exit status 2, as for bad usage."""

    exit_code = 2


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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")


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


@click.group()
@click.version_option(__version__, prog_name="forensics")
def main() -> None:
    """What failed first in a multi-GPU LLM RL run, on which rank, why, and what to change."""


@main.command("analyze")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON result (schema forensics.report/v1).")
@click.option("-o", "--output", metavar="FILE", help="HTML report path [default: ./<run-name>.forensics.html].")
@click.option("--no-html", is_flag=True, help="Do not write the HTML report.")
@click.option("--md", "md_out", metavar="FILE|-", help="Write a ticket-sized Markdown summary.")
@click.option("--fail-on", type=SEVERITY_CHOICES, help="Exit 1 when a finding is at or above this severity.")
@rule_and_redaction_options
@click.option("--jobs", type=int, default=0, show_default="one per CPU", help="Files read in parallel.")
@click.option("--profile", is_flag=True, help="Print the time spent in each stage.")
@click.option("-q", "--quiet", is_flag=True, help="No terminal summary.")
def analyze_cmd(
    paths: tuple[Path, ...],
    json_out: str | None,
    output: str | None,
    no_html: bool,
    md_out: str | None,
    fail_on: str | None,
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
    jobs: int,
    profile: bool,
    quiet: bool,
) -> None:
    """Analyse one run: a folder, a log file, or several of them (e.g. Ray session folders of each node)."""
    inputs = list(paths)
    for p in inputs:
        if not p.exists():
            raise click.BadParameter(f"{p}: no such file or folder", param_hint="PATHS")
    report_path = None if no_html else output or f"{run_name(inputs)}.forensics.html"
    for target in (report_path, json_out, md_out):  # refused before the work, not after it
        if target and target != "-" and _inside(Path(target), inputs):
            raise click.UsageError(
                f"{target} is inside the run folder, which forensics never modifies; write it elsewhere (-o FILE)"
            )
    try:
        result = analyze(inputs, Options(patterns=list(pattern_dirs), jobs=jobs))
    except RuleLoadError as exc:
        raise InputError(f"invalid rules:\n{exc}\nRun `forensics patterns lint DIR` for every problem.") from exc
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from exc
    redact_secrets = not no_redact
    t_report = time.perf_counter()
    doc = to_json_dict(result, redact_secrets)
    console = Console(stderr=json_out == "-" or md_out == "-", highlight=False)
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
        for stage, seconds in timings.items():
            console.print(f"[dim]{stage:>10}: {seconds:8.3f} s[/]")
    if fail_on and any(severity_rank(f.severity) >= severity_rank(fail_on) for f in result.findings):
        sys.exit(1)


CHECK_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


@main.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the checklist as JSON.")
def check_cmd(paths: tuple[Path, ...], as_json: bool) -> None:
    """The health checklist alone: memory headroom, throughput, parallel and batch sizes, versions."""
    try:
        result = analyze(list(paths))
    except (FileNotFoundError, ValueError, RuleLoadError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.checks, indent=2, default=str))
        return
    table = Table(title=f"Health checks: {result.run_name}", title_justify="left")
    for column in ("check", "status", "value", "detail"):
        table.add_column(column, overflow="fold")
    for item in result.checks:
        style = CHECK_STYLE.get(item["status"], "")
        table.add_row(item["name"], f"[{style}]{item['status']}[/]", escape(str(item["value"])), escape(item["detail"]))
    Console(highlight=False).print(table)


@main.command("batch")
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for fleet.parquet, index.html and runs/ (one report per run).",
)
@click.option("--jobs", type=int, default=0, show_default="one per CPU", help="Runs analysed at once.")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True, help="Process pool or Ray.")
@click.option("--address", help="Ray cluster address for --engine ray; without it a local Ray is started.")
@click.option("--paths-are-runs", is_flag=True, help="Take each PATH as one run, never as a folder of runs.")
@click.option("--force", is_flag=True, help="Analyse every run again, even those unchanged since the last batch.")
@rule_and_redaction_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def batch_cmd(
    paths: tuple[str, ...],
    out_dir: Path,
    jobs: int,
    engine: str,
    address: str | None,
    paths_are_runs: bool,
    force: bool,
    pattern_dirs: tuple[Path, ...],
    no_redact: bool,
    quiet: bool,
) -> None:
    """Analyse many runs: run folders, folders of runs (each subfolder is a run), files, or quoted globs.

    A folder that directly holds a file (notes such as README aside) is one run; a folder that holds only
    folders holds runs, one per subfolder. Runs whose files have not changed since the last batch into --out
    are not analysed again. See docs/batch.md.
    """
    if address and engine != "ray":
        raise click.UsageError("--address is for --engine ray")
    try:
        load_rules([patterns_dir(), *pattern_dirs])
        specs = find_runs(paths, paths_are_runs, out_dir)
    except RuleLoadError as exc:
        raise click.ClickException(f"invalid rules:\n{exc}") from exc
    except BatchError as exc:
        raise click.UsageError(str(exc)) from exc
    if not specs:
        raise click.UsageError("no run found under the given paths")
    settings = Settings(tuple(str(p.resolve()) for p in pattern_dirs), redact=not no_redact)
    console = Console(stderr=True, highlight=False)
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
        try:
            result = run_batch(
                specs, out_dir, settings, engine, jobs, address, force, progress=lambda _: bar.advance(task)
            )
        except BatchError as exc:
            raise click.UsageError(str(exc)) from exc
    if not quiet:
        print_batch_summary(result, Console(highlight=False))


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
    try:
        a, b = analyze([run_a], options), analyze([run_b], options)
    except RuleLoadError as exc:
        raise click.ClickException(f"invalid rules:\n{exc}") from exc
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    doc = compare(a, b, redact_secrets=not no_redact)
    inputs = [run_a, run_b]
    report_path = None
    if not no_html:
        report_path = output or f"{a.run_name}-vs-{b.run_name}.forensics-diff.html"
        _write(report_path, render_diff_html(a, b, doc), inputs)
    if json_out:
        _write(json_out, format_json(doc) + "\n", inputs)
    if not quiet:
        print_diff_summary(doc, Console(stderr=json_out == "-", highlight=False), report_path)


@main.group("patterns")
def patterns_group() -> None:
    """The rule library: list, show, test and lint rules."""


def _rules(extra: tuple[Path, ...]):
    try:
        rules, _ = load_rules([patterns_dir(), *extra])
    except RuleLoadError as exc:
        raise InputError(f"invalid rules:\n{exc}") from exc
    return rules


@patterns_group.command("list")
@click.option("--patterns", "extra", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_list(extra: tuple[Path, ...]) -> None:
    """One line per rule: id, class, severity, title."""
    for rule in _rules(extra):
        click.echo(f"{rule.id:34} {rule.cls:22} {rule.severity:9} {rule.title}")


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
    raise click.ClickException(f"no rule {rule_id!r}; `forensics patterns list` shows them")


@patterns_group.command("lint")
@click.argument("dirs", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
def patterns_lint(dirs: tuple[Path, ...]) -> None:
    """Report every problem in the rules at once (the bundled ones when no DIR is given), regexes too slow
    on long lines included."""
    roots = list(dirs) or [patterns_dir()]
    rules, errors = load_rules(roots, collect=True)
    errors += slow_regexes(rules, roots)
    for error in errors:
        click.echo(str(error))
    if errors:
        raise click.ClickException(f"{len(errors)} problem(s)")
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
        raise click.ClickException(f"{len(errors)} rule problem(s)")
    click.echo(f"{len(rules)} rules, {examples} examples: all pass")


if __name__ == "__main__":
    main()
