"""What a metric is, as data: `patterns/metrics/*.yaml` says for each name (or glob) what it measures, which way
is better, how noisy it is, which detectors judge it and where the report plots it.

One low module: the detectors, the report's figures and `forensics diff` all read the vocabulary from here.
`--patterns DIR` puts DIR/metrics/*.yaml in front of the bundled files. Files are validated as strictly as
rules (unknown keys, kinds, detectors and values fail with file and line), and each file's `examples` must
resolve to the kinds they name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from forensics.package_data import patterns_dir

METRICS_FOLDER = "metrics"
KINDS = frozenset(
    {
        "loss",  # minimised by gradient descent (LM cross-entropy, SFT loss)
        "val_loss",
        "policy_loss",  # PPO/GRPO surrogate: centred on zero, not minimised in that sense
        "value_loss",
        "kl",  # to the reference policy: grows as the policy learns
        "ppo_kl",  # to the rollout policy: the size of one update
        "kl_coef",
        "entropy",
        "reward",
        "reward_stat",
        "val_score",
        "advantage",
        "clip_fraction",
        "length",
        "length_clip_ratio",
        "grad_norm",
        "lr",
        "time",
        "throughput",
        "gpu_memory",
        "host_memory",
        "count",
        "counter",
        "other",
    }
)
DETECTORS = frozenset(
    {
        "non-finite",
        "divergence",
        "oscillation",
        "spike",
        "grad-explosion",
        "policy-loss",
        "entropy-collapse",
        "kl-blowup",
        "reward-collapse",
        "length-collapse",
        "clip-fraction",
        "response-truncation",
        "memory-growth",
        "throughput-regression",
        "slow-rank",
    }
)
GOALS = ("minimise", "maximise", "none")
NOISE = ("low", "medium", "high")
PLOTS = ("training", "throughput", "memory")
REDUCTIONS = ("mean", "max", "min")
ENTRY_KEYS = {"name", "kind", "goal", "noise", "detectors", "plot", "reduce", "description"}
FILE_KEYS = {"vocabulary", "metrics", "examples"}


class MetricFileError(ValueError):
    """A metrics file that does not follow the schema; the message names the file and line."""


@dataclass(frozen=True)
class MetricSpec:
    name: str  # exact metric name, or a glob
    kind: str
    goal: str
    noise: str
    detectors: tuple[str, ...]
    plot: str | None = None
    reduce: str | None = None
    description: str = ""
    source: str = ""  # file:line it was defined at

    @property
    def is_glob(self) -> bool:
        return any(c in self.name for c in "*?[")


UNKNOWN = MetricSpec("*", "other", "none", "high", ())


@dataclass
class Vocabulary:
    """Every spec, in the order they are tried: user files first, then the bundled ones."""

    specs: list[MetricSpec]
    _exact: dict[str, MetricSpec] = field(init=False)
    _globs: list[MetricSpec] = field(init=False)
    _memo: dict[str, MetricSpec] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._exact = {}
        for spec in self.specs:
            if not spec.is_glob:
                self._exact.setdefault(spec.name, spec)
        self._globs = [s for s in self.specs if s.is_glob]

    def spec(self, metric: str) -> MetricSpec:
        """The spec of a metric: its exact entry, else the first glob that matches, else `other`."""
        hit = self._memo.get(metric)
        if hit is None:
            hit = self._exact.get(metric) or next(
                (s for s in self._globs if fnmatch.fnmatchcase(metric, s.name)), UNKNOWN
            )
            self._memo[metric] = hit
        return hit

    def kind(self, metric: str) -> str:
        return self.spec(metric).kind

    def judged_by(self, metric: str, detector: str) -> bool:
        return detector in self.spec(metric).detectors

    def with_detector(self, metrics: Iterable[str], detector: str) -> list[str]:
        return sorted(m for m in metrics if self.judged_by(m, detector))

    def plotted(self, panel: str) -> tuple[str, ...]:
        """The exact names drawn in one report panel, in file order."""
        return tuple(dict.fromkeys(s.name for s in self.specs if s.plot == panel and not s.is_glob))


def _fail(path: str, line: int, message: str) -> MetricFileError:
    return MetricFileError(f"{path}:{line}: {message}")


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML whose mappings remember the line they start on (key `__line__`)."""


def _mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(k) for k, _ in node.value]
    duplicate = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if duplicate is not None:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate key {duplicate!r}", node.start_mark)
    mapping = yaml.constructor.SafeConstructor.construct_mapping(loader, node)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


def _choice(path: str, line: int, entry: dict, key: str, allowed: Iterable[str], required: bool = True) -> Any:
    value = entry.get(key)
    if value is None and not required:
        return None
    if value not in allowed:
        raise _fail(path, line, f"{key}: {value!r} is not one of {', '.join(sorted(allowed))}")
    return value


def _spec(path: str, raw: Any) -> MetricSpec:
    if not isinstance(raw, dict):
        raise _fail(path, 1, f"each entry of metrics: must be a mapping, not {raw!r}")
    line = raw.pop("__line__", 1)
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise _fail(path, line, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ENTRY_KEYS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _fail(path, line, "name: a metric name or glob is required")
    detectors = raw.get("detectors", [])
    if not isinstance(detectors, list) or any(d not in DETECTORS for d in detectors):
        bad = detectors if not isinstance(detectors, list) else [d for d in detectors if d not in DETECTORS]
        raise _fail(path, line, f"detectors: {bad!r} not known; known: {', '.join(sorted(DETECTORS))}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, line, "description: must be text")
    return MetricSpec(
        name=name,
        kind=_choice(path, line, raw, "kind", KINDS),
        goal=_choice(path, line, raw, "goal", GOALS),
        noise=_choice(path, line, raw, "noise", NOISE),
        detectors=tuple(detectors),
        plot=_choice(path, line, raw, "plot", PLOTS, required=False),
        reduce=_choice(path, line, raw, "reduce", REDUCTIONS, required=False),
        description=description,
        source=f"{path}:{line}",
    )


def load_file(path: Path, shown: str | None = None) -> tuple[list[MetricSpec], dict[str, str]]:
    """(specs, examples) of one metrics file, validated; MetricFileError names the problem."""
    shown = shown or str(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_LineLoader)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(shown, 1, f"cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise _fail(shown, mark.line + 1 if mark else 1, str(exc).replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise _fail(shown, 1, "a metrics file holds one mapping with `metrics:` (and `examples:`)")
    data.pop("__line__", None)
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise _fail(shown, 1, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(FILE_KEYS))}")
    raw = data.get("metrics")
    if not isinstance(raw, list) or not raw:
        raise _fail(shown, 1, "metrics: a non-empty list of entries is required")
    examples = data.get("examples") or {}
    if not isinstance(examples, dict):
        raise _fail(shown, 1, "examples: a mapping of metric name to the kind it must resolve to")
    examples.pop("__line__", None)
    return [_spec(shown, dict(entry) if isinstance(entry, dict) else entry) for entry in raw], examples


def metric_files(directory: Path) -> list[Path]:
    folder = directory / METRICS_FOLDER
    return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else []


def load_vocabulary(overlays: Iterable[Path] = ()) -> Vocabulary:
    """The overlays' metrics files (first given first), then the bundled ones; examples checked against the whole."""
    return _load(tuple(Path(p) for p in overlays))


@cache
def _load(overlays: tuple[Path, ...]) -> Vocabulary:
    """Each root's examples are checked against that root and the ones after it: a user file may change what
    a bundled example resolves to, and the bundled files stay right on their own."""
    roots = [*overlays, patterns_dir()]
    per_root: list[tuple[list[MetricSpec], list[tuple[str, str, str]]]] = []
    for root in roots:
        specs: list[MetricSpec] = []
        checks: list[tuple[str, str, str]] = []
        for path in metric_files(root):
            shown = f"{root.name}/{path.relative_to(root)}"
            found, examples = load_file(path, shown)
            specs.extend(found)
            checks.extend((shown, str(name), str(kind)) for name, kind in examples.items())
        per_root.append((specs, checks))
    for i, (_, checks) in enumerate(per_root):
        scope = Vocabulary([spec for specs, _ in per_root[i:] for spec in specs])
        for shown, name, kind in checks:
            if kind not in KINDS:
                raise MetricFileError(f"{shown}: example {name!r}: {kind!r} is not a kind")
            got = scope.kind(name)
            if got != kind:
                raise MetricFileError(f"{shown}: example {name!r} resolves to {got!r}, not {kind!r}")
    return Vocabulary([spec for specs, _ in per_root for spec in specs])


def bundled() -> Vocabulary:
    """The bundled vocabulary (what the report's panels and `diff` name)."""
    return load_vocabulary()


def panel(name: str) -> tuple[str, ...]:
    """The metrics of one report panel (training, throughput, memory), from the bundled files."""
    return bundled().plotted(name)
