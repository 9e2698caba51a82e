"""Validation of every JSON document forensics writes against the JSON Schemas in `schemas/`."""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from forensics.package_data import schemas_dir

BY_NAME = {
    "forensics.report/v1": "report.v1.json",
    "forensics.check/v1": "check.v1.json",
    "forensics.diff/v1": "diff.v1.json",
    "forensics.eval/v1": "eval.v1.json",
    "forensics.batch/v1": "batch.v1.json",
}


@functools.cache
def _schemas() -> tuple[dict[str, dict[str, Any]], Registry]:
    schemas = {name: json.loads((schemas_dir() / file).read_text(encoding="utf-8")) for name, file in BY_NAME.items()}
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    return schemas, registry


def validate(doc: dict[str, Any]) -> dict[str, Any]:
    """Raise with every problem (path and message) unless `doc` fits the schema it names; return it."""
    schemas, registry = _schemas()
    assert doc.get("schema") in schemas, f"unknown or missing schema key: {doc.get('schema')!r}"
    validator = Draft202012Validator(schemas[doc["schema"]], registry=registry)
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '<doc>'}: {e.message}" for e in validator.iter_errors(doc)]
    assert not problems, f"{doc['schema']}: " + "\n".join(problems[:20])
    return doc
