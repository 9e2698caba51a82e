"""The reports in a real browser: Chromium opens each offline (incident and batch), draws every plot, logs nothing.

Chromium prints every console message (errors, CSP violations, a script that threw) as a `CONSOLE` line
with `--enable-logging=stderr`; `--dump-dom` gives the page after its scripts ran, where the loader sets
`data-plots-ready="1"` on <body> once plotly drew every figure (each an SVG of class `main-svg`). A
screenshot of each report is kept under tests/artifacts/browser/ (git-ignored) for a human to look at.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import main
from tests.conftest import REPO
from tests.hostile import OOM_LINE

FIXTURES = REPO / "tests" / "fixtures" / "runs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / "tests" / "artifacts" / "browser"
REPORT_LIMIT_BYTES = 5 * 1024**2
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: no name resolves
    "--virtual-time-budget=10000",
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1280,2400",
]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it with apt)")


def _planted_run(tmp_path: Path) -> Path:
    """The bundled example with markup and a script-closing tag in an evidence line, a file name and a metric."""
    run = tmp_path / "planted"
    shutil.copytree(REPO / "examples" / "oom_then_timeout", run)
    driver = run / "driver.log"
    text = driver.read_text(encoding="utf-8")
    oom = next(line for line in text.splitlines() if "torch.OutOfMemoryError" in line)
    payload = '</script><script>document.body.dataset.pwned="1"</script><img src=x onerror=document.title="pwned">'
    driver.write_text(text.replace(oom, f"{oom} {payload}\nstep:1 - <img src=x onerror=alert(1)>:0.5", 1))
    driver.rename(driver.with_name("driver<img src=x onerror=alert(1)>.log"))
    return run


def _no_plot_run(tmp_path: Path) -> Path:
    run = tmp_path / "no_plots"
    run.mkdir()
    (run / "worker.log").write_text(f"starting\n{OOM_LINE}\n")
    return run


def _incident(run_of) -> Callable[[Path], Path]:
    def render(tmp_path: Path) -> Path:
        page = tmp_path / "report.html"
        result = CliRunner().invoke(main, ["analyze", str(run_of(tmp_path)), "-o", str(page), "-q"])
        assert result.exit_code == 0, result.output
        return page

    return render


def _batch(tmp_path: Path) -> Path:
    """The batch report; the diff report is built from the same partials (style with the CSP, plotly loader)."""
    runs = [str(FIXTURES / name) for name in ("sigkill", "leak_oom")]
    result = CliRunner().invoke(main, ["batch", *runs, "--out", str(tmp_path / "fleet"), "--jobs", "1", "-q"])
    assert result.exit_code == 0, result.output
    return tmp_path / "fleet" / "index.html"


REPORTS = {
    "oom_then_timeout": _incident(lambda tmp_path: REPO / "examples" / "oom_then_timeout"),
    "planted_markup": _incident(_planted_run),
    "no_plots": _incident(_no_plot_run),
    "batch": _batch,
}


def _open(page: Path, profile: Path, shot: Path) -> tuple[str, list[str]]:
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    return out.stdout, console


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_report_opens_offline_draws_its_plots_and_logs_nothing(name, tmp_path):
    page = REPORTS[name](tmp_path)
    assert page.stat().st_size < REPORT_LIMIT_BYTES
    html = page.read_text(encoding="utf-8")
    plots = len(re.findall(r'<div class="plot" id="plot-', html))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)

    dom, console = _open(page, tmp_path / "profile", shot)

    assert console == []
    assert "data-pwned" not in dom and "<title>pwned</title>" not in dom
    if name == "no_plots":
        assert plots == 0 and "main-svg" not in dom
    else:
        assert plots >= 1
        assert re.search(r'<body[^>]* data-plots-ready="1"', dom)
        drawn = len(re.findall(r'<svg class="main-svg"', dom))
        assert drawn >= plots  # plotly draws two layered main-svg per figure
    assert shot.stat().st_size > 20_000  # a PNG of a rendered page, not a blank one
