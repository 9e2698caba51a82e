"""A ticket-sized Markdown summary to paste into an issue tracker, with the HTML attached."""

from __future__ import annotations

from typing import Any

from forensics.report.labels import ranks_phrase


def _fence(text: str) -> str:
    return text.replace("```", "ˋˋˋ")


def render_markdown(doc: dict[str, Any]) -> str:
    v = doc["verdict"]
    run = doc["run"]
    lines = [f"### forensics: `{run['name']}` — **{v['status'].upper()}**", ""]
    rc = v["root_cause"]
    if v.get("reason"):
        lines += [f"**No verdict** (`{v['reason']['code']}`): {v['reason']['text']}", ""]
    elif rc is None:
        lines.append(v["summary"])
    else:
        where = f" on rank {rc['rank']}" if rc["rank"] is not None else ""
        host = f" (`{rc['host']}`)" if rc["host"] else ""
        lines += [
            f"**Root cause:** {rc['title']}{where}{host} — class `{rc['class']}`, rule `{rc['rule']}`, "
            f"confidence {rc['confidence']:.0%}" + (f", step {rc['step']}" if rc.get("step") is not None else ""),
            "",
        ]
        if rc.get("explanation"):
            lines += [f"**Why:** {rc['explanation']}", ""]
        lines.append("```")
        lines += [_fence(f"{e['file']}:{e['line']}: {e['text'][:300]}") for e in rc["evidence"][:3]]
        lines += ["```", ""]
        if v["symptoms"]:
            lines.append(
                "**Consequences:** "
                + "; ".join(
                    f"`{s['class']}`" + (f" on {ranks_phrase(s['ranks'])}" if s["ranks"] else "") for s in v["symptoms"]
                )
            )
            lines.append("")
        if rc["remediation"]:
            lines.append("**What to change:**")
            lines += [f"- {r}" for r in rc["remediation"]]
            lines.append("")
    key = {
        m: doc["metrics"][m]
        for m in ("perf/max_memory_allocated_gb", "perf/throughput", "timing_s/step")
        if m in doc["metrics"]
    }
    if key:
        lines.append(
            "**Key numbers:** "
            + "; ".join(f"`{m}` last {s['last']} (min {s['min']}, max {s['max']})" for m, s in key.items())
        )
        lines.append("")
    lines.append(f"_{len(run['files'])} files, {run['ranks']} ranks, {run['steps']} steps. Full report attached._")
    return "\n".join(lines) + "\n"
