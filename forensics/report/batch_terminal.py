"""The terminal summary of a batch: how many runs, what failed most, where the report is."""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.markup import escape

from forensics.batch import INDEX_FILE, BatchResult

TOP_GROUPS = 5


STATUSES = ("failed", "degraded", "healthy", "inconclusive", "error")


def print_batch_summary(result: BatchResult, console: Console) -> None:
    fleet = result.fleet
    status = dict(fleet.group_by("status").len().iter_rows())
    parts = [f"{status.get(s, 0)} {s}" for s in STATUSES if status.get(s)]
    console.print(
        f"[bold]{fleet.height} runs[/]: {', '.join(parts) or 'none'}  "
        f"[dim]({result.analysed} analysed, {result.cached} unchanged since the last batch, {result.seconds:.1f} s)[/]"
    )
    groups = (
        fleet.filter(pl.col("fingerprint").is_not_null())
        .group_by("fingerprint")
        .agg(pl.len(), pl.coalesce("class", "status").first().alias("outcome"), pl.col("signature").first())
        .sort(["len", "fingerprint"], descending=[True, False])
    )
    for g in groups.head(TOP_GROUPS).iter_rows(named=True):
        new = " [bold magenta]new[/]" if g["fingerprint"] in result.new_fingerprints else ""
        console.print(
            f"  {g['len']:>4} × [bold]{escape(g['outcome'])}[/] [dim]{g['fingerprint']}[/]{new}  "
            f"{escape((g['signature'] or '')[:140])}"
        )
    if groups.height > TOP_GROUPS:
        rest = groups.slice(TOP_GROUPS)
        console.print(f"  [dim]+{rest.height} more fingerprints ({rest.get_column('len').sum()} runs) in the index[/]")
    errors = fleet.filter(pl.col("status") == "error")
    for row in errors.head(TOP_GROUPS).iter_rows(named=True):
        console.print(f"[yellow]could not analyse[/] {escape(row['run'])}: {escape(row['error'] or '')}")
    if errors.height > TOP_GROUPS:
        console.print(f"  [dim]+{errors.height - TOP_GROUPS} more runs could not be analysed (status error)[/]")
    console.print(f"[dim]report:[/] {escape(str(result.out / INDEX_FILE))}")
