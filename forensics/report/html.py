"""The self-contained HTML incident report: Jinja2 with autoescape, plotly inlined (no CDN).

plotly.js is embedded gzip-compressed and unpacked in the browser with DecompressionStream, which
keeps a report with plots under 2 MB while opening offline. Data for plots is embedded as JSON with
every `<` escaped, so no log line can close its `<script>` element.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from datetime import datetime, timezone
from typing import Any

import jinja2
import plotly.io as pio
import plotly.offline
from markupsafe import Markup

from forensics import __version__
from forensics.model import Analysis
from forensics.report.figures import figures
from forensics.report.json_report import metric_summary, to_json_dict
from forensics.resources import templates_dir


@functools.lru_cache(maxsize=1)
def plotly_js_gz_b64() -> str:
    return base64.b64encode(gzip.compress(plotly.offline.get_plotlyjs().encode(), 9)).decode()


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
    return env


def render_html(a: Analysis, redact_secrets: bool = True) -> str:
    doc = to_json_dict(a, redact_secrets)
    figs = [{"id": name, "json": json.loads(pio.to_json(fig, validate=False))} for name, fig in figures(a)]
    template = template_environment().get_template("incident.html.j2")
    return template.render(
        doc=doc,
        figures=figs,
        plotly_js=plotly_js_gz_b64() if figs else "",
        metrics=metric_summary(a.series),
        version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
