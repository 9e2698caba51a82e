"""Ray's structured events: `session_*/logs/events/event_<SOURCE>.log`, one JSON object per line.

Read through the text scanner (not as a whole-file reader) so that the rules, the user's overlays
included, match the event messages like any log line. Ray 2.60 writes `custom_fields`, `event_id`,
`host_name`, `label`, `message`, `pid`, `severity`, `source_type` and `timestamp` (whole seconds); events
written from Python name the host `source_hostname` and the pid `source_pid`. Messages escape their
newlines (`\\n`), so one event holds a whole multi-line report such as the memory monitor's.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from forensics.sources.base import LineExtractor, LineRecord, Sink
from forensics.sources.ray_session import (
    NODE_MARKED_DEAD,
    OOM_HEAD,
    WORKER_DIED,
    WORKER_DIED_FIELDS,
    apply_oom_report,
    parse_oom_report,
    set_subject,
)

SOURCE = "ray"
SEVERITY = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error", "FATAL": "critical"}
ID_FIELDS = ("node_id", "worker_id", "job_id", "actor_id", "ip")


def _timestamp(value: Any) -> datetime | None:
    """A unix timestamp in seconds (whole seconds in Ray 2.60), as a number or a string."""
    try:
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _read_message(rec: LineRecord, message: str) -> None:
    """The same facts the session logs give, read from the event's message."""
    lines = message.replace("\\n", "\n").split("\n")
    if OOM_HEAD.search(message):
        apply_oom_report(rec, parse_oom_report(lines))
        return
    if WORKER_DIED.search(message):
        for key, pattern in WORKER_DIED_FIELDS.items():
            m = pattern.search(lines[0])
            if m and key == "pid":
                set_subject(rec, pid=int(m["v"]))
            elif m:
                rec.fields.setdefault(key, m["v"].strip())
        rec.kind = "ray_worker_died"
        return
    m = NODE_MARKED_DEAD.search(message)
    if m:
        rec.kind = "ray_node_marked_dead"
        rec.fields.update(node_id=m["node"], node_ip=m["ip"], death_reason="heartbeats")


def _handle_event(rec: LineRecord, sink: Sink) -> None:
    try:
        event = json.loads(rec.hit.text)
    except ValueError:
        return  # a half-written last line
    if not isinstance(event, dict):
        return
    custom = event.get("custom_fields") if isinstance(event.get("custom_fields"), dict) else {}
    ts = _timestamp(event.get("timestamp"))
    ctx = rec.hit.ctx
    ctx.ts = ts or ctx.ts
    ctx.pid = None  # the pid is the writer's (raylet, GCS); the subject comes from the message
    rec.kind = "ray_event"
    rec.source = SOURCE
    rec.level = SEVERITY.get(str(event.get("severity", "")).upper())
    rec.fields.update(label=event.get("label"), source_type=event.get("source_type"))
    for key in ID_FIELDS:
        if custom.get(key):
            rec.fields["node_ip" if key == "ip" else key] = custom[key]
    if custom.get("ip"):
        ctx.host = custom["ip"]
    _read_message(rec, str(event.get("message", "")))
    if rec.fields.get("node_ip"):
        ctx.host = rec.fields["node_ip"]


EXTRACTORS = [LineExtractor("ray_event", SOURCE, r'^\{.*"event_id": ?"[0-9a-f]+"', _handle_event)]
