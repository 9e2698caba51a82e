"""`patterns lint` times each rule regex on hostile long lines; these tests check what it builds and decides
on regexes far from the line (catastrophic or trivially linear), never a duration."""

from __future__ import annotations

import re
import textwrap

from click.testing import CliRunner

from forensics.cli import main
from forensics.rules.lint import LINE_CHARS, hostile_lines, judge


def test_hostile_lines_run_each_repeat_after_what_leads_to_it():
    lines = {line.kind: line.text for line in hostile_lines(r"NCCL WARN .*Failed to CUDA (?:calloc|malloc)")}
    assert all(len(text) == LINE_CHARS for text in lines.values())
    assert lines["'x' repeated after 'NCCL WARN '"].startswith("NCCL WARN xxxx")
    assert lines["'NCCL WARN x' repeated"].startswith("NCCL WARN xNCCL WARN x")
    assert "a long verl step line ending in a NaN loss" in lines
    assert lines["'Failed to CUDA calloc' repeated"].count("Failed to CUDA calloc") > 3000  # a literal it needs


def test_a_negated_class_runs_a_character_it_accepts():
    lines = {line.kind: line.text for line in hostile_lines(r"Xid \((?P<pci>[^)]*)\): 13,")}
    assert lines["'x' repeated after 'Xid ('"].startswith("Xid (xxx")


QUADRATIC = r"(?P<library>[\w.+-]+\.so[\d.]*): undefined symbol"  # the bundled rule before it was bounded


def test_quadratic_and_catastrophic_regexes_are_slow_and_a_literal_is_not():
    assert "took over" in judge(QUADRATIC, hostile_lines(QUADRATIC))  # minutes on 'a.so1' repeated
    assert "took over" in judge(r"(a|aa)+$", hostile_lines(r"(a|aa)+$"))
    assert judge(r"NCCL WARN Cuda failure", hostile_lines(r"NCCL WARN Cuda failure")) is None


def test_lint_reports_a_slow_user_regex_with_its_file_line_and_rule(tmp_path):
    area = tmp_path / "ours" / "site"
    area.mkdir(parents=True)
    (area / "slow-warn.yaml").write_text(
        textwrap.dedent(
            r"""
            id: slow-warn
            title: t
            class: nccl_error
            severity: warning
            layer: infrastructure
            description: d
            match:
              - regex: '(?P<library>[\w.+-]+\.so[\d.]*): undefined symbol'
            examples:
              match: ['libfoo.so.1: undefined symbol: bar']
              no_match: ['all is well']
            """
        )
    )
    result = CliRunner().invoke(main, ["patterns", "lint", str(tmp_path / "ours")])
    assert result.exit_code == 2  # invalid rules (README: exit status)
    assert "site/slow-warn.yaml:9: match: regex '(?P<library>[\\\\w.+-]+" in result.output
    assert re.search(r"took over [\d.]+ s on 'a\.so1' repeated", result.output)  # the limit grows on a busy machine
    assert "(rule slow-warn)" in result.output


def test_a_regex_slow_to_compile_in_rust_is_reported():
    """Rust compiles a regex in each batch it is tried on; bounded repeats of Unicode classes cost 30 ms."""
    slow = r"requires? (?P<requirement>[\w.\-]{1,128} ?[<>=!~]=?\s{0,8}[\w.*+]{1,64}) but found"
    assert "to compile in Rust's engine" in judge(slow, hostile_lines(slow))
    ascii_ = r"requires? (?P<requirement>[A-Za-z0-9_.\-]{1,128} ?[<>=!~]=?\s{0,8}[A-Za-z0-9_.*+]{1,64}) but found"
    assert judge(ascii_, hostile_lines(ascii_)) is None
