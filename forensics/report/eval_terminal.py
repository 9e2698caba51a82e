"""`forensics eval` in the terminal: the headline figures, the per-class table, the worst confusions, the misses."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from forensics.evaluation import HIGH_CONFIDENCE, Scores

WORST_CELLS = 10


def _confusions(scores: Scores) -> list[tuple[str, str, int]]:
    cells = [(want, got, n) for want, row in scores.confusion.items() for got, n in row.items() if got != want]
    return sorted(cells, key=lambda c: (-c[2], c[0], c[1]))[:WORST_CELLS]


def print_scores(scores: Scores, console: Console, show_misses: bool = True) -> None:
    right, labelled = scores.rank_accuracy
    healthy = sum(1 for o in scores.outcomes if o.expected == "healthy")
    console.print(
        f"[bold]{len(scores.outcomes)} cases[/] (split {scores.split}): top-1 [bold]{scores.top1:.3f}[/], "
        f"macro-F1 [bold]{scores.macro_f1:.3f}[/], faulty rank {right}/{labelled}, "
        f"healthy controls alarmed {scores.healthy_alarmed}/{healthy}"
    )
    for kind, words in (("log", "the excerpt holds the evidence"), ("prose", "the cause is only in the thread")):
        top1, n = scores.top1_where(kind)
        if n:
            console.print(f"  {words}: top-1 {top1:.3f} over {n} cases")
    right, named = scores.named_cause()
    if named:
        sure_right, sure = scores.named_cause(confident=True)
        console.print(
            f"  a cause named on {named} cases, right on {right} ({right / named:.3f}); "
            f"at confidence >= {HIGH_CONFIDENCE:g}: {sure_right}/{sure}, below: {right - sure_right}/{named - sure}"
        )
    table = Table(title="per class", title_justify="left", show_edge=False)
    for column in ("class", "n", "precision", "recall", "F1"):
        table.add_column(column, justify="left" if column == "class" else "right")
    for cls, row in scores.per_class.items():
        table.add_row(cls, str(row["n"]), f"{row['precision']:.2f}", f"{row['recall']:.2f}", f"{row['f1']:.2f}")
    console.print(table)
    worst = _confusions(scores)
    if worst:
        console.print("worst confusions (labelled -> verdict: cases)")
        for want, got, n in worst:
            console.print(f"  {want} -> {got}: {n}")
    if show_misses and scores.misses:
        console.print("misses")
        for o in scores.misses:
            line = f"  {o.id} {o.expected} -> {o.got}"
            line += f" ({o.rule})" if o.rule else ""
            line += f"  {o.evidence}" if o.evidence else f"  {o.error}" if o.error else ""
            console.print(escape(line), overflow="fold", soft_wrap=True)
