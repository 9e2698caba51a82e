"""Small helpers the explain rooms share."""

from __future__ import annotations


def promote(remediation: list[str], keyword: str) -> list[str]:
    """The remediation with the items that mention `keyword` moved to the front, order otherwise kept."""
    first = [r for r in remediation if keyword in r]
    return first + [r for r in remediation if keyword not in r]


def join(*parts: str) -> str:
    """Sentences joined by a space, empty ones left out."""
    return " ".join(p for p in parts if p)
