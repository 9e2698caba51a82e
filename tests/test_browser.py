"""The reports in a real browser: headless Chromium (Debian's package) opens each offline at 1400 and 420 px.

Chromium is driven over the DevTools protocol (tests/cdp.py): every console message, uncaught exception and
CSP violation of the page is collected, and the page is measured where it is laid out, not in its source.
For the incident, batch and diff reports at both widths: every plot is drawn, the metric the verdict is about
is plotted (with data), every in-page link has its anchor and every finding and evidence entry has one, the
page does not overflow sideways, "What to change" is on the first screen, and nothing was logged. The
interactive parts are used once (sorting, filtering, the series picker), and the dark and print looks are
checked. Screenshots of each page and width are kept under tests/artifacts/browser/ (git-ignored) for a
person to look at.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import main
from tests.cdp import Browser
from tests.conftest import REPO

CUDA_ERROR = """Traceback (most recent call last):
  File "/workspace/verl/verl/trainer/main_ppo.py", line 64, in main
    run_ppo(config)
RuntimeError: CUDA error: an illegal memory access was encountered"""
FIXTURES = REPO / "tests" / "fixtures" / "runs"
EXAMPLE = REPO / "examples" / "oom_then_timeout"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / "tests" / "artifacts" / "browser"
REPORT_LIMIT_BYTES = 5 * 1024**2
WIDTHS = (1400, 420)
SCREEN_HEIGHT = 900

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it with apt)")

# what each page must show: the metrics plotted as the verdict's (None: a page with no verdict metric)
VERDICT_METRICS = {
    "incident_oom": ["perf/max_memory_allocated_gb", "gpu/memory_used_mib"],
    "incident_divergence": ["actor/pg_loss"],
    "planted_markup": ["perf/max_memory_allocated_gb"],
    "no_plots": None,
    "batch": None,
    "diff": ["perf/max_memory_allocated_gb"],
}


def _planted_run(tmp_path: Path) -> Path:
    """The bundled example with markup and a script-closing tag in an evidence line, a file name and a metric."""
    run = tmp_path / "planted"
    shutil.copytree(EXAMPLE, run)
    driver = run / "driver.log"
    text = driver.read_text(encoding="utf-8")
    oom = next(line for line in text.splitlines() if "torch.OutOfMemoryError" in line)
    payload = '</script><script>document.body.dataset.pwned="1"</script><img src=x onerror=document.title="pwned">'
    driver.write_text(text.replace(oom, f"{oom} {payload}\nstep:1 - <img src=x onerror=alert(1)>:0.5", 1))
    driver.rename(driver.with_name("driver<img src=x onerror=alert(1)>.log"))
    return run


def _no_plot_run(tmp_path: Path) -> Path:
    """A crash with no metric and no number to plot: the page has no plotly at all."""
    run = tmp_path / "no_plots"
    run.mkdir()
    (run / "worker.log").write_text(f"starting\n{CUDA_ERROR}\n")
    return run


def _incident(run_of: Callable[[Path], Path]) -> Callable[[Path], tuple[Path, dict]]:
    def render(tmp_path: Path) -> tuple[Path, dict]:
        page, doc = tmp_path / "report.html", tmp_path / "report.json"
        result = CliRunner().invoke(main, ["analyze", str(run_of(tmp_path)), "-o", str(page), "--json", str(doc), "-q"])
        assert result.exit_code == 0, result.output
        return page, json.loads(doc.read_text(encoding="utf-8"))

    return render


def _batch(tmp_path: Path) -> tuple[Path, dict]:
    runs = [str(FIXTURES / name) for name in ("sigkill", "leak_oom", "healthy")]
    result = CliRunner().invoke(main, ["batch", *runs, "--out", str(tmp_path / "fleet"), "--jobs", "1", "-q"])
    assert result.exit_code == 0, result.output
    return tmp_path / "fleet" / "index.html", {}


def _diff(tmp_path: Path) -> tuple[Path, dict]:
    page = tmp_path / "diff.html"
    args = ["diff", str(FIXTURES / "leak_oom"), str(FIXTURES / "healthy"), "-o", str(page), "--json", "-", "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return page, json.loads(result.output)


INCIDENTS = ("incident_oom", "incident_divergence", "planted_markup", "no_plots")
PAGES = {
    "incident_oom": _incident(lambda tmp_path: EXAMPLE),
    "incident_divergence": _incident(lambda tmp_path: FIXTURES / "lr_divergence"),
    "planted_markup": _incident(_planted_run),
    "no_plots": _incident(_no_plot_run),
    "batch": _batch,
    "diff": _diff,
}


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    with Browser(CHROMIUM, tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    return {name: render(tmp_path_factory.mktemp(name)) for name, render in PAGES.items()}


def _load(browser: Browser, page: Path, width: int, dark: bool = False) -> None:
    browser.problems.clear()
    browser.open(page.as_uri(), width, SCREEN_HEIGHT, dark=dark)
    browser.wait_for("document.body.dataset.reportReady === '1'")
    if browser.evaluate("!!document.getElementById('plotly-gz')"):
        browser.wait_for("document.body.dataset.plotsReady === '1'")


def _shot(browser: Browser, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    browser.screenshot(shot)
    assert shot.stat().st_size > 20_000  # a PNG of a rendered page, not a blank one
    return shot


UNDRAWN_PLOTS = (
    "Array.from(document.querySelectorAll('div.plot')).filter(d => !d.querySelector('svg.main-svg')).map(d => d.id)"
)
BROKEN_LINKS = """Array.from(document.querySelectorAll('a[href^="#"]'))
  .map(a => decodeURIComponent(a.getAttribute('href').slice(1))).filter(id => !document.getElementById(id))"""
DRAWN_WITH_DATA = """(metric) => Array.from(document.querySelectorAll('div.plot[data-verdict="1"]'))
  .filter(d => (d.dataset.metric || '').split(' | ').includes(metric))
  .some(d => (d.data || []).some(t => (t.y || t.x || []).filter(v => v !== null).length >= 2))"""


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(PAGES))
def test_report_opens_offline_draws_its_plots_and_logs_nothing(browser, pages, name, width):
    page, doc = pages[name]
    assert page.stat().st_size < REPORT_LIMIT_BYTES
    _load(browser, page, width)

    assert browser.problems == []
    assert browser.evaluate("document.body.dataset.pwned") is None
    assert browser.evaluate("document.title") != "pwned"
    plots = browser.evaluate("document.querySelectorAll('div.plot').length")
    if name == "no_plots":
        assert plots == 0 and browser.evaluate("document.querySelector('svg.main-svg')") is None
    else:
        assert plots >= 2
        assert browser.evaluate(UNDRAWN_PLOTS) == []
    for metric in VERDICT_METRICS[name] or []:
        assert browser.evaluate(f"({DRAWN_WITH_DATA})({json.dumps(metric)})"), metric
    assert browser.evaluate(BROKEN_LINKS) == []
    assert browser.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling of the page
    if name in INCIDENTS:
        _verdict_first_and_anchored(browser, doc)
    _shot(browser, f"{name}-{width}")


def _verdict_first_and_anchored(browser: Browser, doc: dict) -> None:
    """An incident report: "What to change" on the first screen, an anchor per finding and evidence entry."""
    remediation = doc["verdict"]["root_cause"]["remediation"]
    fix_top = browser.evaluate("document.getElementById('what-to-change').getBoundingClientRect().top")
    assert 0 < fix_top < SCREEN_HEIGHT - 60  # its heading and first line without scrolling
    shown = browser.evaluate("Array.from(document.querySelectorAll('#what-to-change li')).map(li => li.textContent)")
    assert shown == remediation
    anchors = browser.evaluate("Array.from(document.querySelectorAll('#findings-table tbody tr')).map(r => r.id)")
    assert len(anchors) == len(doc["findings"]) and all(a.startswith("finding-") for a in anchors)
    assert len(set(anchors)) == len(anchors)
    entries = browser.evaluate("Array.from(document.querySelectorAll('article.ev')).map(a => a.id)")
    assert entries and entries[0] == "evidence-1"
    toc = browser.evaluate("Array.from(document.querySelectorAll('nav.toc a')).map(a => a.getAttribute('href'))")
    assert {"#verdict", "#what-to-change", "#evidence", "#findings", "#files"} <= set(toc)
    assert browser.evaluate("document.getElementById('run-path').textContent") == doc["run"]["path"]
    # the root cause's evidence entry: one of its lines, the lines around it and commands that open it
    cited = {(e["file"], e["line"]) for e in doc["verdict"]["root_cause"]["evidence"]}
    where = browser.evaluate("(e => [e.dataset.file, Number(e.dataset.line)])(document.getElementById('evidence-1'))")
    assert tuple(where) in cited
    hit = browser.evaluate("document.querySelector('#evidence-1 pre.context .hit .ln')?.textContent")
    assert hit == str(where[1])
    assert browser.evaluate("document.querySelectorAll('#evidence-1 pre.context > span').length") > 1
    commands = browser.evaluate(
        "Array.from(document.querySelectorAll('#evidence-1 .cmds button.copy')).map(b => b.dataset.copy)"
    )
    assert [c.split()[0] for c in commands] == ["less", "lnav", "vim"]


def test_the_oom_report_shows_the_traceback_and_every_rank_of_a_message(browser, pages):
    page, _ = pages["incident_oom"]
    _load(browser, page, 1400)
    frames = browser.evaluate(
        "Array.from(document.querySelectorAll('#evidence-1 ol.frames li')).map(li => li.textContent)"
    )
    raise_site = browser.evaluate("document.querySelector('#evidence-1 ol.frames li.raise').textContent")
    assert frames and raise_site == frames[-1] and "train.py:252 in main" in raise_site
    meta = browser.evaluate("document.querySelector('#evidence-1 dl.ev-meta').textContent")
    assert "rank 1" in meta and "driver.log" in meta and "stderr.log" in meta  # one message, two files
    assert browser.evaluate("document.querySelector('#evidence-1 .count').textContent") == "×2"
    facts = browser.evaluate("document.querySelector('#verdict dl.facts').textContent")
    assert "Tried to allocate18.55 GiB" in facts.replace("\n", "") and "tried" not in facts
    assert "{" not in facts and "[" not in facts  # no Python reprs


def test_tables_sort_and_filter_and_the_picker_plots_any_series(browser, pages):
    page, _ = pages["incident_oom"]
    _load(browser, page, 1400)
    ranks = "Array.from(document.querySelectorAll('#findings-table tbody tr')).map(r => r.cells[3].textContent)"
    browser.evaluate("document.querySelectorAll('#findings-table th')[3].click()")
    ascending = browser.evaluate(ranks)
    assert ascending == sorted(ascending)
    browser.evaluate("document.querySelectorAll('#findings-table th')[3].click()")
    assert browser.evaluate(ranks) == sorted(ascending, reverse=True)
    browser.evaluate(
        "(() => { const i = document.querySelector('input[data-filter=\"files-table\"]');"
        " i.value = 'stderr'; i.dispatchEvent(new Event('input')); })()"
    )
    rows = "Array.from(document.querySelectorAll('#files-table tbody tr'))"
    visible = browser.evaluate(f"{rows}.filter(r => !r.hidden).map(r => r.cells[0].textContent)")
    assert visible and all("stderr" in path for path in visible)
    browser.evaluate(
        "(() => { const i = document.getElementById('series-filter'); i.value = 'power';"
        " i.dispatchEvent(new Event('input')); })()"
    )
    buttons = "Array.from(document.querySelectorAll('#series-list button'))"
    offered = browser.evaluate(f"{buttons}.filter(b => !b.parentElement.hidden).map(b => b.textContent)")
    assert offered == ["gpu/power_w"]
    browser.evaluate("document.querySelector('#series-list li:not([hidden]) button').click()")
    browser.wait_for("document.querySelector('#series-chosen .plot svg.main-svg') !== null")
    assert browser.evaluate("document.querySelector('#series-chosen .plot').dataset.metric") == "gpu/power_w"
    assert browser.evaluate("document.querySelector('#series-chosen .plot').data.length") == 2  # one trace per GPU
    assert browser.problems == []


@pytest.mark.parametrize("name", ["incident_oom", "batch", "diff"])
def test_dark_and_print_looks(browser, pages, name):
    page, _ = pages[name]
    _load(browser, page, 1400, dark=True)
    background = browser.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(12, 17, 29)"
    paper = browser.evaluate("document.querySelector('div.plot')._fullLayout.paper_bgcolor")
    assert paper in ("#161b26", "rgb(22, 27, 38)")
    _shot(browser, f"{name}-dark")
    browser.print_media(True)
    try:
        assert browser.evaluate("getComputedStyle(document.querySelector('nav.toc')).display") == "none"
        assert browser.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"
        _shot(browser, f"{name}-print")
    finally:
        browser.print_media(False)
    assert browser.problems == []


def test_the_batch_index_sorts_and_filters_its_runs(browser, pages):
    page, _ = pages["batch"]
    _load(browser, page, 1400)
    runs = "Array.from(document.querySelectorAll('#runs-table tbody tr')).filter(r => !r.hidden)"
    names = f"{runs}.map(r => r.cells[0].textContent.trim())"
    assert browser.evaluate(names)[-1] == "healthy"  # failures first
    browser.evaluate("document.querySelectorAll('#runs-table th')[0].click()")
    assert browser.evaluate(names) == ["healthy", "leak_oom", "sigkill"]
    browser.evaluate(
        "(() => { const i = document.querySelector('input[data-filter=\"runs-table\"]'); i.value = 'out of memory';"
        " i.dispatchEvent(new Event('input')); })()"
    )
    assert browser.evaluate(names) == ["leak_oom"]
    assert browser.evaluate("document.querySelector('[data-count-for=\"runs-table\"]').textContent") == "1 of 3"
    link = browser.evaluate(f"{runs}[0].querySelector('a').getAttribute('href')")
    assert (page.parent / link).is_file()  # the run's own report
    assert browser.problems == []
