"""The terminal summary of a diff: the verdict line and the numbers that moved."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from forensics.diff import format_pct


def _side_line(label: str, side: dict[str, Any]) -> str:
    root = side["root_cause"]
    what = f"{root['class']} ({root['rule']})" if root else "no failure"
    return f"  {label} [bold]{escape(side['name'])}[/]: {side['status']}, {what}, {side['steps']} steps"


def print_diff_summary(doc: dict[str, Any], console: Console, report_path: str | None = None) -> None:
    console.print(f"[bold]{escape(doc['verdict'])}[/]")
    console.print(_side_line("A", doc["a"]))
    console.print(_side_line("B", doc["b"]))
    for n in doc["numbers"]:
        pct = n["change_pct"]
        style = {True: "green", False: "red"}.get(n["improved"], "dim")
        change = f"[{style}]{format_pct(pct)}[/]" if isinstance(pct, float) else "[dim]n/a[/]"
        console.print(f"  {n['label']:>12}: {n['a']} → {n['b']} {n['unit']}  {change}")
    findings = doc["findings"]
    for f in findings["only_a"]:
        console.print(f"  [green]gone[/] {f['class']} ({f['rule']})")
    for f in findings["only_b"]:
        console.print(f"  [red]new[/]  {f['class']} ({f['rule']})")
    changed = doc["config"]["changed"]
    if changed:
        keys = ", ".join(f"{c['key']}: {c['a']} → {c['b']}" for c in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        console.print(f"  config: {escape(keys)}{more}")
    if report_path:
        console.print(f"[dim]report:[/] {escape(report_path)}")
