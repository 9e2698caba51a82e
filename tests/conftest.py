from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
CORPUS = next(
    (base / "shared" / "corpus" / "public-issues" for base in REPO.parents if (base / "shared" / "corpus").is_dir()),
    REPO.parent / "shared" / "corpus" / "public-issues",
)  # ../shared beside the main checkout, or higher up for a worktree


def corpus_cases() -> list[dict[str, str]]:
    manifest = CORPUS / "manifest.csv"
    if not manifest.is_file():
        return []
    with manifest.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip("the public-issues corpus (../shared) is not beside this checkout")
    return CORPUS
