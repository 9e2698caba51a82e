"""The bundled rule library as a whole: every class covered, rules fire behind log prefixes, and the
classes a rule defers to exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forensics.package_data import patterns_dir
from forensics.rules import TAXONOMY, load_rules
from forensics.scan import TextScanner
from forensics.sources import line_extractors
from forensics.sources.base import Sink

RULES, _ = load_rules([patterns_dir()])
PREFIXES = (
    "(WorkerDict pid=3569860, ip=10.0.0.7) ",
    "\x1b[36m(TaskRunner pid=247607)\x1b[0m ",
    "[rank3]: ",
)


def test_every_failure_class_has_a_rule():
    covered = {r.cls for r in RULES}
    assert set(TAXONOMY) - covered <= {"unknown_crash"}  # the built-in fallback covers unrecognised crashes


def test_symptom_classes_are_causes_somewhere():
    """A rule may only defer to classes that some rule (or the fallback) can produce."""
    producible = {r.cls for r in RULES} | {"unknown_crash", "collective_mismatch"}
    for rule in RULES:
        assert set(rule.symptom_of) <= producible, rule.id


def test_consequences_defer_to_the_causes():
    by_class = {r.id: set(r.symptom_of) for r in RULES}
    for consequence in ("ray-actor-died", "nccl-watchdog-timeout", "watchdog-hang"):
        assert {"cuda_oom", "host_oom", "unknown_crash"} <= by_class[consequence]
    assert "host_oom" in by_class["process-sigkill"]
    assert "host_oom" in by_class["out-of-memory-error"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_examples_fire_behind_ray_and_torchrun_prefixes(tmp_path: Path, prefix: str):
    """The vectorised prefilter sees the raw line: a rule must still fire when a prefix is in front (an exception
    family's example may instead be read by a text rule of the family's class, which it then defers to)."""
    scanner = TextScanner(RULES, line_extractors())
    lines, expected = [], []
    for rule in RULES:
        if any(c.regex.startswith("^") for c in rule.match):
            continue
        for example in rule.examples_match:
            if "\n" not in example:
                lines.append(prefix + example)
                expected.append(rule.id)
    log = tmp_path / "driver.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sink = Sink()
    scanner.scan(log, "driver.log", sink)
    fired = {
        (row["line"], rule_id)
        for row in sink.events().iter_rows(named=True)
        for rule_id in json.loads(row["fields"]).get("rules", [])
    }
    by_id = {r.id: r for r in RULES}
    named = {(line, by_id[rule_id].cls) for line, rule_id in fired}
    # two rules' examples may be one line: the second may then be a repeat of the first (the same text but for its
    # numbers), counted into the first one's event (which says so), and read there
    events = {row["line"]: json.loads(row["fields"]) for row in sink.events().iter_rows(named=True)}
    first: dict[str, int] = {}
    at = []
    for i, line in enumerate(lines):
        earlier = first.setdefault(re.sub(r"0x[0-9a-fA-F]+|[0-9]+", "#", line), i + 1)
        at.append(earlier if i + 1 not in events and "repeats" in events.get(earlier, {}) else i + 1)
    missing = [
        (i + 1, rid, lines[i][:100])
        for i, rid in enumerate(expected)
        if (at[i], rid) not in fired and not (by_id[rid].is_family and (at[i], by_id[rid].cls) in named)
    ]
    assert not missing
