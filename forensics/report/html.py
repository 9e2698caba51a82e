"""The self-contained HTML incident report: Jinja2 with autoescape, plotly inlined (no CDN).

plotly.js is embedded gzip-compressed and unpacked in the browser with DecompressionStream, which
keeps a report with plots under 2 MB while opening offline. Data for plots is embedded as JSON with
every `<` escaped, so no log line can close its `<script>` element.

Log text is hostile: it is autoescaped in the page, escaped again inside plot labels (plotly reads a
subset of HTML there), redacted like every other output, and the page's Content-Security-Policy runs
only the inline scripts whose hashes it lists, so markup that slipped through would still not execute.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import html
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import jinja2
import plotly.io as pio
import plotly.offline
from markupsafe import Markup

from forensics import __version__
from forensics.model import Analysis
from forensics.package_data import templates_dir
from forensics.redact import redact_tree
from forensics.report.figures import figures
from forensics.report.json_report import to_json_dict

PAGE_TEMPLATE = "plotly_white"  # the plotly template of every figure on a page
INLINE_SCRIPTS = ("plotly_loader.js",)  # the only scripts the page may run (by hash); files in the templates folder
MAX_FILE_ROWS = 1000  # a run of 100,000 small files keeps its report small: the rest are in the JSON
_KEEP_MARKUP_KEYS = {"hovertemplate", "texttemplate", "template"}  # written by our code, never from the logs


@dataclass(frozen=True)
class InlineScript:
    text: Markup
    csp_source: str  # 'sha256-…' for the page's Content-Security-Policy


@functools.cache
def inline_script(name: str) -> InlineScript:
    text = (templates_dir() / name).read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return InlineScript(Markup(text), f"'sha256-{digest}'")  # safe: our own file, not data


@functools.lru_cache(maxsize=1)
def plotly_js_gz_b64() -> str:
    return base64.b64encode(gzip.compress(plotly.offline.get_plotlyjs().encode(), 6)).decode()


def script_safe_json(value: Any) -> Markup:
    """JSON that can sit inside <script> whatever strings it holds: `<`, `>` and `&` become escapes."""
    text = json.dumps(value, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)  # safe: every character that could end the element is escaped above


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=jinja2.select_autoescape(["html", "j2", "html.j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["script_json"] = script_safe_json
    scripts = {name: inline_script(name) for name in INLINE_SCRIPTS}
    env.globals["inline_scripts"] = scripts  # templates write them; the CSP runs only these
    env.globals["script_sources"] = " ".join(s.csp_source for s in scripts.values())
    return env


def plot_safe(value: Any, key: str = "") -> Any:
    """Figure JSON whose strings plotly shows as text: `<`, `>` and `&` become entities (which plotly decodes).

    Plotly renders a subset of HTML in names, labels and hover text; a metric or file name from a log
    must show as written. Line breaks (`<br>`) stay, since figures use them and they are harmless.
    """
    if isinstance(value, str):
        return value if key in _KEEP_MARKUP_KEYS else html.escape(value, quote=False).replace("&lt;br&gt;", "<br>")
    if isinstance(value, list):
        return [plot_safe(v, key) for v in value]
    if isinstance(value, dict):
        return {k: v if k in _KEEP_MARKUP_KEYS else plot_safe(v, k) for k, v in value.items()}
    return value


@functools.cache
def _page_template() -> dict[str, Any]:
    return json.loads(pio.json.to_json_plotly(pio.templates[PAGE_TEMPLATE].to_plotly_json()))


def figure_json(fig: Any, redact_secrets: bool = True) -> Any:
    """A figure as the page embeds it: redacted, with every label plotly shows made plain text, and the
    page's template (figures are built with an empty one: plotly validates and copies a named template
    into every figure, ~25 ms each)."""
    data = json.loads(pio.to_json(fig, validate=False))
    shown = plot_safe(redact_tree(data) if redact_secrets else data)
    shown.setdefault("layout", {})["template"] = _page_template()
    return shown


def _files_shown(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file when they are few; else the ones that gave something or have a note, up to MAX_FILE_ROWS."""
    if len(files) <= MAX_FILE_ROWS:
        return files
    telling = [f for f in files if f["events"] or f["samples"] or f["note"]]
    return telling[:MAX_FILE_ROWS]


def render_html(a: Analysis, redact_secrets: bool = True, doc: dict[str, Any] | None = None) -> str:
    """The incident report page. `doc`: `to_json_dict(a, redact_secrets)` when the caller made it already."""
    doc = doc if doc is not None else to_json_dict(a, redact_secrets)
    figs = [{"id": name, "json": figure_json(fig, redact_secrets)} for name, fig in figures(a)]
    shown = _files_shown(doc["run"]["files"])
    template = template_environment().get_template("incident.html.j2")
    return template.render(
        doc=doc,
        figures=figs,
        plotly_js=plotly_js_gz_b64() if figs else "",
        metrics=doc["metrics"],
        files_shown=shown,
        files_hidden=len(doc["run"]["files"]) - len(shown),
        version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
