"""Training instability: which metrics went non-finite first, and at which step."""

from __future__ import annotations

import re

from forensics.analyses.explain.context import Reading
from forensics.model import Finding

NON_FINITE = re.compile(r"(?P<metric>[\w/@.\-]+):(?:np\.float\d+\()?-?(?:nan|inf)\b")


def explain_instability(finding: Finding, reading: Reading) -> None:
    """Which metrics went non-finite first, and at which step."""
    for e in finding.evidence:
        metrics = list(dict.fromkeys(m["metric"] for m in NON_FINITE.finditer(e.text)))
        if metrics:
            step = finding.fields.get("step")
            at = f"At step {step}" if step is not None else "First"
            shown = ", ".join(metrics[:6]) + (", ..." if len(metrics) > 6 else "")
            finding.explanation = f"{at} these became NaN/inf: {shown}."
            return
