"""Where the bundled rules, templates and JSON Schemas live, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"none of {', '.join(map(str, candidates))} exists; is forensics installed?")


def patterns_dir() -> Path:
    return _first_existing(_PACKAGE / "_data" / "patterns", _PACKAGE.parent / "patterns")


def templates_dir() -> Path:
    return _first_existing(_PACKAGE / "_data" / "templates", _PACKAGE.parent / "reports" / "templates")


def schemas_dir() -> Path:
    return _first_existing(_PACKAGE / "_data" / "schemas", _PACKAGE.parent / "schemas")
