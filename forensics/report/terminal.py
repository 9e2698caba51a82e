"""The short terminal summary: status, root cause, evidence with file:line, what to change.

In a terminal, long lines wrap to its width and a wrapped line keeps the indentation of the line it continues
(evidence under evidence, a bullet's text under its text). Piped or redirected, nothing is wrapped: one line
of output per line of the summary, whole, for grep, less and CI logs.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from forensics.report.labels import ranks_phrase

STATUS_STYLE = {
    "failed": "bold white on red",
    "degraded": "bold black on yellow",
    "healthy": "bold white on green",
    "inconclusive": "bold white on #5b6b9a",
}
CHECK_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}
EVIDENCE_CHARS = 200


def make_console(stderr: bool = False) -> Console:
    """A console that wraps to the terminal's width in a terminal and never hard-wraps when piped."""
    console = Console(stderr=stderr, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def hanging(console: Console, prefix: str, body: str) -> None:
    """Print `prefix` + `body` (rich markup); in a terminal, the lines `body` wraps onto start where it starts."""
    if console.soft_wrap:
        console.print(prefix + body)
        return
    head = Text.from_markup(prefix)
    grid = Table.grid()
    grid.add_column(no_wrap=True, width=cell_len(head.plain))
    grid.add_column(overflow="fold")
    grid.add_row(head, Text.from_markup(body))
    console.print(grid)


def _status_line(doc: dict[str, Any]) -> str:
    v, run = doc["verdict"], doc["run"]
    return (
        f"[{STATUS_STYLE.get(v['status'], 'bold')}] {v['status'].upper()} [/] "
        f"[bold]{escape(run['name'])}[/]  "
        f"[dim]{len(run['files'])} files · {run['ranks']} ranks · {run['steps']} steps[/]"
    )


def _print_root_cause(rc: dict[str, Any], symptoms: list[dict[str, Any]], console: Console) -> None:
    where = f" on rank {rc['rank']}" if rc["rank"] is not None else ""
    host = f" ({rc['host']})" if rc["host"] else ""
    step = f", step {rc['step']}" if rc.get("step") is not None else ""
    hanging(
        console,
        "[bold]Root cause:[/] ",
        f"{escape(rc['title'])}{where}{escape(host)}{step} "
        f"[dim]class {rc['class']}, rule {rc['rule']}, confidence {rc['confidence']:.0%}[/]",
    )
    if rc.get("explanation"):
        hanging(console, "[bold]Why:[/] ", escape(rc["explanation"]))
    for e in rc["evidence"][:2]:
        text = e["text"] if len(e["text"]) <= EVIDENCE_CHARS else e["text"][:EVIDENCE_CHARS] + "…"
        hanging(console, "  ", f"[cyan]{escape(e['file'])}:{e['line']}[/]  {escape(text)}")
    for s in symptoms[:6]:
        where = f" on {ranks_phrase(s['ranks'])}" if s["ranks"] else ""
        lines = "line" if s["count"] == 1 else "lines"
        hanging(console, "  ", f"[dim]then {s['class']}{where} ({s['count']} {lines})[/]")
    if rc["remediation"]:
        console.print("[bold]What to change:[/]")
        for r in rc["remediation"][:3]:
            hanging(console, "  • ", escape(r))


def print_summary(doc: dict[str, Any], console: Console, report_path: str | None = None) -> None:
    v = doc["verdict"]
    console.print(_status_line(doc))
    rc = v["root_cause"]
    if v.get("reason"):
        hanging(console, "[bold]No verdict:[/] ", escape(v["reason"]["text"]))
    elif rc is None:
        console.print(escape(v["summary"]))
    else:
        _print_root_cause(rc, v["symptoms"], console)
    line = what_if_line(doc.get("traces") or {})
    if line and any(f["rule"] in STRAGGLER_RULES for f in doc["findings"]):  # below them it is jitter
        console.print(f"[bold]What it costs:[/] {escape(line)}")
    for w in doc["warnings"][:5]:
        hanging(console, "[yellow]warning:[/] ", escape(w))
    if len(doc["warnings"]) > 5:
        console.print(f"[dim]  +{len(doc['warnings']) - 5} more warnings (in the report)[/]")
    if report_path:
        console.print(f"[dim]report:[/] {escape(report_path)}")


def print_checks(doc: dict[str, Any], console: Console) -> None:
    """The checklist (`forensics check`): a table in a terminal, one line per check when piped."""
    if doc.get("reason"):
        hanging(console, "[bold]No verdict:[/] ", escape(doc["reason"]["text"]))
    if console.soft_wrap:
        console.print(f"Health checks: {escape(doc['run']['name'])}")
        for c in doc["checks"]:
            value = "–" if c["value"] is None else str(c["value"])
            console.print(f"{c['status']:7} {escape(c['name'])}: {escape(value)} — {escape(c['detail'])}")
        return
    table = Table(title=f"Health checks: {escape(doc['run']['name'])}", title_justify="left")
    for column in ("check", "status", "value", "detail"):
        table.add_column(column, overflow="fold")
    for c in doc["checks"]:
        style = CHECK_STYLE.get(c["status"], "")
        value = "–" if c["value"] is None else str(c["value"])
        table.add_row(escape(c["name"]), f"[{style}]{c['status']}[/]", escape(value), escape(c["detail"]))
    console.print(table)


STRAGGLER_RULES = ("trace-straggler", "trace-host-straggler")  # the what-if's cost is worth a line only with one


def what_if_line(traces: dict[str, Any]) -> str | None:
    """One line from the traces' what-if: how much faster the job would be without its costliest rank."""
    wi = traces.get("what_if")
    if not wi:
        return None
    w = wi["worst"]
    per = "ms/step" if wi["basis"] == "per step" else "ms over the window"
    return (
        f"the job would be {w['faster_pct']:.0f}% faster without rank {w['rank']}'s lateness "
        f"({wi['measured_ms']:.1f} -> {w['without_ms']:.1f} {per}; its extra compute {w['compute_faster_pct']:.0f}%, "
        f"its host gaps {w['host_faster_pct']:.0f}%); every rank like the median: {wi['balanced_faster_pct']:.0f}%"
    )
