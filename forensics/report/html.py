"""The self-contained HTML incident report: Jinja2 with autoescape, plotly inlined (no CDN).

plotly.js is embedded gzip-compressed and unpacked in the browser with DecompressionStream, which
keeps a report with plots under 2 MB while opening offline. Data for plots is embedded as JSON with
every `<` escaped, so no log line can close its `<script>` element.

Log text is hostile: it is autoescaped in the page, escaped again inside plot labels (plotly reads a
subset of HTML there), redacted like every other output, and the page's Content-Security-Policy runs
only the inline scripts whose hashes it lists, so markup that slipped through would still not execute.
Those are two files of ours: `report.js` (sortable and filterable tables, copy buttons; every page) and
`plotly_loader.js` (plots, the series picker, the dark theme; pages with plots).
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
from forensics.report import labels
from forensics.report.colours import STATUS_COLOURS, class_colour
from forensics.report.evidence import evidence_entries, finding_anchors
from forensics.report.figures import plots
from forensics.report.json_report import to_json_dict
from forensics.report.series_data import series_catalogue

INLINE_SCRIPTS = ("report.js", "plotly_loader.js")  # the only scripts a page may run (by hash); in the templates folder
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
    env.filters["class_label"] = labels.class_label
    env.filters["class_colour"] = class_colour
    env.filters["ranks"] = labels.rank_ranges
    env.filters["ranks_phrase"] = labels.ranks_phrase
    env.filters["when"] = labels.when
    env.filters["facts"] = labels.fact_rows
    env.filters["field_label"] = labels.field_label
    env.filters["field_value"] = lambda value, key="": labels.field_value(key, value)
    env.globals["status_colours"] = STATUS_COLOURS
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


def figure_json(fig: Any, redact_secrets: bool = True) -> Any:
    """A figure as the page embeds it: redacted, with every label plotly shows made plain text. Figures are
    built with an empty template (plotly validates and copies a named one into every figure, ~25 ms each);
    the loader gives them the page's light or dark theme."""
    data = json.loads(pio.to_json(fig, validate=False))
    return plot_safe(redact_tree(data) if redact_secrets else data)


def _files_shown(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file when they are few; else the ones that gave something or have a note, up to MAX_FILE_ROWS."""
    if len(files) <= MAX_FILE_ROWS:
        return files
    telling = [f for f in files if f["events"] or f["samples"] or f["note"]]
    return telling[:MAX_FILE_ROWS]


def _plot_entries(a: Analysis, redact_secrets: bool) -> list[dict[str, Any]]:
    return [
        {
            "id": p.id,
            "section": p.section,
            "metrics": list(p.metrics),
            "verdict": p.verdict,
            "json": figure_json(p.figure, redact_secrets),
        }
        for p in plots(a)
    ]


def render_html(a: Analysis, redact_secrets: bool = True, doc: dict[str, Any] | None = None) -> str:
    """The incident report page. `doc`: `to_json_dict(a, redact_secrets)` when the caller made it already."""
    doc = doc if doc is not None else to_json_dict(a, redact_secrets)
    figs = _plot_entries(a, redact_secrets)
    catalogue = series_catalogue(a.series)
    catalogue = redact_tree(catalogue) if redact_secrets else catalogue
    evidence = evidence_entries(a)
    entries = redact_tree(evidence.entries) if redact_secrets else evidence.entries
    anchor_of = {redact_tree(k) if redact_secrets else k: v for k, v in evidence.anchor_of.items()}
    shown = _files_shown(doc["run"]["files"])
    template = template_environment().get_template("incident.html.j2")
    return template.render(
        doc=doc,
        figures=figs,
        series=catalogue,
        series_json=plot_safe(catalogue),
        finding_anchors=finding_anchors(a.findings),
        evidence=entries,
        evidence_hidden=evidence.hidden,
        evidence_anchor=anchor_of,
        plotly_js=plotly_js_gz_b64() if figs or catalogue["metrics"] else "",
        metrics=doc["metrics"],
        files_shown=shown,
        files_hidden=len(doc["run"]["files"]) - len(shown),
        version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
