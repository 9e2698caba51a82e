"""What every explain room may read beside the finding itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from forensics.model import Finding, empty_series


@dataclass(frozen=True)
class Reading:
    """The run's metric series, and the classes a detector already saw coming (their history is told)."""

    series: pl.DataFrame = field(default_factory=empty_series)
    foretold: frozenset[str] = frozenset()

    def quotes_history(self, finding: Finding) -> bool:
        """Whether the explanation should tell how the series led here (no detector finding tells it)."""
        return finding.cls not in self.foretold
