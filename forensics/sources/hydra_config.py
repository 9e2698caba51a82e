"""Hydra's record of a verl run's config: `.hydra/config.yaml` and `.hydra/overrides.yaml`.

`config.yaml` is the composed config as Hydra saved it, with `${...}` interpolations left unresolved;
those values are dropped here, so the resolved copy verl's TaskRunner prints (read by the verl console
source) is what the report shows for them. `overrides.yaml` lists the command-line `key=value`
overrides, the one copy that exists even when Hydra aborted before the run started.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.sources.verl import CONFIG_ROOTS, flatten
from forensics.textio import open_binary

MAX_BYTES = 16 * 1024 * 1024
ROOT_KEY = re.compile(rb"^(?:" + b"|".join(k.encode() for k in sorted(CONFIG_ROOTS)) + rb"):", re.MULTILINE)
OVERRIDE = re.compile(r"^(?P<op>\+{0,2}|~)(?P<key>[\w.@/-]+)=(?P<value>.*)$")


def _sniff_config(name: str, head: bytes) -> bool:
    return name == "config.yaml" and bool(ROOT_KEY.search(head))


def _sniff_overrides(name: str, head: bytes) -> bool:
    return name == "overrides.yaml" and (head.lstrip().startswith(b"- ") or head.strip() == b"[]")


def _load(path: Path, rel: str, result: FileResult) -> Any:
    with open_binary(path) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        result.warnings.append(f"{rel}: larger than {MAX_BYTES // 2**20} MiB; not read as a Hydra config")
        return None
    try:
        return yaml.safe_load(data.decode("utf-8", "replace"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        result.warnings.append(f"{rel}: not valid YAML{where}; the config it holds was not read")
        return None


def _unresolved(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _read_config(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    tree = _load(path, rel, result)
    if not isinstance(tree, dict):
        return result
    flat = flatten({str(k): v for k, v in tree.items()})
    result.config = {k: v for k, v in flat.items() if not _unresolved(v)}
    result.lines = len(flat)
    result.note = f"{len(result.config)} config keys"
    return result


def _read_overrides(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    items = _load(path, rel, result)
    if not isinstance(items, list):
        return result
    for item in items:
        m = OVERRIDE.match(str(item).strip())
        if not m or m["op"] == "~":  # `~key` deletes a key: nothing to record
            continue
        try:
            value = yaml.safe_load(m["value"]) if m["value"] else None
        except yaml.YAMLError:
            value = m["value"]
        if not _unresolved(value):
            result.config[m["key"]] = value
    result.lines = len(items)
    result.note = f"{len(result.config)} command-line overrides"
    return result


FILE_SOURCES = [
    FileSource("hydra_config", _sniff_config, _read_config),
    FileSource("hydra_overrides", _sniff_overrides, _read_overrides),
]
