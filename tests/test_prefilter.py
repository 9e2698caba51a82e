from __future__ import annotations

import re

import polars as pl
import pytest

from forensics.pipeline import load_catalogue
from forensics.prefilter import Literals, literal_searches, required_literals
from forensics.sources import line_extractors


def _bundled_patterns() -> list[str]:
    found = [e.trigger for e in line_extractors()]
    found += [clause.regex for rule in load_catalogue([]).rules for clause in rule.match]
    return found


@pytest.mark.parametrize(
    ("pattern", "strings", "icase"),
    [
        (r"NCCL WARN (?P<msg>.*)$", {"NCCL WARN "}, False),
        (r"exitcode\s*:\s*-?\d+", {"exitcode"}, False),
        # an alternation needs one of its branches; the longest certain run of each branch is kept
        (
            r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds",
            {"Heartbeat monitor timed out", "watchdog got stuck for "},
            False,
        ),
        # Python factors the common "E" out of (?:Error|Exception); the literals are whole again
        (r"[A-Z]\w*(?:Error|Exception)\b", {"Error", "Exception"}, False),
        (r"x?abc", {"abc"}, False),  # an optional part needs nothing
        (r"ab{2}c", {"abbc"}, False),
        (r"[KMGT]iB", {"KiB", "MiB", "GiB", "TiB"}, False),  # a small class is an alternation of letters
        (r"(?i)nccl timeout", {"nccl timeout"}, True),
        (r"a(?i:bc)", {"abc"}, True),  # a case-insensitive part makes the whole test case-insensitive
        (r"foo(?=bar)bar", {"foobar"}, False),  # a lookahead is zero-width: both sides stay adjacent
        # a prefix NCCL writes on millions of lines gives way to any other literal the pattern needs
        (r"NCCL INFO \S+\.(?:cc|h):\d+ -> (?P<code>[1-9])", {" -> "}, False),
        (r"NCCL INFO \S+ -> 2", {" -> 2"}, False),
        (r"NCCL INFO \S+", {"NCCL INFO "}, False),
    ],
)
def test_required_literals(pattern, strings, icase):
    literals = required_literals(pattern)
    assert literals is not None
    assert (literals.strings, literals.icase) == (frozenset(strings), icase)


@pytest.mark.parametrize(
    ("pattern", "also"),
    [
        # the other literals of the top-level sequence, most selective first, at most two
        # Ray's C++ log prefix and file names are in all of its lines: " C " (a fatal line) is searched
        (r"\[\d+ C \d+\] \(raylet\) (?P<check>\S+\.cc:\d+)", []),
        (r"NCCL INFO \S+\.(?:cu|h):\d+ -> [1-9]", [{".cu:", ".h:"}]),  # NCCL's prefix is never tested
        (r"(?i)Watchdog: (?:rank|gpu) \d+ timed out", [{" timed out"}]),  # the branch joins the first run
        (r"exitcode\s*:\s*-?\d+", []),  # one literal: nothing further
        (r"foo|bar baz", []),  # an alternation at the top holds no sequence of its own
    ],
)
def test_further_literals(pattern, also):
    literals = required_literals(pattern)
    assert literals is not None
    assert [set(a) for a in literals.also] == also


def test_further_literals_are_tested_on_the_line():
    literals = required_literals(r"NCCL INFO \S+\.(?:cu|h):\d+ -> [1-9]")
    assert literals is not None and literals.strings == {" -> "}
    for line, holds in [
        ("host:1:2 [0] NCCL INFO include/net.h:25 -> 2", True),
        ("host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC", False),
    ]:
        assert literals.also_in(line, line.lower()) is holds
    folded = required_literals(r"(?i)Watchdog: (?:rank|gpu) \d+ timed out")
    line = "WATCHDOG: GPU 3 TIMED OUT"
    assert folded is not None and folded.also_in(line, line.lower())


def test_weak_literals_are_told_apart():
    assert required_literals(r"NCCL INFO \S+ -> 2").weak is False  # " -> 2" holds a digit
    assert required_literals(r"\S+ -> \d").weak is True  # punctuation only
    assert required_literals(r"NCCL INFO \S+").weak is True  # in every line of NCCL's INFO output
    assert required_literals(r"exitcode\s*:").weak is False


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\d+\s*$",  # only classes and repeats: nothing is certain
        r"(?:abc)?",
        r"abc|\d+",  # one branch without a literal frees the whole alternation
        r"[[:alpha:]]+x]",  # Rust reads a POSIX class where Python reads a set of characters
        r"(?<name>ab)",  # Rust-only syntax
        r"(?i)straße",  # Unicode case folding is beyond a lower-cased substring test
    ],
)
def test_no_literals_when_nothing_is_certain(pattern):
    assert required_literals(pattern) is None


def test_every_bundled_pattern_has_a_prefilter():
    # a pattern without literals is searched in full over every line: fine, but slower; keep it deliberate
    assert [p for p in _bundled_patterns() if required_literals(p) is None] == []


def test_literals_are_in_every_real_line_a_bundled_pattern_matches(corpus):
    lines = [
        line
        for path in sorted((corpus / "cases").glob("*.log"))
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
    ]
    checked = 0
    for pattern in _bundled_patterns():
        literals = required_literals(pattern)
        compiled = re.compile(pattern)
        for line in lines:
            if compiled.search(line):
                checked += 1
                assert literals is not None and literals.found_in(line, line.lower()), (pattern, line)
    assert checked > 40  # the corpus exercises the patterns


def test_literals_are_in_every_rule_example_that_matches():
    for rule in load_catalogue([]).rules:
        for example in rule.examples_match:
            for clause in rule.match:
                if clause.compiled.search(example):
                    literals = required_literals(clause.regex)
                    assert literals is not None and literals.found_in(example, example.lower()), (rule.id, example)


def test_alternation_escapes_for_rust_and_drops_literals_that_contain_others():
    sets = [
        Literals(frozenset({"Error", "RuntimeError: CUDA out of memory."})),
        Literals(frozenset({"a+b (c) [d] {e} ^f$ #g &h -i ~j |k \\l"})),
        Literals(frozenset({"nccl timeout"}), icase=True),
    ]
    searches = literal_searches(sets)
    assert len(searches) == 2  # plain and case-insensitive literals are searched apart
    assert "CUDA out of memory" not in searches[0]  # it contains "Error", which is enough
    lines = pl.Series(
        [
            "x RuntimeError: CUDA out of memory.",
            "x a+b (c) [d] {e} ^f$ #g &h -i ~j |k \\l y",
            "[rank3] NCCL Timeout after 600 s",
            "a+b (c) [d] {e} ^f$ #g &h -i ~j |k \\m",
            "all is well",
        ]
    )
    found = [any(row) for row in zip(*(lines.str.contains(s).to_list() for s in searches), strict=True)]
    assert found == [True, True, True, False, False]


def test_literals_just_past_one_simd_search_are_split_in_two_searches():
    many = [Literals(frozenset({f"needle-{i:03d}-x"})) for i in range(100)]
    searches = literal_searches(many)
    assert len(searches) == 2
    assert sorted(x for s in searches for x in s.split("|")) == sorted(f"needle\\-{i:03d}\\-x" for i in range(100))
    assert len(literal_searches(many[:60])) == 1
    assert len(literal_searches(many + [Literals(frozenset({f"other-{i}-y"})) for i in range(100)])) == 1
    assert literal_searches([Literals(frozenset({"nccl timeout"}), icase=True)]) == ["(?i)nccl timeout"]
