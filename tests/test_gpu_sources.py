"""GPU sampling and dump formats: nvidia-smi dmon, dcgm-exporter text, into series and environment."""

from __future__ import annotations

import polars as pl

from forensics.pipeline import analyze
from tests.conftest import FIXTURES

GPU = FIXTURES / "gpu"  # dmon.txt: `-s pucvmet` rows as in mozilla/DeepSpeech#178, header repeated;
# dcgm_metrics.prom: dcgm-exporter's exposition template (render_metrics.go) with values from its README


def _values(a, metric: str) -> dict[int, list[float]]:
    rows = a.series.filter(pl.col("metric") == metric).sort("rank")
    out: dict[int, list[float]] = {}
    for rank, value in rows.select("rank", "value").iter_rows():
        out.setdefault(rank, []).append(value)
    return out


def test_dmon_rows_become_per_gpu_samples_and_dashes_are_skipped():
    a = analyze([GPU / "dmon.txt"])
    assert [f.kind for f in a.files] == ["nvidia_smi_dmon"]
    assert _values(a, "gpu/memory_used_mib") == {0: [11651.0, 11700.0], 1: [300.0]}
    assert _values(a, "gpu/util_pct") == {0: [25.0, 26.0]}  # GPU 1 printed `-`
    assert _values(a, "gpu/power_w")[1] == [45.0]
    assert a.environment["gpu_count"] == 2
    assert a.warnings == []


def test_dcgm_exporter_scrape():
    a = analyze([GPU / "dcgm_metrics.prom"])
    assert [f.kind for f in a.files] == ["dcgm_exporter"]
    assert _values(a, "gpu/memory_used_mib") == {0: [70123.0], 1: [1200.0]}
    assert _values(a, "gpu/sm_clock_mhz") == {0: [139.0]}
    assert a.series.filter(pl.col("metric") == "dcgm/dcgm_fi_dev_memory_temp").is_empty()  # blank sentinel
    assert a.environment["gpu_names"] == ["NVIDIA H100 80GB HBM3"]
    assert a.environment["hosts"] == ["node7"]
    assert a.environment["gpu_memory_total_mib"] == 80559.0  # used + free
    xid = a.events.filter(pl.col("kind") == "xid")
    assert xid.select("rank", "host").row(0) == (1, "node7")
    assert '"xid": 79' in xid["fields"][0]
