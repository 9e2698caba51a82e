"""The parts of the HTML reports, on real runs: axes, labels, evidence entries, lines read back, the series picker.

The browser test (test_browser.py) checks the pages as drawn; these check what goes into them, with the
values a real run gives: the scale a real curve gets, the words a real OOM's fields become, how a real
message printed by two files and 63 ranks is grouped, and that reading lines back stays inside the run.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil

import polars as pl
import pytest

from forensics.model import Analysis, Inconclusive
from forensics.pipeline import analyze
from forensics.report import source_lines
from forensics.report.batch_html import render_batch_html
from forensics.report.evidence import evidence_entries, finding_anchors, traceback_frames
from forensics.report.figures import _per_rank, plots
from forensics.report.html import render_html
from forensics.report.labels import fact_rows, field_value, rank_ranges
from forensics.report.scales import thin, value_axis
from forensics.report.series_data import MAX_VALUES, series_catalogue
from tests.conftest import REPO

RUNS = REPO / "tests" / "fixtures" / "runs"
EXAMPLE = REPO / "examples" / "oom_then_timeout"


@pytest.fixture(scope="module")
def example() -> Analysis:
    return analyze([EXAMPLE])


def _values(run: str, metric: str) -> list[float]:
    return _per_rank(analyze([RUNS / run]).series, metric).get_column("value").to_list()


# --- axes ------------------------------------------------------------------------------------------------


def test_a_stalled_step_among_fast_ones_gets_a_log_axis():
    """stall_timeout_fr: steps of 0.03 s, then one of 90 s while a rank hung; linear would flatten the rest."""
    assert value_axis(_values("stall_timeout_fr", "timing_s/step")) == {"type": "log"}


def test_a_reward_that_climbs_from_near_zero_stays_linear_but_one_that_collapses_is_logarithmic():
    assert value_axis(_values("collective_mismatch", "critic/score/mean")) == {}  # 0.0007 rising to 0.85
    assert value_axis(_values("nan_injection", "critic/score/mean")) == {"type": "log"}  # 0.85 down to 0.0002


def test_step_time_noise_of_one_percent_does_not_fill_the_panel():
    values = _values("ray_healthy", "timing_s/step")  # 0.509 to 0.516 s
    low, high = value_axis(values)["range"]
    assert low < min(values) and high > max(values)
    assert (high - low) == pytest.approx(0.05 * max(values))
    assert value_axis(_values("lr_divergence", "actor/pg_loss")) == {}  # a real climb keeps plotly's fit


def test_a_constant_learning_rate_is_a_flat_line_mid_panel_on_a_positive_axis():
    low, high = value_axis(_values("ray_healthy", "actor/lr"))["range"]
    assert 0 < low < 1e-6 < high and (1e-6 - low) == pytest.approx(high - 1e-6)


def test_thinning_keeps_the_spike_and_both_ends():
    ys = [1.0] * 10_000
    ys[7_777] = 500.0
    xs, kept = thin(list(range(10_000)), ys, cap=600)
    assert len(xs) <= 700 and 7_777 in xs and xs[0] == 0 and xs[-1] == 9_999 and max(kept) == 500.0


# --- labels ----------------------------------------------------------------------------------------------


def test_rank_lists_read_as_ranges():
    assert rank_ranges([r for r in range(64) if r != 41]) == "0–63 except 41"
    assert rank_ranges([15, 0, 1, 2, 3, 8, 12, 13, 14, None]) == "0–3, 8, 12–15"
    assert rank_ranges([5]) == "5" and rank_ranges([]) == "" and rank_ranges([0, 2]) == "0, 2"


def test_the_oom_fields_become_labels_and_units(example):
    rows = dict(fact_rows(example.verdict.root_cause.fields))
    assert rows["Tried to allocate"] == "18.55 GiB" and rows["In use by this process"] == "132.00 GiB"
    assert rows["GPU"] == "1" and rows["Kind of OOM"] == "exhaustion"
    assert not {"raised_at", "rules", "exception_message"} & set(rows)  # plumbing and repeats left out
    assert all("{" not in v and "'" not in v for v in rows.values())  # no Python reprs
    watchdog = next(f for f in example.findings if f.rule == "nccl-watchdog-timeout")
    shown = dict(fact_rows(watchdog.fields))
    assert shown["Timeout"] == "30 s" and shown["Ran for"] == "30 s"
    assert shown["Stalled since"] == "2026-11-30 05:17:22.718 UTC"
    assert field_value("raised_at", example.verdict.root_cause.fields["raised_at"]) == (
        "/srv/train/scripts/capture/train.py:252 in main"
    )


# --- evidence --------------------------------------------------------------------------------------------


def test_one_entry_per_message_with_both_files_the_traceback_and_commands(example):
    view = evidence_entries(example)
    first = view.entries[0]
    assert first["root"] and first["text"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert first["count"] == 2 and first["ranks"] == [1]
    assert [(f["file"], [p["line"] for p in f["lines"]]) for f in first["files"]] == [
        ("driver.log", [189]),
        ("torchrun_logs/none_2ia4957z/attempt_0/1/stderr.log", [6]),
    ]
    assert (first["file"], first["line"]) == ("torchrun_logs/none_2ia4957z/attempt_0/1/stderr.log", 6)
    assert first["first_seen"] == "2026-11-30T05:17:21.549618Z"
    (frame,) = first["frames"]
    assert (frame["file"], frame["line"], frame["func"], frame["raise_site"]) == (
        "/srv/train/scripts/capture/train.py", 252, "main", True,
    )  # fmt: skip
    assert frame["code"].startswith("logits_cache.append(torch.empty(2, 16384")
    around = {c["line"]: c for c in first["context"]}
    assert around[6]["hit"] and around[2]["text"] == "Traceback (most recent call last):" and 9 in around
    path = str(EXAMPLE / "torchrun_logs/none_2ia4957z/attempt_0/1/stderr.log")
    assert [c["text"] for c in first["commands"]] == [f"less +6 {path}", f"lnav -c ':goto 6' {path}", f"vim +6 {path}"]
    assert view.anchor_of["driver.log:189"] == "evidence-1"
    assert first["findings"][0]["anchor"] in finding_anchors(example.findings)


def test_a_flood_of_one_assertion_is_one_entry_with_its_count():
    a = analyze([RUNS / "device_assert"])
    first = evidence_entries(a).entries[0]
    assert "vectorized_gather_kernel" in first["text"] and first["count"] == 256
    assert {f["file"] for f in first["files"]} == {"driver.log", "torchrun_logs/none_9fx0eas3/attempt_0/0/stderr.log"}
    assert first["first_seen"] == "2026-11-30T05:21:06.546402Z" and first["last_seen"] == "2026-11-30T05:21:06.546799Z"


def test_frames_are_read_from_the_ranks_own_lines_in_an_interleaved_log():
    """driver.log interleaves rank 0's step lines with rank 1's traceback ([default0]: / [default1]:)."""
    lines = dict(enumerate((EXAMPLE / "driver.log").read_text(encoding="utf-8").splitlines(), start=1))
    frames = traceback_frames(lines, 189)
    assert [(f["file"], f["line"], f["raise_site"]) for f in frames] == [
        ("/srv/train/scripts/capture/train.py", 252, True)
    ]


def test_a_binary_dump_is_cited_but_never_shown_as_lines(example):
    dumps = [e for e in evidence_entries(example).entries if e["file"].startswith("fr/")]
    assert dumps and all(e["context"] == [] and e["commands"] == [] for e in dumps)


# --- lines read back --------------------------------------------------------------------------------------


def test_lines_are_read_back_only_from_inside_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "worker.log").write_text("one\ntwo\nthree\n")
    secret = tmp_path / "outside.log"
    secret.write_text("not for the report\n")
    os.symlink(secret, run / "escape.log")
    with gzip.open(run / "old.log.gz", "wt") as fh:
        fh.write("".join(f"line {n}\n" for n in range(1, 1001)))
    windows = source_lines.read_windows(
        str(run), {"worker.log": [2, 3, 4], "escape.log": [1], "gone.log": [1], "old.log.gz": [999]}
    )
    assert windows["worker.log"].lines == {2: "two", 3: "three"}
    assert windows["escape.log"].lines == {} and "out of the run folder" in windows["escape.log"].note
    assert windows["gone.log"].lines == {} and windows["gone.log"].note
    assert windows["old.log.gz"].lines == {999: "line 999"}  # through the same decompression as the analysis


def test_reading_back_stops_at_its_budget_and_cuts_long_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "big.log").write_text("x" * 5000 + "\n" + "short\n" * 300_000)
    windows = source_lines.read_windows(str(run), {"big.log": [1, 299_000]}, budget_bytes=64 * 1024)
    big = windows["big.log"]
    assert len(big.lines[1]) == source_lines.MAX_LINE_CHARS and big.lines[1].endswith("…")
    assert 299_000 not in big.lines and "past the first" in big.note


def test_a_run_moved_after_the_analysis_still_renders(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run)
    a = analyze([run])
    shutil.rmtree(run)
    first = evidence_entries(a).entries[0]
    assert first["context"] == [] and first["context_note"] == "the run is no longer where it was analysed"
    assert "Lines around not shown" in render_html(a)


# --- plots and the picker ---------------------------------------------------------------------------------


def test_the_verdict_plots_come_first_and_name_their_metric(example):
    shown = plots(example)
    verdict = [p for p in shown if p.verdict]
    assert [p.metrics for p in verdict][:2] == [("perf/max_memory_allocated_gb",), ("perf/max_memory_reserved_gb",)]
    assert shown[0].verdict and {p.section for p in shown[: len(verdict)]} == {"verdict"}
    gpu = next(p for p in shown if p.id == "metric-gpu-memory-used-mib")
    assert [t.name for t in gpu.figure.data] == ["GPU 0", "GPU 1", "OOM (held by the process)"]  # ranks in order
    timeline = next(p for p in shown if p.id == "timeline").figure
    assert list(timeline.layout.yaxis.categoryarray) == ["rank 1", "rank 0"]  # rank 0 on top
    assert timeline.layout.xaxis.range == gpu.figure.layout.xaxis.range  # one time axis
    root_ts = example.verdict.root_cause.ts
    for fig in (gpu.figure, timeline):  # the failure marked on every wall-clock plot
        marks = [s for s in fig.layout.shapes if s.type == "line" and s.line.dash == "dash"]
        assert [m.x0 for m in marks] == [root_ts]
    steps = {p.figure.layout.xaxis.range for p in shown if p.metrics and p.metrics[0] in _STEP_METRICS}
    assert steps == {(0.5, 12.5)}  # one step axis, to the failure at step 12


def test_a_class_has_one_colour_in_the_timeline_the_batch_index_and_the_chips(example):
    from forensics.report.batch_html import classes_over_time
    from forensics.report.colours import class_colour

    timeline = next(p for p in plots(example) if p.id == "timeline").figure
    oom = next(t for t in timeline.data if t.name == "CUDA out of memory")
    fleet = pl.DataFrame({"class": ["cuda_oom"], "status": ["failed"], "started": [example.verdict.root_cause.ts]})
    bars = classes_over_time(fleet.with_columns(pl.lit(None, pl.Datetime("us", "UTC")).alias("modified")))
    assert oom.marker.color == bars.data[0].marker.color == class_colour("cuda_oom") == "#d62728"
    assert 'style="--c: #d62728"' in render_html(example)


_STEP_METRICS = ("actor/pg_loss", "actor/entropy", "perf/max_memory_allocated_gb", "timing_s/step")


def test_the_picker_offers_every_series_within_its_budget(example):
    catalogue = series_catalogue(example.series)
    names = [m["name"] for m in catalogue["metrics"]]
    assert names == sorted(example.series.get_column("metric").unique().to_list())
    power = next(m for m in catalogue["metrics"] if m["name"] == "gpu/power_w")
    assert power["x"] == "time" and [t["name"] for t in power["traces"]] == ["GPU 0", "GPU 1"]
    many = pl.concat([example.series.with_columns(pl.col("metric") + f"/copy{i}") for i in range(400)])
    big = series_catalogue(many)  # 8,400 series, 920,000 samples
    kept = sum(len(t["x"]) for m in big["metrics"] for t in m["traces"])
    assert kept <= MAX_VALUES and big["names_only"] and len(big["metrics"]) + len(big["names_only"]) == 400 * 21


# --- statuses ---------------------------------------------------------------------------------------------


def test_an_inconclusive_verdict_has_its_own_colour_in_the_incident_and_batch_reports(tmp_path):
    a = analyze([RUNS / "healthy"])
    a.verdict = dataclasses.replace(
        a.verdict,
        status="inconclusive",
        summary="Nothing could be read.",
        reason=Inconclusive("unreadable", "No file of the run could be read."),
    )
    page = render_html(a)
    assert 'class="badge inconclusive"' in page and 'class="verdict inconclusive-box"' in page
    assert "No verdict: unreadable" in page and ".badge.inconclusive { background: var(--unknown)" in page
    fleet = pl.DataFrame(
        [{"run": "r1", "status": "inconclusive", "summary": "no training output"}, {"run": "r2", "status": "failed"}]
    )
    from forensics.fleet import FLEET_SCHEMA

    full = pl.DataFrame([{k: row.get(k) for k in FLEET_SCHEMA} for row in fleet.to_dicts()], schema=FLEET_SCHEMA)
    index = render_batch_html(full)
    assert '<span class="badge inconclusive">inconclusive</span>' in index


def test_a_large_cluster_keeps_its_dead_actors_in_view_and_folds_the_rest():
    a = analyze([RUNS / "ray_node_died"])
    quiet = [{**x, "state": "stopped", "why": None, "name": f"idle-{i}"} for i, x in enumerate(a.ray["actors"] * 10)]
    a.ray = {**a.ray, "actors": a.ray["actors"] + quiet}
    page = render_html(a)
    section = page[page.index('id="ray"') :]
    shown, folded = section.split('id="ray-actors-quiet"', 1)
    assert "more actors with no failure logged" in shown and shown.count("sev-error") >= 2
    assert "idle-0" in folded and "idle-0" not in shown
