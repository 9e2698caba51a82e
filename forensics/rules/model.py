"""The catalogue model: one YAML file per entry, validated strictly.

An entry is a text rule (`match:` regexes, tested by its own examples), an exception family (`exception:` the
innermost exception's class, message shape and raising frames, tested on example tracebacks), or the description
of a finding that code computes (`detector:` names the code): either way the entry says what the finding is
called, its class, severity and remediation, so that code only computes and the catalogue describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import regex

TAXONOMY = (
    "cuda_oom",
    "kv_cache_insufficient",
    "host_oom",
    "process_killed",
    "nccl_timeout",
    "nccl_error",
    "collective_mismatch",
    "ray_actor_died",
    "ray_node_died",
    "weight_key_mismatch",
    "shape_mismatch",
    "cuda_error",
    "gpu_hardware",
    "env_version_mismatch",
    "config_error",
    "training_instability",
    "straggler",
    "hang",
    "disk_or_io",
    "unknown_crash",
)
SEVERITIES = ("critical", "error", "warning", "info")
LAYERS = ("infrastructure", "framework", "script")
# What a finding's evidence is: a line that says what failed (an exception, a kill, a watchdog), a measured
# fact (a NaN in a step line, a time gap), or a statistical reading of curves (a divergence, a trend).
EVIDENCE_STRENGTHS = ("direct", "measured", "statistical")
USER_REGEX_TIMEOUT_S = 1.0
CUT_RAISING_FRAMES = 3  # the innermost frames of a cut traceback that a family's frames must name


@dataclass(frozen=True)
class MatchClause:
    """A line matching `regex`; with `followed_by`, that must match within the next `window` lines."""

    regex: str
    followed_by: str | None = None
    window: int = 0

    @property
    def compiled(self) -> regex.Pattern:
        return _compile(self.regex)

    @property
    def compiled_followed_by(self) -> regex.Pattern | None:
        return _compile(self.followed_by) if self.followed_by else None


@dataclass(frozen=True)
class ExceptionMatch:
    """An exception family: the innermost exception's class, and optionally its module, message and frames."""

    types: tuple[str, ...]
    module: str | None = None  # regex on the exception's module (`torch`, `ray.exceptions`)
    message: str | None = None  # regex searched in the message
    frames: str | None = None  # regex searched in each raising frame, written `path/to/file.py:function`
    frames_alone: bool = False  # the frames name the family: a traceback cut before its exception line belongs too

    def matches(self, cls: str, module: str, message: str, frames: list[str]) -> bool:
        """Whether an exception belongs to the family; `cls` is "" for a traceback cut before its exception line,
        which only a family whose frames alone are telling can claim, by the innermost frames (what raised: the
        outer ones are the program's main loop whatever failed)."""
        if not cls:
            return self.frames_alone and self._frames_match(frames[-CUT_RAISING_FRAMES:])
        if cls not in self.types:
            return False
        if self.module is not None and not _compile(self.module).search(module or "", timeout=USER_REGEX_TIMEOUT_S):
            return False
        if self.message is not None and not _compile(self.message).search(message or "", timeout=USER_REGEX_TIMEOUT_S):
            return False
        return self.frames is None or self._frames_match(frames)

    def _frames_match(self, frames: list[str]) -> bool:
        pattern = _compile(self.frames) if self.frames else None
        return pattern is not None and any(pattern.search(f, timeout=USER_REGEX_TIMEOUT_S) for f in frames)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    cls: str
    severity: str
    layer: str
    description: str
    match: tuple[MatchClause, ...]  # empty for a detector's entry
    detector: str = ""  # the code that computes this finding, in place of `match`
    exception: ExceptionMatch | None = None  # an exception family, in place of `match`
    evidence: str = "direct"  # one of EVIDENCE_STRENGTHS
    extract: dict[str, str] = field(default_factory=dict)
    extract_window: int = 0
    symptom_of: tuple[str, ...] = ()
    remediation: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    examples_match: tuple[str, ...] = ()
    examples_no_match: tuple[str, ...] = ()
    path: str = ""

    @property
    def is_detector(self) -> bool:
        return bool(self.detector)

    @property
    def is_family(self) -> bool:
        return self.exception is not None

    @property
    def area(self) -> str:
        parts = self.path.replace("\\", "/").split("/")
        return parts[-2] if len(parts) >= 2 else ""

    def matches(self, line: str) -> MatchClause | None:
        """The first clause whose main regex matches `line` (the one-line part of matching)."""
        for clause in self.match:
            if clause.compiled.search(line, timeout=USER_REGEX_TIMEOUT_S):
                return clause
        return None

    def extract_fields(self, lines: list[str]) -> dict[str, str]:
        """Named values found in the matched line or the `extract_window` lines after it."""
        found: dict[str, str] = {}
        for line in lines:
            for clause in self.match:
                m = clause.compiled.search(line, timeout=USER_REGEX_TIMEOUT_S)
                if m:
                    found.update({k: v for k, v in m.groupdict().items() if v is not None and k not in found})
            for pattern in self.extract.values():
                m = _compile(pattern).search(line, timeout=USER_REGEX_TIMEOUT_S)
                if m:
                    found.update({k: v for k, v in m.groupdict().items() if v is not None and k not in found})
        return found


_CACHE: dict[str, regex.Pattern] = {}


def _compile(pattern: str) -> regex.Pattern:
    compiled = _CACHE.get(pattern)
    if compiled is None:
        compiled = regex.compile(pattern)
        _CACHE[pattern] = compiled
    return compiled
