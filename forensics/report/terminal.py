"""The short terminal summary: status, root cause, evidence with file:line, what to change."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

STATUS_STYLE = {"failed": "bold white on red", "degraded": "bold black on yellow", "healthy": "bold white on green"}


def print_summary(doc: dict[str, Any], console: Console, report_path: str | None = None) -> None:
    v = doc["verdict"]
    run = doc["run"]
    console.print(
        f"[{STATUS_STYLE.get(v['status'], 'bold')}] {v['status'].upper()} [/] "
        f"[bold]{escape(run['name'])}[/]  "
        f"[dim]{len(run['files'])} files · {run['ranks']} ranks · {run['steps']} steps[/]"
    )
    rc = v["root_cause"]
    if rc is None:
        console.print(escape(v["summary"]))
    else:
        where = f" on rank {rc['rank']}" if rc["rank"] is not None else ""
        host = f" ({rc['host']})" if rc["host"] else ""
        step = f", step {rc['step']}" if rc.get("step") is not None else ""
        console.print(
            f"[bold]Root cause:[/] {escape(rc['title'])}{where}{escape(host)}{step} "
            f"[dim]class {rc['class']}, rule {rc['rule']}, confidence {rc['confidence']:.0%}[/]"
        )
        if rc.get("explanation"):
            console.print(f"[bold]Why:[/] {escape(rc['explanation'])}")
        for e in rc["evidence"][:2]:
            text = e["text"] if len(e["text"]) <= 200 else e["text"][:200] + "…"
            console.print(f"  [cyan]{escape(e['file'])}:{e['line']}[/]  {escape(text)}")
        for s in v["symptoms"][:6]:
            ranks = ", ".join(map(str, s["ranks"])) or "–"
            lines = "line" if s["count"] == 1 else "lines"
            console.print(f"  [dim]then {s['class']} on rank(s) {ranks} ({s['count']} {lines})[/]")
        if rc["remediation"]:
            console.print("[bold]What to change:[/]")
            for r in rc["remediation"][:3]:
                console.print(f"  • {escape(r)}")
    line = what_if_line(doc.get("traces") or {})
    if line:
        console.print(f"[bold]What it costs:[/] {escape(line)}")
    for w in doc["warnings"][:5]:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    if report_path:
        console.print(f"[dim]report:[/] {escape(report_path)}")


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
