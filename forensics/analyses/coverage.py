"""What was read of a run, and why there is no verdict when nothing was: nothing read is not healthy.

A run folder that is empty, whose files could not be opened, that holds only documentation, source code or
binaries, or whose logs end in a Ctrl-C with no failure before it, gets the status `inconclusive` with the
reason, never a green `healthy`. The reasons are facts about the input, not guesses about the run.
"""

from __future__ import annotations

import json
from collections import Counter

import polars as pl

from forensics.model import FileReport, Inconclusive

LISTED = 3  # file names quoted in a reason
# what discovery and the readers write in a file's note, by the reason it was not read
UNREADABLE_NOTES = (
    "not readable",
    "cannot read",
    "compressed file could not be opened",
    "could not be read",
    "read stopped",
    "permission denied",
)
INTERRUPTS = frozenset({"KeyboardInterrupt"})


def _was_read(f: FileReport) -> bool:
    return bool(f.lines or f.events or f.samples)


def _why_unread(f: FileReport) -> str:
    note = f.note.lower()
    if note.startswith("documentation"):
        return "documentation or source code"
    if any(marker in note for marker in UNREADABLE_NOTES):
        return "unreadable"
    if "tar archive" in note:
        return "archive inside the run"
    if f.bytes == 0:
        return "empty"
    return "binary or of no known kind"


def _names(files: list[FileReport]) -> str:
    shown = ", ".join(f.path for f in files[:LISTED])
    return shown + (f" and {len(files) - LISTED} more" if len(files) > LISTED else "")


def nothing_read(files: list[FileReport]) -> Inconclusive | None:
    """Why nothing of the run could be read, or None when at least one file gave lines, events or samples."""
    if not files:
        return Inconclusive("empty", "Nothing to read: the folder is empty (or holds only links and special files).")
    if any(_was_read(f) for f in files):
        return None
    why = {f.path: _why_unread(f) for f in files}
    counts = Counter(why.values())
    parts = "; ".join(f"{n} {reason}" for reason, n in counts.most_common())
    unreadable = [f for f in files if why[f.path] == "unreadable"]
    if unreadable:
        example = f" ({unreadable[0].path}: {unreadable[0].note})"
        return Inconclusive(
            "unreadable", f"None of the {len(files)} file(s) could be read: {parts}{example}. Nothing was analysed."
        )
    if set(counts) == {"empty"}:
        return Inconclusive("empty", f"Nothing to read: the {len(files)} file(s) are empty ({_names(files)}).")
    return Inconclusive(
        "not_run_output",
        f"None of the {len(files)} file(s) is output of a training run: {parts} ({_names(files)}). "
        "Point forensics at the run's log folder (driver log, Ray session logs, torchrun logs).",
    )


def _fields(row: dict) -> dict:
    try:
        return json.loads(row["fields"] or "{}")
    except ValueError:
        return {}


def interrupted(events: pl.DataFrame, step_marks: list[tuple[str, int, int]]) -> Inconclusive | None:
    """A run stopped by hand (Ctrl-C: KeyboardInterrupt) with no failure signature before it.

    Nobody interrupts a run that is making progress and healthy; the usual story is a hang (a collective or
    a Ray call that never returns) that no rule recognised. Without a failure in the logs this is said, not
    guessed: the status is `inconclusive`, with where the interrupt is and the last step that was logged.
    """
    stops = events.filter((pl.col("kind") == "exception") & pl.col("fields").str.contains("KeyboardInterrupt"))
    rows = [r for r in stops.iter_rows(named=True) if _fields(r).get("exception") in INTERRUPTS]
    if not rows:
        return None
    first = rows[0]
    where = f"{first['file']}:{first['line']}"
    last_step = max((step for _, _, step in step_marks), default=None)
    progress = f" after step {last_step}" if last_step is not None else ""
    return Inconclusive(
        "interrupted",
        f"The run was stopped by hand (KeyboardInterrupt at {where}){progress}, and the logs hold no failure "
        "before it. A run that stops making progress is the usual reason: if it hung, a stack dump of every "
        "rank taken while it hangs (py-spy dump, `ray stack`) shows what each one waits on.",
    )
