"""Ways through the series table (ts, step, rank, source, metric, value) that keep one copy of its samples."""

from __future__ import annotations

import numpy as np
import polars as pl


def where(frame: pl.DataFrame, condition: pl.Expr) -> pl.DataFrame:
    """The rows that meet `condition`; the frame itself when all do (a filter would copy every column)."""
    mask = frame.select(condition.fill_null(False)).to_series()
    return frame if mask.all() else frame.filter(mask)


def rows_by_metric(frame: pl.DataFrame) -> list[tuple[str, np.ndarray]]:
    """(metric, the indexes of its rows in table order) for each metric in name order, from one sort of the
    metric codes: a metric's rows can then be taken one metric at a time (`frame[rows]`), where grouping
    all of them at once keeps every sample twice."""
    metric = frame.get_column("metric")
    if metric.is_empty():
        return []
    codes = metric.cast(pl.Categorical).to_physical()
    order = codes.arg_sort().to_numpy()  # 4 bytes a row
    counts = np.bincount(codes.to_numpy())
    present = np.flatnonzero(counts)
    ends = np.cumsum(counts[present])
    starts = ends - counts[present]
    names = metric.gather(order[starts]).cast(pl.String).to_list()
    return [(name, order[a:b]) for name, a, b in sorted(zip(names, starts.tolist(), ends.tolist(), strict=True))]


def metric_codes(frame: pl.DataFrame) -> tuple[np.ndarray, dict[str, int]]:
    """The metric column as integer codes (a view of the Categorical's, 4 bytes a row) and each name's code:
    `np.flatnonzero(codes == code)` are then one metric's rows, found without sorting the table."""
    metric = frame.get_column("metric").cast(pl.Categorical)
    names = metric.unique()
    codes = dict(zip(names.cast(pl.String).to_list(), names.to_physical().to_list(), strict=True))
    return metric.to_physical().to_numpy(), codes
