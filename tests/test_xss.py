"""Markup in logs stays text in the report: evidence lines, metric names, file names, config values, plot labels.

A run folder is planted with script tags, `</script>`, event handlers and `javascript:` links where real
runs carry text, the report is rendered, and the page is parsed: the only scripts are the report's own
(its data, the plotly bundle and two script files of ours), no element carries an event handler or a
javascript: link, every payload is there as text, and the page's CSP lets only those two files run (by hash).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from html.parser import HTMLParser

import pytest

from forensics.pipeline import analyze
from forensics.report.html import render_html, script_safe_json
from tests.conftest import REPO

SCRIPT = '<script>document.body.dataset.pwned="script"</script>'
CLOSE = '</script><script>document.body.dataset.pwned="close"</script>'
HANDLER = "<img src=x onerror=document.body.dataset.pwned=1>"
LINK = "<a href=\"javascript:document.body.dataset.pwned='link'\">open</a>"
COMMENT = "<!--<script>"
SVG = "<svg onload=alert(1)>"
# report.js, the figures, the series for the picker, the plotly bundle, the loader
REPORT_SCRIPTS = [None, "figure-data", "series-data", "plotly-gz", None]
SCRIPT_FILES = ("report.js", "plotly_loader.js")


class _Page(HTMLParser):
    """Tags, attributes, text and script bodies of a page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[tuple[str | None, str]] = []
        self._in_script: str | bool | None = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs).get("id")
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script is not False:
            sid, body = self.scripts[-1]
            self.scripts[-1] = (sid, body + data)
        else:
            self.text.append(data)


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory) -> tuple[str, _Page]:
    run = tmp_path_factory.mktemp("xss") / f"run{SVG}"
    shutil.copytree(REPO / "examples" / "oom_then_timeout", run)
    driver = run / "driver.log"
    text = driver.read_text(encoding="utf-8")
    oom = next(line for line in text.splitlines() if "torch.OutOfMemoryError" in line)
    planted = f"{oom} {SCRIPT} {CLOSE} {HANDLER} {LINK} {COMMENT}\nstep:1 - {HANDLER}:0.5 - {SCRIPT}:1\n"
    driver.write_text(text.replace(oom + "\n", planted, 1), encoding="utf-8")
    driver.rename(driver.with_name(f"driver{HANDLER}.log"))  # the root cause's file: in the timeline's hover text
    a = analyze([run])
    a.config = {"trainer.project_name": CLOSE, f"data.{SCRIPT}": LINK}
    a.environment = {"hostname": HANDLER}
    page = render_html(a)
    parser = _Page()
    parser.feed(page)
    parser.close()
    return page, parser


def test_only_the_reports_own_scripts_exist(hostile_page):
    _, page = hostile_page
    assert [sid for sid, _ in page.scripts] == REPORT_SCRIPTS
    code = [body for sid, body in page.scripts if sid is None]
    assert code == [(REPO / "reports" / "templates" / name).read_text(encoding="utf-8") for name in SCRIPT_FILES]
    assert {tag for tag, _ in page.tags} <= {
        *("html", "head", "meta", "title", "style", "body", "header", "main", "footer", "section", "div", "span"),
        *("h1", "h2", "h3", "p", "dl", "dt", "dd", "pre", "code", "table", "tr", "th", "td", "ul", "li", "ol"),
        *("thead", "tbody", "details", "summary", "strong", "script", "nav", "a", "article", "time", "button"),
        *("input", "br"),
    }
    links = [attrs["href"] for tag, attrs in page.tags if tag == "a"]
    assert links and all(href.startswith("#") for href in links)  # only to anchors of the page itself


def test_no_element_has_an_event_handler_or_a_javascript_link(hostile_page):
    _, page = hostile_page
    for tag, attrs in page.tags:
        assert not [name for name in attrs if name.startswith("on")], tag
        assert not any("javascript:" in (value or "").lower() for value in attrs.values()), tag


def test_every_payload_is_shown_as_text(hostile_page):
    _, page = hostile_page
    shown = "".join(page.text)
    evidence = f"{SCRIPT} {CLOSE} {HANDLER} {LINK} {COMMENT}"
    assert evidence in shown  # the evidence line, as written in the log
    assert f"driver{HANDLER}.log" in shown  # the file name
    assert f"run{SVG}" in shown  # the run folder's name
    assert CLOSE in shown and LINK in shown and HANDLER in shown  # config and environment values


def test_plot_data_cannot_close_its_script_and_plot_labels_are_text(hostile_page):
    raw, page = hostile_page
    data = dict(page.scripts)["figure-data"]
    assert "</script" not in data.lower() and "<!--" not in data
    figures = json.loads(data)
    hover = [t for fig in figures for trace in fig["json"]["data"] for t in trace.get("text") or []]
    # plotly reads a subset of HTML in labels; entities make it show the file name as written
    assert any("driver&lt;img src=x onerror=document.body.dataset.pwned=1&gt;.log" in t for t in hover)
    assert not any("<img" in t for t in hover)
    assert raw.count("<script") == len(REPORT_SCRIPTS)
    picker = json.loads(dict(page.scripts)["series-data"])  # metric names from the log, shown as text by plotly
    names = [m["name"] for m in picker["metrics"]]
    assert "&lt;img src=x onerror=document.body.dataset.pwned=1&gt;" in names and not any("<" in n for n in names)


def test_csp_runs_only_the_loader_by_its_hash(hostile_page):
    _, page = hostile_page
    csp = next(attrs["content"] for tag, attrs in page.tags if attrs.get("http-equiv") == "Content-Security-Policy")
    script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src")).split()[1:]
    code = [body for sid, body in page.scripts if sid is None]
    digests = [f"'sha256-{base64.b64encode(hashlib.sha256(c.encode()).digest()).decode()}'" for c in code]
    assert script_src == [*digests, "'unsafe-eval'"]  # plotly's bundle is evaluated by the loader
    assert "default-src 'none'" in csp


def test_script_safe_json_round_trips_every_dangerous_string():
    values = [SCRIPT, CLOSE, COMMENT, "</SCRIPT >", "\u2028\u2029", "a & b < c > d", "]]>"]
    text = str(script_safe_json(values))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == values


def test_the_plotly_loader_is_the_file_the_hash_is_made_from():
    loader = (REPO / "reports" / "templates" / "plotly_loader.js").read_text(encoding="utf-8")
    assert "DecompressionStream" in loader and "plotsReady" in loader
    for template in ("incident.html.j2", "partials/plotly.html.j2"):
        text = (REPO / "reports" / "templates" / template).read_text(encoding="utf-8")
        assert text.count("<script>") == 2 and text.count("inline_scripts[") == 2
