"""Load catalogue entries from YAML strictly: every problem names its file, line and key.

A linter collects every problem (`collect=True`); a library caller fails on the first.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import regex
import yaml

from forensics.line_prefixes import FileContext, attribute
from forensics.metric_semantics import METRICS_FOLDER
from forensics.rules.model import (
    EVIDENCE_STRENGTHS,
    LAYERS,
    SEVERITIES,
    TAXONOMY,
    USER_REGEX_TIMEOUT_S,
    ExceptionMatch,
    MatchClause,
    Rule,
)
from forensics.tracebacks import cut_traceback, last_exception

ALLOWED_KEYS = {
    "id",
    "title",
    "class",
    "severity",
    "layer",
    "description",
    "match",
    "detector",
    "exception",
    "evidence",
    "extract",
    "extract_window",
    "symptom_of",
    "remediation",
    "references",
    "examples",
    "notes",
}
REQUIRED_KEYS = ("id", "title", "class", "severity", "layer", "description")
RULE_ONLY_KEYS = ("match", "examples", "extract", "extract_window")  # a detector's entry has no line to match
EXCEPTION_KEYS = {"types", "module", "message", "frames", "frames_alone"}
IDENTIFIER = regex.compile(r"^[A-Za-z_]\w*$")
KINDS = ("match", "detector", "exception")
CLAUSE_KEYS = {"regex", "followed_by", "window"}
ID_SHAPE = regex.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True)
class RuleError:
    path: str
    line: int
    key: str
    message: str
    rule_id: str = ""

    def __str__(self) -> str:
        who = f" (rule {self.rule_id})" if self.rule_id else ""
        return f"{self.path}:{self.line}: {self.key}: {self.message}{who}"


class RuleLoadError(Exception):
    def __init__(self, errors: list[RuleError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """Safe YAML that rejects duplicate keys and remembers where each key was written."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key]})", key_node.start_mark
            )
        seen[key] = line
    mapping = yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)
    mapping["__lines__"] = seen
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _rust_regex_error(pattern: str) -> str | None:
    """Why polars' (Rust) regex engine refuses `pattern`, or None when it accepts it."""
    try:
        pl.Series([""]).str.contains(pattern)
    except Exception as exc:  # polars raises ComputeError with the engine's message
        return str(exc).splitlines()[0]
    return None


def _rust_regex_errors(patterns: list[str]) -> list[str | None]:
    """`_rust_regex_error` of each pattern: one polars call when the engine accepts them all.

    The patterns are a column, matched row by row: as many expressions of one `select`, they cost 20 MiB
    more at peak (measured on the bundled rules, which a run of traces alone then feels) and were slower.
    """
    try:
        pl.Series([""] * len(patterns)).str.contains(pl.Series(patterns, dtype=pl.String))
    except Exception:  # one is refused: find which, one by one
        return [_rust_regex_error(p) for p in patterns]
    return [None] * len(patterns)


def _as_str_list(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


class _RuleBuilder:
    """Turns one parsed YAML mapping into a Rule, collecting errors as it goes."""

    def __init__(self, path: str, data: dict[str, Any], run_examples: bool = True):
        self.path = path
        self.run_examples = run_examples
        self.data = data
        self.lines: dict[str, int] = data.pop("__lines__", {})
        self.errors: list[RuleError] = []
        self.rule_id = str(data.get("id", ""))
        self.rust_pending: list[tuple[str, str]] = []  # (key, regex) still to check in the Rust engine

    def error(self, key: str, message: str) -> None:
        self.errors.append(RuleError(self.path, self.lines.get(key, 1), key, message, self.rule_id))

    def check_regex(self, key: str, pattern: Any) -> str | None:
        """The pattern when Python's engine accepts it; the Rust engine's check follows in `check_rust`. A rule
        whose examples are not run (the bundled ones, which `forensics patterns test` compiles and runs in CI)
        is not compiled here either: each regex is compiled when a line first reaches it (most never are)."""
        if not isinstance(pattern, str) or not pattern:
            self.error(key, "must be a non-empty regex string")
            return None
        if not self.run_examples:
            return pattern
        try:
            regex.compile(pattern)
        except regex.error as exc:
            self.error(key, f"bad regex {pattern!r}: {exc}")
            return None
        self.rust_pending.append((key, pattern))
        return pattern

    def check_rust(self) -> None:
        """Every regex that Python accepted, through the Rust engine too (in one call)."""
        if not self.rust_pending:
            return
        for (key, pattern), rust in zip(
            self.rust_pending, _rust_regex_errors([p for _, p in self.rust_pending]), strict=True
        ):
            if rust:
                self.error(key, f"regex {pattern!r} is not accepted by the vectorised engine: {rust}")
        self.rust_pending = []

    def build(self) -> Rule | None:
        d = self.data
        for key in d:
            if key not in ALLOWED_KEYS:
                self.error(key, f"unknown key; allowed: {', '.join(sorted(ALLOWED_KEYS))}")
        for key in REQUIRED_KEYS:
            if key not in d:
                self.error(key, "required key is missing")
        detector = self.check_kind()
        if self.errors:
            return None
        self.check_identity()
        symptom_of = self.check_symptom_of()
        remediation = _as_str_list(d.get("remediation") or [])
        references = _as_str_list(d.get("references") or [])
        if remediation is None:
            self.error("remediation", "must be a list of strings")
        if references is None:
            self.error("references", "must be a list of strings")
        for key, text in [("title", str(d["title"])), *(("remediation", r) for r in remediation or [])]:
            self.check_template(key, text)
        family = self.build_exception(d["exception"]) if "exception" in d else None
        if detector:
            clauses, extract, window, ex_match, ex_no = [], {}, 0, [], []
        else:
            clauses = self.build_clauses(d["match"]) if "match" in d else []
            extract = self.check_extract()
            window = self.check_window()
            examples = self.check_examples_block()
            if examples is None:
                return None
            ex_match, ex_no = examples
        self.check_rust()
        if self.errors:
            return None
        rule = Rule(
            id=self.rule_id,
            title=str(d["title"]),
            cls=d["class"],
            severity=d["severity"],
            layer=d["layer"],
            description=str(d["description"]).strip(),
            match=tuple(clauses),
            detector=detector,
            exception=family,
            evidence=str(d.get("evidence", "direct")),
            extract=dict(extract),
            extract_window=window,
            symptom_of=tuple(symptom_of),
            remediation=tuple(remediation or ()),
            references=tuple(references or ()),
            examples_match=tuple(ex_match or ()),
            examples_no_match=tuple(ex_no or ()),
            path=self.path,
        )
        if not detector and self.run_examples:
            self.check_examples(rule)
        return None if self.errors else rule

    def check_kind(self) -> str:
        """The detector's name for a detector's entry, "" for a text rule or an exception family; one kind only."""
        d = self.data
        kinds = [k for k in KINDS if k in d]
        if len(kinds) > 1:
            self.error(kinds[1], f"an entry is one of {', '.join(KINDS)}; this one has {' and '.join(kinds)}")
            return ""
        if "detector" not in d:
            for key in ("match" if "exception" not in d else "exception", "examples"):
                if key not in d:
                    self.error(key, "required key is missing (or give `detector:` for a finding code computes)")
            return ""
        detector = d["detector"]
        if not isinstance(detector, str) or not ID_SHAPE.match(detector):
            self.error("detector", "must name the detector in kebab-case")
            return ""
        for key in RULE_ONLY_KEYS:
            if key in d:
                self.error(key, "a detector's entry has no lines to match: `detector:` replaces `match:` and examples")
        return detector

    def build_exception(self, raw: Any) -> ExceptionMatch | None:
        """An exception family's matcher: `types` (innermost exception classes), optional module/message/frames."""
        if not isinstance(raw, dict):
            self.error("exception", "must map `types` (and optionally module, message, frames)")
            return None
        raw.pop("__lines__", None)
        unknown = set(raw) - EXCEPTION_KEYS
        if unknown:
            self.error("exception", f"unknown keys {sorted(unknown)}; allowed: {sorted(EXCEPTION_KEYS)}")
        types = _as_str_list(raw.get("types") or [])
        if not types or not all(IDENTIFIER.match(t) for t in types):
            self.error("exception", "`types` must list exception class names (ModuleNotFoundError, ...)")
            return None
        patterns = {}
        for key in ("module", "message", "frames"):
            if key in raw:
                pattern = raw[key]
                if not isinstance(pattern, str) or not pattern:
                    self.error("exception", f"`{key}` must be a non-empty regex string")
                    continue
                try:
                    if self.run_examples:  # a bundled rule's are compiled when first used (see check_regex)
                        regex.compile(pattern)
                except regex.error as exc:
                    self.error("exception", f"bad {key} regex {pattern!r}: {exc}")
                    continue
                patterns[key] = pattern
        frames_alone = raw.get("frames_alone", False)
        if not isinstance(frames_alone, bool):
            self.error("exception", "`frames_alone` must be true or false")
            frames_alone = False
        if frames_alone and "frames" not in patterns:
            self.error("exception", "`frames_alone` needs `frames`: the frames that name the family")
        return ExceptionMatch(tuple(types), **patterns, frames_alone=frames_alone)

    def check_identity(self) -> None:
        d = self.data
        if not ID_SHAPE.match(self.rule_id):
            self.error("id", f"{self.rule_id!r} is not kebab-case")
        stem = Path(self.path).stem
        if stem != self.rule_id:
            self.error("id", f"the file must be named after the rule id ({self.rule_id}.yaml, not {stem})")
        if d["class"] not in TAXONOMY:
            self.error("class", f"{d['class']!r} is not in the taxonomy: {', '.join(TAXONOMY)}")
        if d["severity"] not in SEVERITIES:
            self.error("severity", f"{d['severity']!r} is not one of {', '.join(SEVERITIES)}")
        if d["layer"] not in LAYERS:
            self.error("layer", f"{d['layer']!r} is not one of {', '.join(LAYERS)}")
        if d.get("evidence", "direct") not in EVIDENCE_STRENGTHS:
            self.error("evidence", f"{d['evidence']!r} is not one of {', '.join(EVIDENCE_STRENGTHS)}")

    def check_symptom_of(self) -> list[str]:
        symptom_of = _as_str_list(self.data.get("symptom_of") or [])
        if symptom_of is None:
            self.error("symptom_of", "must be a list of classes")
            return []
        for cls in symptom_of:
            if cls not in TAXONOMY:
                self.error("symptom_of", f"{cls!r} is not in the taxonomy")
        return symptom_of

    def check_template(self, key: str, text: str) -> None:
        """Titles and remediation may name the finding's fields (`{metric}`, `{steps[0]}`); check the braces."""
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
        except ValueError as exc:
            self.error(key, f"bad placeholder in {text[:80]!r}: {exc} (write {{{{ and }}}} for literal braces)")
            return
        for name in names:
            if not regex.match(r"^[A-Za-z_]\w*(?:\[\d+\])?$", name):
                self.error(key, f"placeholder {{{name}}} must name a field, optionally indexed ({{steps[0]}})")

    def check_extract(self) -> dict[str, str]:
        extract = self.data.get("extract") or {}
        if not isinstance(extract, dict):
            self.error("extract", "must map names to regexes")
            return {}
        extract.pop("__lines__", None)
        for name, pattern in extract.items():
            self.check_regex("extract", pattern)
            if isinstance(pattern, str) and "(?P<" not in pattern:
                self.error("extract", f"{name}: the regex has no named group to extract")
        return extract

    def check_window(self) -> int:
        window = self.data.get("extract_window", 0)
        if not isinstance(window, int) or not 0 <= window <= 50:
            self.error("extract_window", "must be an integer from 0 to 50")
            return 0
        return window

    def check_examples_block(self) -> tuple[list[str], list[str]] | None:
        examples = self.data.get("examples")
        if not isinstance(examples, dict):
            self.error("examples", "must have `match` and `no_match` lists")
            return None
        ex_lines = examples.pop("__lines__", {})
        ex_match = _as_str_list(examples.get("match") or [])
        ex_no = _as_str_list(examples.get("no_match") or [])
        if not ex_match:
            self.error("examples", "needs at least one `match` example")
        if ex_no is None or not ex_no:
            self.error("examples", "needs at least one `no_match` example")
        for key in examples:
            if key not in ("match", "no_match"):
                self.errors.append(
                    RuleError(self.path, ex_lines.get(key, 1), f"examples.{key}", "unknown key", self.rule_id)
                )
        return ex_match or [], ex_no or []

    def build_clauses(self, raw: Any) -> list[MatchClause]:
        if not isinstance(raw, list) or not raw:
            self.error("match", "must be a non-empty list of {regex: ...} items")
            return []
        clauses = []
        for item in raw:
            if not isinstance(item, dict):
                self.error("match", f"item {item!r} must be a mapping with a `regex`")
                continue
            item.pop("__lines__", None)
            unknown = set(item) - CLAUSE_KEYS
            if unknown:
                self.error("match", f"unknown clause keys {sorted(unknown)}; allowed: {sorted(CLAUSE_KEYS)}")
            pattern = self.check_regex("match", item.get("regex"))
            followed = item.get("followed_by")
            if followed is not None:
                followed = self.check_regex("match", followed)
            window = item.get("window", 0)
            if not isinstance(window, int) or not 0 <= window <= 50:
                self.error("match", "window must be an integer from 0 to 50")
                window = 0
            if followed and not window:
                self.error("match", "followed_by needs a window (lines to look ahead)")
            if pattern:
                clauses.append(MatchClause(pattern, followed, window))
        return clauses

    def check_examples(self, rule: Rule) -> None:
        examples = [(True, line) for line in rule.examples_match] + [(False, line) for line in rule.examples_no_match]
        if rule.exception is not None:
            for expected, example in examples:
                if family_fires(rule.exception, example) != expected:
                    which = "match example does not match" if expected else "no_match example matches"
                    self.error("examples", f"{which}: {example[:120]!r}")
            return
        rust = _rust_hits(rule, [line for _, example in examples for line in example.split("\n")])
        for expected, example in examples:
            try:
                fires = _example_fires(rule, example, rust)
            except TimeoutError:
                self.error(
                    "examples",
                    f"matching {example[:120]!r} took over {USER_REGEX_TIMEOUT_S:g} s: the regex backtracks "
                    "catastrophically (nested quantifiers like (a+)+); rewrite it",
                )
                continue
            if fires != expected:
                which = "match example does not match" if expected else "no_match example matches"
                self.error("examples", f"{which}: {example[:120]!r}")


def _body(line: str) -> str:
    return attribute(line, FileContext()).body


def family_fires(family: ExceptionMatch, example: str) -> bool:
    """Whether the last exception of a traceback (printed with any prefixes) belongs to the family; an example
    cut before its exception line is read as the scanner reads a log that ends inside a traceback."""
    raised = last_exception(example, _body)
    if raised is None:
        cut = cut_traceback(example.split("\n"), _body)
        if cut is None:
            return False
        raised = cut[1]
    frames = [f"{f.file}:{f.func}" for f in raised.frames]
    return family.matches(raised.innermost, raised.innermost_module, raised.innermost_message, frames)


def _rust_hits(rule: Rule, lines: list[str]) -> dict[str, bool]:
    """For each line, whether any of the rule's regexes matches it in the Rust engine (one polars call, with
    a row per line and regex: see `_rust_regex_errors`)."""
    distinct = list(dict.fromkeys(lines))
    regexes = [f"(?m){c.regex}" for c in rule.match]
    pairs = pl.DataFrame(
        {"line": [line for line in distinct for _ in regexes], "regex": regexes * len(distinct)},
        schema={"line": pl.String, "regex": pl.String},
    )
    hits = pairs.select(pl.col("line").str.contains(pl.col("regex"))).to_series().to_list()
    n = len(regexes)
    return {line: any(hits[i * n : (i + 1) * n]) for i, line in enumerate(distinct)}


def _example_fires(rule: Rule, example: str, rust: dict[str, bool]) -> bool:
    """Whether a (possibly multi-line) example fires the rule, in both regex engines alike.

    `rust`: each line's result in the Rust engine, from `_rust_hits`.
    """
    lines = example.split("\n")
    for i, line in enumerate(lines):
        clause = rule.matches(line)
        if (clause is not None) != rust[line]:
            return False  # the two engines disagree: treat as a failing example
        if clause is None:
            continue
        if clause.followed_by is None:
            return True
        follow = clause.compiled_followed_by
        ahead = lines[i + 1 : i + 1 + clause.window]
        if follow is not None and any(follow.search(x, timeout=USER_REGEX_TIMEOUT_S) for x in ahead):
            return True
    return False


_VALIDATED: dict[tuple[str, str, bool], tuple[Rule | None, tuple[RuleError, ...]]] = {}


def load_rule_file(
    path: Path, root: Path | None = None, run_examples: bool = True
) -> tuple[Rule | None, list[RuleError]]:
    """One rule file, validated (its examples run through it unless `run_examples` is off); the result is
    remembered by content, so a batch validates each rule once."""
    shown = str(path.relative_to(root)) if root and path.is_relative_to(root) else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [RuleError(shown, 1, "file", f"cannot read: {exc}")]
    known = _VALIDATED.get((shown, text, run_examples))
    if known is None:
        known = _VALIDATED[(shown, text, run_examples)] = _validate(shown, text, run_examples)
    return known[0], list(known[1])


def _validate(shown: str, text: str, run_examples: bool) -> tuple[Rule | None, tuple[RuleError, ...]]:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else 1
        return None, (RuleError(shown, line, "yaml", str(exc).replace("\n", " ")),)
    if not isinstance(data, dict):
        return None, (RuleError(shown, 1, "file", "a rule file must hold one mapping"),)
    builder = _RuleBuilder(shown, data, run_examples)
    rule = builder.build()
    return rule, tuple(builder.errors)


def rule_files(directories: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(file, root) for every rule file under the directories, in a stable order.

    `metrics/` holds what metrics mean (forensics.metric_semantics), not rules.
    """
    found = []
    for root in directories:
        for path in sorted(root.rglob("*.yaml")) + sorted(root.rglob("*.yml")):
            if path.relative_to(root).parts[0] != METRICS_FOLDER:
                found.append((path, root))
    return found


DETECTOR_KEY = regex.compile(r"^detector:", regex.MULTILINE)


def _declares_detector(path: Path) -> bool:
    try:
        return bool(DETECTOR_KEY.search(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        return True  # let the full load report it


def load_rules(
    directories: Iterable[Path],
    collect: bool = False,
    detectors_only: bool = False,
    tested: Iterable[Path] = (),
) -> tuple[list[Rule], list[RuleError]]:
    """Load every catalogue entry; later directories overlay earlier ones by id.

    With `collect`, problems are returned; otherwise the first problem raises RuleLoadError. With
    `detectors_only`, text rules are skipped unread (a run without text logs needs only the detectors'). The
    examples of the directories in `tested` are not run again (the bundled ones: `forensics patterns test`
    runs them in CI), nor are their regexes compiled before they are used; every other check is made.
    """
    tested_roots = set(tested)
    by_id: dict[str, Rule] = {}
    errors: list[RuleError] = []
    dirs = list(directories)
    for index, root in enumerate(dirs):
        seen_here: dict[str, str] = {}
        for path, base in rule_files([root]):
            if detectors_only and not _declares_detector(path):
                continue
            rule, errs = load_rule_file(path, base, run_examples=root not in tested_roots)
            errors.extend(errs)
            if errs and not collect:
                raise RuleLoadError(errs)
            if rule is None:
                continue
            if rule.id in seen_here:
                err = RuleError(rule.path, 1, "id", f"duplicate rule id, also in {seen_here[rule.id]}", rule.id)
                errors.append(err)
                if not collect:
                    raise RuleLoadError([err])
                continue
            seen_here[rule.id] = rule.path
            if index > 0 or rule.id not in by_id:
                by_id[rule.id] = rule
    return sorted(by_id.values(), key=lambda r: (r.area, r.id)), errors
