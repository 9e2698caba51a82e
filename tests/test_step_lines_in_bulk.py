"""verl step lines read in bulk (polars) give exactly what the line-by-line reader gives."""

from __future__ import annotations

import functools
import math
import re

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.line_prefixes import attribute, file_context
from forensics.pipeline import analyze, load_catalogue
from forensics.scan import TextScanner
from forensics.sources import line_extractors
from forensics.sources.base import Sink
from forensics.sources.verl import EXTRACTORS, parse_step_line, parse_value, parse_values

TRIGGER = re.compile(EXTRACTORS[0].trigger)
KEY = st.text(alphabet="abcz/_@-.0123456789", min_size=1, max_size=12).filter(lambda k: k[0] not in "-")
VALUE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"np.float64({v!r})"),
    st.sampled_from(["nan", "inf", "-inf", "True", "False", "3e-4", "1e-06", "0.000", "abc", "1_0", "1.5,", ":x"]),
)
PREFIX = st.sampled_from(
    [
        "",
        "(TaskRunner pid=222265) ",
        "\x1b[36m(TaskRunner pid=16292)\x1b[0m ",
        "(main_task pid=63313, ip=10.0.0.3) ",
        "[rank3]:",
        "[default1]:[rank1]:",
        "(raylet) ",
        "(Actor-x pid=7) ",  # a name the bulk reader leaves to the line reader
        "2025-10-16 02:08:01,120 ",  # a time: left to the line reader
        # wrappers `attribute` peels too (left to the line reader), and colour codes that lost their ESC
        "[1,3]<stderr>: (TaskRunner pid=1) ",
        "> (TaskRunner pid=1) ",
        "12: ",
        "node7: [rank2]:",
        "[80746] ",
        "2025-10-16T02:08:01.120Z ",
        "[36m(TaskRunner pid=16292)[0m ",
        "[rank1]:[rank1]:[rank1]:[rank1]:[rank1]:[rank1]:[rank2]:",  # past the six prefixes `attribute` peels
    ]
)
SUFFIX = st.sampled_from(["", " ", " [repeated 2x across cluster]", " - oddkey with space:1", " - a:b:1"])


@st.composite
def step_lines(draw) -> str:
    pairs = draw(st.lists(st.tuples(KEY, VALUE), min_size=1, max_size=12))
    body = f"step:{draw(st.integers(0, 10**6))}" + "".join(f" - {k}:{v}" for k, v in pairs)
    return draw(PREFIX) + body + draw(SUFFIX)


def _line_by_line(lines: list[str], rel: str) -> list[tuple]:
    """The samples `_handle_step` makes of each line (no line here continues another)."""
    fctx = file_context(rel)
    out = []
    for line in lines:
        if not TRIGGER.search(line):
            continue
        ctx = attribute(line, fctx)
        parsed = parse_step_line(ctx.body)
        if parsed is None:
            continue
        step, metrics = parsed
        out += [(key, step, ctx.rank, _value(value)) for key, value in metrics.items()]
    return sorted(out, key=repr)


@functools.cache
def _scanner() -> TextScanner:
    return TextScanner(load_catalogue([]).rules, line_extractors())


def _scanned(tmp_path, lines: list[str], rel: str) -> list[tuple]:
    path = tmp_path / "x.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sink = Sink()
    _scanner().scan(path, rel, sink)
    series = sink.series()
    rows = series.select("metric", "step", "rank", "value").rows()
    return sorted(((m, s, r, _value(v)) for m, s, r, v in rows), key=repr)


def _value(v: float) -> object:
    return "nan" if math.isnan(v) else v


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(step_lines(), min_size=1, max_size=30))
def test_bulk_and_line_by_line_readers_give_the_same_samples(tmp_path, lines):
    for rel in ("driver.log", "torchrun_logs/r/attempt_0/5/stderr.log"):
        assert _scanned(tmp_path, lines, rel) == _line_by_line(lines, rel)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(VALUE, st.text(alphabet="0123456789.eE+-naifty_ ,()np", max_size=12)))
def test_polars_reads_a_value_as_parse_value_does(raw):
    got = parse_values(pl.Series([raw], dtype=pl.String))[0]
    want = parse_value(raw)
    assert (got is None and want is None) or _value(got) == _value(want)


def test_full_precision_numpy_scalars_and_small_exponents_are_kept(tmp_path):
    line = (
        "(TaskRunner pid=222265) step:34 - actor/pg_loss:np.float64(0.042396901015308686) - actor/lr:3e-4"
        " - actor/ppo_kl:-8.163164312320433e-06 - actor/grad_norm:nan - training/epoch:0 - actor/lr:3e-06"
    )
    got = {m: v for m, _, _, v in _scanned(tmp_path, [line], "driver.log")}
    assert got == {
        "actor/pg_loss": 0.042396901015308686,
        "actor/lr": 3e-06,  # printed twice: the last one, as a dict of the line would keep
        "actor/ppo_kl": -8.163164312320433e-06,
        "actor/grad_norm": "nan",
        "training/epoch": 0.0,
    }


def test_a_hard_wrapped_step_line_is_still_joined(tmp_path):
    lines = ["(TaskRunner pid=1) step:3 - actor/pg_loss:0.1 - critic", "(TaskRunner pid=1) /rewards/min:-1.0"]
    got = _scanned(tmp_path, lines, "driver.log")
    assert got == [("actor/pg_loss", 3, None, 0.1), ("critic/rewards/min", 3, None, -1.0)]


def test_a_rest_wrapped_behind_another_prefix_is_still_joined(tmp_path):
    """The bulk reader leaves a step line whose next line may be its rest to the line reader, whatever prefixes
    `attribute` would peel off that next line (here a quoted paste's `> `)."""
    lines = ["(TaskRunner pid=1) step:3 - actor/pg_loss:0.1", "> (TaskRunner pid=1) - critic/score:0.5"]
    got = _scanned(tmp_path, lines, "driver.log")
    assert got == [("actor/pg_loss", 3, None, 0.1), ("critic/score", 3, None, 0.5)]


def test_a_diverged_run_keeps_its_nan_finding_and_every_sample_on_long_lines(tmp_path):
    """NaN on 2,900 long step lines: the rule reads each of them, none is switched off (it was, past 10 s)."""
    keys = [f"actor/metric_{i}/mean" for i in range(148)]

    def line(step: int) -> str:
        loss = "np.float64(nan)" if step >= 100 else f"np.float64({0.1 / step!r})"
        values = " - ".join(f"{k}:{step * 0.7714697429563925 + i!r}" for i, k in enumerate(keys))
        return f"(TaskRunner pid=222265) step:{step} - {values} - actor/pg_loss:{loss} - actor/lr:3e-06"

    run = tmp_path / "run"
    run.mkdir()
    (run / "driver.log").write_text("\n".join(line(step) for step in range(1, 3001)) + "\n")
    a = analyze([run])
    assert not [w for w in a.warnings if "switched off" in w]
    nan = [f for f in a.findings if f.rule == "non-finite-loss"]
    assert sum(f.count for f in nan) == 2901
    assert nan[0].evidence[0].line == 100 and nan[0].fields["step"] == 100
    assert a.series.height == 3000 * 150
    lr = a.series.filter(pl.col("metric") == "actor/lr")["value"].unique().to_list()
    assert lr == [3e-06]
