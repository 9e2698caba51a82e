"""Ray's own messages: the session logs (raylet, GCS, core workers, worker stdout/stderr) and their echoes.

Ray's C++ components write `[ts L pid tid] (component) file.cc:N: msg`; multi-line messages (the memory
monitor's report, a failed task's error context) go on in continuation lines without that prefix. The
scanner hands every matching line to these extractors with up to 64 lines around it, so a block is read
from its first line, and a rule hit on a continuation line is attributed to the block it belongs to.

Each event names its *subject*: the process, actor or node the message is about (the worker that the
memory monitor killed, the actor that died), not the process that wrote the line. Ids go into `fields`
(`node_id`, `worker_id`, `actor_id`, `actor_name`, `actor_class`); analyses/ray_cluster.py joins them into
one map of nodes, workers and actors and attributes every event to a role, node and rank.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

from forensics.line_prefixes import ANSI, RAY_PREFIX, RAY_SYSTEM_PREFIX
from forensics.sources.base import Hit, LineExtractor, LineRecord, Sink
from forensics.sources.traceback import TRIGGER as EXCEPTION_TRIGGER
from forensics.tracebacks import EXCEPTION_LINE

SOURCE = "ray"
BLOCK_LINES = 60  # the longest block read after a record's first line (the memory monitor's report)
QUOTED_RAYLET_LINES = 24  # "Last 20 lines of the Raylet logs", as the agents quote them
QUOTED_WORKERS_KEPT = 4

CXX_HEAD = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d{3}) (?P<lvl>[TDIWEC]) (?P<pid>\d+) (?P<tid>\d+)\] "
    r"(?:\((?P<comp>[\w-]+)\) )?(?P<src>[\w.\-]+):(?P<srcline>\d+): ?"
)
CXX_LEVEL = {"T": "debug", "D": "debug", "I": "info", "W": "warning", "E": "error", "C": "critical"}
PY_LOG_HEAD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|SUCC)\b")

# --- identities ---------------------------------------------------------------------------------------
NODE_REGISTERED = re.compile(
    r"Registering new node\. node_id=(?P<node>[0-9a-f]+) node_name=(?P<name>\S+) node_address=(?P<ip>[^\s,]+)"
    r"|Registering node info, node id = (?P<node2>[0-9a-f]+), address = (?P<ip2>[^\s,]+)"
)
RAYLET_STARTED = re.compile(r"Raylet of id, (?P<node>[0-9a-f]+) started\..*?node_manager address: (?P<ip>[^\s:]+):\d+")
WORKER_STARTED = re.compile(r"Started worker process with pid (?P<pid>\d+) worker_id=(?P<wid>[0-9a-f]+)")
CORE_WORKER_INIT = re.compile(
    r"Initializing worker at address: (?P<ip>[^\s:]+):\d+ worker_id=(?P<wid>[0-9a-f]+) node_id=(?P<node>[0-9a-f]+)"
)
ACTOR_CREATING = re.compile(r"Creating actor actor_id=(?P<aid>[0-9a-f]+)")
ACTOR_PLACED = re.compile(
    r"(?:Submitting actor creation task to worker|Actor creation task succeeded)\. actor_id=(?P<aid>[0-9a-f]+) "
    r"worker_id=(?P<wid>[0-9a-f]+)(?:.*?node_id=(?P<node>[0-9a-f]+))?"
)
ACTOR_NAME_CLEANED = re.compile(r"Actor name (?P<name>\S+) is cleaned up")
ACTOR_ID_IN_LINE = re.compile(r"actor_id=(?P<aid>[0-9a-f]{32})\b")
WORKER_MARKER = re.compile(r"^:actor_name:(?P<cls>\S+)")
WORKER_FILE = re.compile(
    r"(?:^|/)worker-(?P<wid>[0-9a-f]+)-(?P<job>[0-9a-f]+)-(?P<pid>\d+)(?:\.\d+)?\.(?:out|err)(?:\.\d+)?$"
)

# --- deaths -------------------------------------------------------------------------------------------
WORKER_EXIT = re.compile(
    r"Reporting worker exit, worker id = (?P<wid>[0-9a-f]+), node id = (?P<node>[0-9a-f]+), address = (?P<ip>[^,]*), "
    r"exit_type = (?P<type>\w+), exit_detail = (?P<detail>.*)$"
)
ACTOR_FAILED = re.compile(
    r"Actor is failed on worker (?P<wid>[0-9a-f]+) at node (?P<node>[0-9a-f]+),.*?death context type = (?P<ctx>\w+)"
)
NODE_DEATH = re.compile(
    r"death reason = (?P<reason>\w+), death message = (?P<msg>.*?)(?: node_id=(?P<node>[0-9a-f]+))?"
    r"(?: node_name=(?P<name>\S+))?\s*$"
)
NODE_MARKED_DEAD = re.compile(
    r"The node with node id: (?P<node>[0-9a-f]+) and address: (?P<ip>[^\s]+) and node name: \S+ "
    r"has been marked dead because (?P<why>the detector has missed too many heartbeats)"
)
NODE_HEALTH_DEAD = re.compile(r"Node is dead because the health check failed\. node_id=(?P<node>[0-9a-f]+)")
HEALTH_CHECK_FAILED = re.compile(r"Health check failed for node (?P<node>[0-9a-f]+), remaining checks (?P<left>\d+)")
NODE_ACTORS_LOST = re.compile(
    r"Node died; reconstructing actors that were running on it: (?P<aids>[0-9a-f, ]+?) node_id=(?P<node>[0-9a-f]+)"
)
RAYLET_TERMINATED_BY = re.compile(r"Terminated Raylet: ip=(?P<ip>[^,\s]+), node_id=(?P<node>[0-9a-f]+)")
RAYLET_TERMINATED = re.compile(r"Raylet is terminated\. Termination is unexpected")
RAYLET_LOST = re.compile(r"Shutting down the core worker because the local raylet failed")
OWNER_DIED = re.compile(
    r"Force kill actor request has received\. exiting immediately\.\.\. The actor is dead because its owner has died"
    r"|Killing leased worker because its owner died\. worker_id=(?P<wid>[0-9a-f]+)"
)

# --- the memory monitor (every wording: "Task was killed …" (<= 2.5x), "N worker(s) were killed …", 2.60's
# "Killing N worker(s), kill details: …") -----------------------------------------------------------------
OOM_HEAD = re.compile(
    r"Killing (?P<n>\d+) worker\(s\), kill details: Memory on the node"
    r"|(?P<n2>\d+) worker\(s\) were killed due to the node running low on memory"
    r"|Task was killed due to the node running low on memory"
)
NODE_MEMORY = re.compile(
    r"Memory on the node \(IP: (?P<ip>[^,\s]+), ID: (?P<node>[0-9a-f]+)\)"
    r"(?: where the (?:task|lease) \((?P<id_kind>task|lease|actor) ID: (?P<task_id>[0-9a-f]+), name=(?P<task>[^,]+), "
    r"pid=(?P<pid>\d+), memory used=(?P<wmem>[\d.]+)GB\) was running)?"
    r" was (?P<used>[\d.]+)GB (?:used )?/ (?P<total>[\d.]+)GB (?:limit )?\((?P<frac>[\d.]+)\)"
    r"(?:, which exceeds the memory usage threshold of (?P<thr>\d+(?:\.\d+)?))?"
)
GEN_A_VICTIM = re.compile(r"Ray killed this worker \(ID: (?P<wid>[0-9a-f]+)\)")
OOM_REASON = re.compile(
    r"OOM kill reason: Memory usage (?P<usage>\d+)B exceeded threshold of (?P<thr>\d+)B "
    r"\((?P<pct>[\d.]+)% of (?P<limit>\d+)B limit\)"
)
OOM_VICTIM = re.compile(
    r"Selected to kill: \((?:Actor\((?P<aid>[0-9a-f]+)\)|[^:]*?)?:?.*?task name=(?P<task>[^,]+),.*?\bpid=(?P<pid>\d+), "
    r"actual memory used=(?P<wmem>[\d.]+)GB(?:, worker ID=(?P<wid>[0-9a-f]+))?"
)
OOM_SUMMARY = re.compile(
    r"(?P<n>\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\), (?P<other>\d+) Workers crashed "
    r"due to other reasons at node \(ID: (?P<node>[0-9a-f]+), IP: (?P<ip>[^)\s]+)\)"
)

# --- the raylet's push to the driver and the exceptions the driver raises --------------------------------
WORKER_DIED = re.compile(r"A worker died or was killed while executing a task by an unexpected system error")
WORKER_DIED_FIELDS = {
    "worker_id": re.compile(r"Worker ID: (?P<v>[0-9a-f]+)"),
    "node_id": re.compile(r"Node ID: (?P<v>[0-9a-f]+)"),
    "node_ip": re.compile(r"Worker IP address: (?P<v>[^\s]+)"),
    "pid": re.compile(r"Worker PID: (?P<v>\d+)"),
    "exit_type": re.compile(r"Worker exit type: (?P<v>\w+)"),
    "exit_detail": re.compile(r"Worker exit detail: (?P<v>.*)$"),
}
ACTOR_DIED_HEAD = re.compile(
    r"(?:ActorDiedError|RayActorError): The actor died unexpectedly before finishing this task"
)
ACTOR_DEATH_CAUSE = re.compile(
    r"^The actor (?:is dead because its worker process has died|died because its node has died"
    r"|died because of an error raised in its creation task)"
)
# tab-indented as Ray prints them; pasted into an issue, often space-indented and with the IP made a link
BLOCK_FIELD = re.compile(r"^\s+(?P<key>class_name|actor_id|pid|name|namespace|ip): (?P<value>\S+)\s*$")
IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
WORKER_PROCESS_DIED = re.compile(r"Worker exit type: (?P<type>\w+) Worker exit detail: (?P<detail>.*)$")
NODE_DIED_CAUSE = re.compile(r"The actor died because its node has died\. Node Id: (?P<node>[0-9a-f]+)")
NODE_TERMINATED_HOW = re.compile(
    r"^\s+the actor's node was (?P<how>terminated (?:un)?expectedly|preempted): (?P<why>.*)$"
)
ACTOR_UNAVAILABLE = re.compile(r"ActorUnavailableError: The actor (?P<aid>[0-9a-f]+) is unavailable: (?P<why>.*)$")
RAY_TASK_HEADER = re.compile(
    r"RayTaskError\((?P<cause>[\w.]+)\): (?:\x1b\[\d+m)?ray::(?P<task>[\w.<>]+)\(\)(?:\x1b\[\d+m)? "
    r"\(pid=(?P<pid>\d+), ip=(?P<ip>[^,)\s]+)(?:, actor_id=(?P<aid>[0-9a-f]+))?"
)

# --- a failed task as its owner's core worker logs it (a proto dump in continuation lines) -------------
TASK_FAILED = re.compile(r"Task attempt (?P<task_id>[0-9a-f]+) failed with error (?P<error>\w+)")
PROTO_FIELD = re.compile(r'^\s*(?P<key>pid|name|class_name|node_ip_address|error_message|reason): "?(?P<value>[^"]*)"?')
ERROR_MESSAGE_LINE = re.compile(r'^\s*error_message: "')
TASK_ID_HEX = 48  # an actor task's id ends with the 32 hex digits of its actor's id
ACTOR_ID_HEX = 32
ACTOR_GONE = ("ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError")
ERRORS_NAMING_AN_ACTOR = ("ACTOR_DIED", "OUT_OF_MEMORY", "ACTOR_UNAVAILABLE", "WORKER_DIED")


def strip_prefix(line: str) -> str:
    """A neighbouring line as the scanner's `ctx.body` would read it: no ANSI colour, no Ray prefix."""
    text = ANSI.sub("", line).rstrip("\r\n")
    m = RAY_PREFIX.match(text) or RAY_SYSTEM_PREFIX.match(text)
    return text[m.end() :] if m else text


def starts_record(text: str) -> bool:
    """Whether a line opens a new log record (C++ or Python logger header) rather than continuing one."""
    return bool(CXX_HEAD.match(text) or PY_LOG_HEAD.match(text))


def block_after(hit: Hit, limit: int = BLOCK_LINES) -> list[str]:
    """The continuation lines after the hit line, up to the next record."""
    out = []
    for line in hit.following(limit):
        body = strip_prefix(line)
        if starts_record(body):
            break
        out.append(body)
    return out


def _set_level(rec: LineRecord) -> None:
    m = CXX_HEAD.match(rec.hit.ctx.body)
    if m:
        rec.level = CXX_LEVEL[m["lvl"]]


def _record(rec: LineRecord, kind: str, level: str | None = None, **fields: Any) -> None:
    rec.kind = kind
    rec.source = SOURCE
    _set_level(rec)
    if level and not rec.level:
        rec.level = level
    rec.fields.update({k: v for k, v in fields.items() if v not in (None, "")})


def _is_json(rec: LineRecord) -> bool:
    """An events/*.log record: read whole by ray_events, not line by line here."""
    return rec.hit.ctx.body.startswith('{"')


def _genuine(rec: LineRecord) -> bool:
    """A record of its own, not one of the 'last 20 lines of the raylet log' quoted by another process."""
    return bool(CXX_HEAD.match(rec.hit.ctx.body))


def actor_class(text: str | None) -> str | None:
    """The class in `create_colocated_worker_cls.<locals>.WorkerDict`, `TaskRunner.run` or `X_0:1:WorkerDict.__init__`.

    A class segment has a capital letter (`vLLMHttpServer` too); a method segment has none.
    """
    if not text:
        return None
    segments = text.strip().strip('"').rsplit(":", 1)[-1].split(".")
    classes = [s for s in segments if any(c.isupper() for c in s)]
    return classes[-1] if classes else segments[0] or None


def split_task_name(task: str) -> tuple[str | None, str | None]:
    """(actor name, actor class) from a memory-monitor task name such as `ZWa6a8WorkerDict_0:1:WorkerDict.__init__`."""
    m = re.match(r"^(?P<name>.+):(?P<cls>[A-Za-z_]\w*)\.(?P<method>\w+)$", task.strip())
    if m:
        return m["name"], m["cls"]
    m = re.match(r"^(?P<cls>[A-Za-z_]\w*)\.(?P<method>\w+)$", task.strip())
    if m:
        return None, m["cls"]
    return None, None


def set_subject(rec: LineRecord, pid: int | None = None, ip: str | None = None, role: str | None = None) -> None:
    ctx = rec.hit.ctx
    if pid is not None:
        ctx.pid = pid
        ctx.rank = None  # a rank found in the text belonged to the writer, not to the subject
    if ip:
        ctx.host = ip
    if role:
        ctx.role = role


def set_node_subject(rec: LineRecord, ip: str | None, role: str | None) -> None:
    """A line that an actor died *because its node died* is evidence about the node, not about the actor's rank."""
    ctx = rec.hit.ctx
    ctx.pid, ctx.rank = None, None
    ctx.host = ip or ctx.host
    ctx.role = role or ctx.role
    rec.fields["subject"] = "node"


# --- the memory monitor --------------------------------------------------------------------------------


def parse_oom_report(lines: Iterable[str]) -> dict[str, Any]:
    """Figures and victims of one memory-monitor report, from its lines (any wording generation)."""
    found: dict[str, Any] = {}
    victims: list[dict[str, Any]] = []
    for text in lines:
        m = NODE_MEMORY.search(text)
        if m and "node_ip" not in found:
            found.update(node_ip=m["ip"], node_id=m["node"], node_used_gb=float(m["used"]))
            found.update(node_total_gb=float(m["total"]), node_fraction=float(m["frac"]))
            if m["thr"]:
                found["threshold"] = float(m["thr"])
            if m["pid"]:
                victim = {"task": m["task"], "pid": int(m["pid"]), "used_gb": float(m["wmem"])}
                victims.append(victim | ({"actor_id": m["task_id"]} if m["id_kind"] == "actor" else {}))
        m = OOM_REASON.search(text)
        if m and "threshold_bytes" not in found:
            found.update(usage_bytes=int(m["usage"]), threshold_bytes=int(m["thr"]), limit_bytes=int(m["limit"]))
            found.setdefault("threshold", round(float(m["pct"]) / 100, 4))
        for part in text.split("Selected to kill: ")[1:]:
            m = OOM_VICTIM.search("Selected to kill: " + part)
            if m:
                victims.append(
                    {"task": m["task"], "pid": int(m["pid"]), "used_gb": float(m["wmem"]), "worker_id": m["wid"]}
                    | ({"actor_id": m["aid"]} if m["aid"] else {})
                )
        m = GEN_A_VICTIM.search(text)
        if m and victims and "worker_id" not in victims[0]:
            victims[0]["worker_id"] = m["wid"]
        m = OOM_HEAD.search(text)
        if m and (m["n"] or m["n2"]):
            found.setdefault("killed_count", int(m["n"] or m["n2"]))
    if victims:
        first = victims[0]
        name, cls = split_task_name(first["task"])
        found.update(killed_task=first["task"], killed_pid=first["pid"], killed_used_gb=first["used_gb"])
        found.update(actor_name=name, actor_class=cls)
        if first.get("worker_id"):
            found["worker_id"] = found["killed_worker_id"] = first["worker_id"]
        if first.get("actor_id"):
            found["actor_id"] = first["actor_id"]
        if len(victims) > 1:
            found["killed"] = [{"task": v["task"], "pid": v["pid"], "used_gb": v["used_gb"]} for v in victims]
    return {k: v for k, v in found.items() if v is not None}


def apply_oom_report(rec: LineRecord, found: dict[str, Any]) -> None:
    _record(rec, "ray_oom_kill", "error", **found)
    set_subject(rec, found.get("killed_pid"), found.get("node_ip"), found.get("actor_class"))


def _handle_oom(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    body = rec.hit.ctx.body
    if not OOM_HEAD.search(body):
        return
    lines = [body, *block_after(rec.hit)]
    if body.lstrip().startswith('error_message: "') or "\\n" in body:  # one escaped string (proto dump, JSON)
        lines = body.replace("\\n", "\n").split("\n")
    apply_oom_report(rec, parse_oom_report(lines))


def _handle_oom_summary(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    m = OOM_SUMMARY.search(rec.hit.ctx.body)
    if m:
        _record(rec, "ray_oom_summary", "error", killed_count=int(m["n"]), crashed_other=int(m["other"]))
        rec.fields.update(node_id=m["node"], node_ip=m["ip"])
        set_subject(rec, ip=m["ip"])


# --- identities ----------------------------------------------------------------------------------------


def _handle_identity(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    if not _genuine(rec):
        return
    m = NODE_REGISTERED.search(body)
    if m:
        ip = m["ip"] or m["ip2"]
        _record(rec, "ray_node_registered", node_id=m["node"] or m["node2"], node_ip=ip)
        set_subject(rec, ip=ip)
        return
    m = RAYLET_STARTED.search(body)
    if m:
        _record(rec, "ray_raylet_started", node_id=m["node"], node_ip=m["ip"], this_node=True)
        set_subject(rec, ip=m["ip"])
        return
    m = WORKER_STARTED.search(body)
    if m:
        _record(rec, "ray_worker_started", worker_id=m["wid"])
        set_subject(rec, pid=int(m["pid"]))
        return
    m = CORE_WORKER_INIT.search(body)
    if m:
        is_driver = "python-core-driver-" in rec.hit.file
        _record(rec, "ray_core_worker_init", worker_id=m["wid"], node_id=m["node"], node_ip=m["ip"], driver=is_driver)
        set_subject(rec, ip=m["ip"], role="driver" if is_driver else None)
        return
    m = ACTOR_PLACED.search(body)
    if m:
        _record(rec, "ray_actor_placed", actor_id=m["aid"], worker_id=m["wid"], node_id=m["node"])
        return
    m = ACTOR_CREATING.search(body)
    if m:
        _record(rec, "ray_actor_creating", actor_id=m["aid"])


def _handle_actor_name(rec: LineRecord, sink: Sink) -> None:
    m = ACTOR_NAME_CLEANED.search(rec.hit.ctx.body)
    if not m or not _genuine(rec):
        return
    actor_id = None
    for line in reversed(rec.hit.preceding(3)):
        found = ACTOR_ID_IN_LINE.search(line)
        if found and "Destroying actor" in line:
            actor_id = found["aid"]
            break
    _record(rec, "ray_actor_named", actor_name=m["name"], actor_id=actor_id)


def _handle_worker_marker(rec: LineRecord, sink: Sink) -> None:
    """`:actor_name:WorkerDict` at the top of worker-<id>-<job>-<pid>.out/err: which actor class this pid ran."""
    m = WORKER_MARKER.match(rec.hit.ctx.body)
    f = WORKER_FILE.search(PurePosixPath(rec.hit.file).as_posix())
    if not m or not f:
        return
    _record(rec, "ray_worker_actor", "info", actor_class=m["cls"], worker_id=f["wid"], job_id=f["job"])
    set_subject(rec, pid=int(f["pid"]), role=m["cls"])


# --- deaths ---------------------------------------------------------------------------------------------


def _handle_worker_exit(rec: LineRecord, sink: Sink) -> None:
    m = WORKER_EXIT.search(rec.hit.ctx.body)
    if not m or not _genuine(rec):
        return
    detail = m["detail"].strip()
    _record(rec, "ray_worker_exit", worker_id=m["wid"], node_id=m["node"], exit_type=m["type"], exit_detail=detail)
    set_subject(rec, ip=m["ip"].strip() or None)


def _handle_actor_failed(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    m = ACTOR_FAILED.search(body)
    if not m or not _genuine(rec):
        return
    aid = ACTOR_ID_IN_LINE.search(body)
    _record(rec, "ray_actor_failed", worker_id=m["wid"], node_id=m["node"], death_context=m["ctx"])
    if aid:
        rec.fields["actor_id"] = aid["aid"]


def _handle_node_death(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    body = rec.hit.ctx.body
    m = NODE_MARKED_DEAD.search(body)
    if m:
        _record(rec, "ray_node_marked_dead", "error", node_id=m["node"], node_ip=m["ip"], death_reason="heartbeats")
        set_subject(rec, ip=m["ip"])
        return
    if not _genuine(rec):
        return
    m = NODE_DEATH.search(body)
    if m:
        reason = m["reason"]
        _record(rec, "ray_node_dead", node_id=m["node"], death_reason=reason, death_message=m["msg"].strip())
        if reason != "EXPECTED_TERMINATION":
            rec.level = "error"
        return
    m = NODE_HEALTH_DEAD.search(body)
    if m:
        _record(rec, "ray_node_health_dead", node_id=m["node"])
        return
    m = HEALTH_CHECK_FAILED.search(body)
    if m:
        _record(rec, "ray_health_check_failed", node_id=m["node"], remaining_checks=int(m["left"]))
        return
    m = NODE_ACTORS_LOST.search(body)
    if m:
        ids = [a.strip() for a in m["aids"].split(",") if a.strip()]
        _record(rec, "ray_node_actors_lost", node_id=m["node"], actor_ids=ids)


def _handle_raylet_death(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    body = rec.hit.ctx.body
    m = RAYLET_TERMINATED_BY.search(body)
    if m:
        _record(rec, "ray_raylet_terminated", "error", node_id=m["node"], node_ip=m["ip"])
        set_subject(rec, ip=m["ip"])
        return
    if RAYLET_TERMINATED.search(body):
        _record(rec, "ray_raylet_died", "error", subject="node")
        rec.hit.ctx.pid = None
        for line in rec.hit.preceding(2):
            by = RAYLET_TERMINATED_BY.search(line)
            if by:
                rec.fields.update(node_id=by["node"], node_ip=by["ip"])
                set_subject(rec, ip=by["ip"])
        _read_quoted_raylet_log(rec)
        return
    if RAYLET_LOST.search(body):
        _record(rec, "ray_worker_raylet_lost", "error")


def _read_quoted_raylet_log(rec: LineRecord) -> None:
    """The dead raylet's last lines, quoted below the message, name its workers: the node can be found from them."""
    workers: list[str] = []
    last = None
    for line in rec.hit.following(QUOTED_RAYLET_LINES):
        quoted = strip_prefix(line).strip()
        if not quoted.startswith("["):
            if quoted:
                break
            continue
        head = CXX_HEAD.match(quoted)
        last = head["ts"] if head else last
        m = WORKER_STARTED.search(quoted)
        if m and m["wid"] not in workers:
            workers.append(m["wid"])
    if workers:
        rec.fields["quoted_worker_ids"] = workers[:QUOTED_WORKERS_KEPT]
    if last:
        rec.fields["raylet_last_log"] = last


def _handle_owner_died(rec: LineRecord, sink: Sink) -> None:
    """An actor torn down because its owner (the driver, or the actor that created it) went away."""
    m = OWNER_DIED.search(rec.hit.ctx.body)
    if m and _genuine(rec):
        _record(rec, "ray_actor_owner_died", worker_id=m["wid"])
        if m["wid"]:
            rec.hit.ctx.pid = None  # the raylet's line is about the worker it names


def _handle_worker_died(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    body = rec.hit.ctx.body
    if not WORKER_DIED.search(body):
        return
    fields = {}
    for key, pattern in WORKER_DIED_FIELDS.items():
        m = pattern.search(body)
        if m:
            fields[key] = m["v"]
    pid = int(fields.pop("pid")) if "pid" in fields else None
    if "exit_detail" in fields:
        fields["exit_detail"] = fields["exit_detail"].strip()
    _record(rec, "ray_worker_died", "error", **fields)
    set_subject(rec, pid, fields.get("node_ip"))


def _actor_block(rec: LineRecord) -> list[str] | None:
    """The ActorDiedError block a line belongs to: from its first line to the end of its detail lines."""
    body = rec.hit.ctx.body
    if ACTOR_DIED_HEAD.search(body):
        head_and_before: list[str] = [body]
    else:
        before = [strip_prefix(x) for x in rec.hit.preceding(12)]
        for i in range(len(before) - 1, -1, -1):
            if ACTOR_DIED_HEAD.search(before[i]):
                head_and_before = [*before[i:], body]
                break
        else:
            return None
    block = list(head_and_before)
    for line in (strip_prefix(x) for x in rec.hit.following(12)):
        if not (BLOCK_FIELD.match(line) or ACTOR_DEATH_CAUSE.match(line) or NODE_TERMINATED_HOW.match(line)):
            break
        block.append(line)
    return block


def parse_actor_block(block: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for line in block:
        m = BLOCK_FIELD.match(line)
        if m:
            found.setdefault(m["key"], m["value"])
            continue
        m = WORKER_PROCESS_DIED.search(line)
        if m and "exit_type" not in found:
            found.update(exit_type=m["type"], exit_detail=m["detail"].strip(), death_cause="worker_died")
        m = NODE_DIED_CAUSE.search(line)
        if m:
            found.update(node_id=m["node"], death_cause="node_died")
        m = NODE_TERMINATED_HOW.match(line)
        if m:
            found.update(death_reason=m["how"], death_message=m["why"].strip())
        if "error raised in its creation task" in line:
            found["death_cause"] = "creation_task_error"
    out: dict[str, Any] = {
        "actor_id": found.get("actor_id"),
        "actor_name": found.get("name"),
        "actor_class": actor_class(found.get("class_name")),
        "node_ip": _ip(found.get("ip")),
        "pid": int(found["pid"]) if found.get("pid", "").isdigit() else None,
    }
    out.update(
        {k: found[k] for k in ("exit_type", "exit_detail", "node_id", "death_cause", "death_reason") if k in found}
    )
    if "death_message" in found:
        out["death_message"] = found["death_message"]
    return {k: v for k, v in out.items() if v is not None}


def _ip(text: str | None) -> str | None:
    m = IPV4.search(text or "")
    return m.group(0) if m else text


def _handle_actor_died(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    body = rec.hit.ctx.body
    head = bool(ACTOR_DIED_HEAD.search(body))
    if not head and not ACTOR_DEATH_CAUSE.match(body):
        return
    block = _actor_block(rec)
    if block is None:
        return
    found = parse_actor_block(block)
    pid = found.pop("pid", None)
    _record(rec, "ray_actor_died" if head else "ray_actor_death_cause", "error", **found)
    if not head and NODE_DIED_CAUSE.search(body):
        set_node_subject(rec, found.get("node_ip"), found.get("actor_class"))
    else:
        set_subject(rec, pid, found.get("node_ip"), found.get("actor_class"))


def _handle_actor_unavailable(rec: LineRecord, sink: Sink) -> None:
    if _is_json(rec):
        return
    m = ACTOR_UNAVAILABLE.search(rec.hit.ctx.body)
    if m:
        _record(rec, "ray_actor_unavailable", "error", actor_id=m["aid"], reason=m["why"].strip()[:300])


def _handle_ray_task_header(rec: LineRecord, sink: Sink) -> None:
    """`RayTaskError(X): ray::TaskRunner.run() (pid=N, ip=IP, …)`: the task that raised or re-raised X."""
    m = RAY_TASK_HEADER.search(rec.hit.ctx.body)
    if not m:
        return
    rec.fields.update(task=m["task"], task_pid=int(m["pid"]), task_ip=m["ip"])
    if m["aid"]:
        rec.fields["task_actor_id"] = m["aid"]
    if rec.hit.ctx.pid is None:
        set_subject(rec, int(m["pid"]), m["ip"], actor_class(m["task"]))


def _handle_inner_exception(rec: LineRecord, sink: Sink) -> None:
    """The innermost exception of a RayTaskError chain was raised in the task its nearest header names."""
    ctx = rec.hit.ctx
    m = EXCEPTION_LINE.search(ctx.body)
    if ctx.pid is not None or not m or "RayTaskError" in m["cls"]:
        return
    cls = m["cls"].rsplit(".", 1)[-1]
    if cls in ACTOR_GONE:
        return  # its subject is the actor that is gone, named in its own message
    for line in reversed(rec.hit.preceding(64)):
        header = RAY_TASK_HEADER.search(strip_prefix(line))
        if header:
            if header["cause"].rsplit(".", 1)[-1] == cls:
                rec.fields.update(task=header["task"], task_pid=int(header["pid"]), task_ip=header["ip"])
                set_subject(rec, int(header["pid"]), header["ip"], actor_class(header["task"]))
            return


# --- a task's failure in its owner's core-worker log ---------------------------------------------------


@dataclass
class FailedTask:
    task_id: str
    error: str
    fields: dict[str, str]
    head: str


def _task_block(rec: LineRecord) -> FailedTask | None:
    """The `Task attempt … failed` record a line belongs to, with the fields of its error context."""
    body = rec.hit.ctx.body
    m = TASK_FAILED.search(body)
    head, inside = body, []
    if not m:
        before = rec.hit.preceding(30)
        for i in range(len(before) - 1, -1, -1):
            if starts_record(before[i]):
                m = TASK_FAILED.search(before[i])
                head, inside = before[i], [*before[i + 1 :], body]
                break
        if not m:
            return None
    fields: dict[str, str] = {}
    for line in [*inside, *block_after(rec.hit, 30)]:
        f = PROTO_FIELD.match(line)
        if f and f["key"] not in fields:
            fields[f["key"]] = f["value"]
    return FailedTask(m["task_id"], m["error"], fields, head)


def _handle_task_failed(rec: LineRecord, sink: Sink) -> None:
    body = rec.hit.ctx.body
    is_head = bool(TASK_FAILED.search(body)) and _genuine(rec)
    if not is_head and not ERROR_MESSAGE_LINE.match(body):
        return
    task = _task_block(rec)
    if task is None:
        return
    f = task.fields
    actor_id = task.task_id[-ACTOR_ID_HEX:] if len(task.task_id) == TASK_ID_HEX else None
    if task.error not in ERRORS_NAMING_AN_ACTOR:
        actor_id = None
    extra = {
        "error_type": task.error,
        "task_id": task.task_id,
        "actor_id": actor_id,
        "actor_name": f.get("name"),
        "actor_class": actor_class(f.get("class_name")),
        "node_ip": f.get("node_ip_address"),
        "death_reason": f.get("reason"),
    }
    if f.get("error_message"):
        extra["error_message"] = f["error_message"].replace("\\n", " ")[:300]
    pid = int(f["pid"]) if f.get("pid", "").isdigit() else None
    if pid is None and actor_id:
        rec.hit.ctx.pid = None  # the subject is the actor the task ran on, not this log's process
    if is_head:
        _record(rec, "ray_task_failed", "error", **extra)
    else:  # a rule hit on the error message: attributed to its record, stamped with its record's time
        ids = ("actor_id", "actor_name", "actor_class", "node_ip")
        rec.fields.update({k: extra[k] for k in ids if extra[k] is not None})
        head = CXX_HEAD.match(task.head)
        if head and rec.hit.ctx.ts is None:
            rec.hit.ctx.ts = _cxx_time(head["ts"])
            rec.level = CXX_LEVEL[head["lvl"]]
        if NODE_DIED_CAUSE.search(body):
            set_node_subject(rec, extra["node_ip"], extra["actor_class"])
            return
    set_subject(rec, pid, extra["node_ip"], extra["actor_class"])


def _cxx_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.replace(".", ","), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _extractor(
    name: str, trigger: str, handle: Callable[[LineRecord, Sink], None], folds: str | None = None
) -> LineExtractor:
    return LineExtractor(name, SOURCE, trigger, handle, folds=folds)


PRINTED_BY_A_WORKER = r"(?:\x1b\[[0-9;?]*[A-Za-z])*\((?:[^()]*? )?pid=\d+"

EXTRACTORS = [
    _extractor(
        "ray_identity",
        r"Registering new node\. node_id=|Registering node info, node id = |Raylet of id, [0-9a-f]+ started"
        r"|Started worker process with pid \d+ worker_id=|Initializing worker at address: \S+ worker_id="
        r"|Submitting actor creation task to worker\. actor_id=|Actor creation task succeeded\. actor_id="
        r"|Creating actor actor_id=[0-9a-f]+",
        _handle_identity,
    ),
    _extractor("ray_actor_name", r"Actor name \S+ is cleaned up", _handle_actor_name),
    _extractor("ray_worker_marker", r"^:actor_name:\S+", _handle_worker_marker),
    _extractor("ray_worker_exit", r"Reporting worker exit, worker id = [0-9a-f]+", _handle_worker_exit),
    _extractor("ray_actor_failed", r"Actor is failed on worker [0-9a-f]+ at node", _handle_actor_failed),
    _extractor(
        "ray_node_death",
        r"has been marked dead because the detector has missed too many heartbeats|death reason = \w+, death message ="
        r"|Node is dead because the health check failed|Health check failed for node [0-9a-f]+, remaining checks"
        r"|Node died; reconstructing actors that were running on it",
        _handle_node_death,
    ),
    _extractor(
        "ray_raylet_death",
        r"Terminated Raylet: ip=|Raylet is terminated\. Termination is unexpected"
        r"|Shutting down the core worker because the local raylet failed",
        _handle_raylet_death,
    ),
    _extractor(
        "ray_owner_died",
        r"Force kill actor request has received|Killing leased worker because its owner died",
        _handle_owner_died,
    ),
    _extractor(
        "ray_oom_kill",
        r"Killing \d+ worker\(s\), kill details: Memory on the node"
        r"|\d+ worker\(s\) were killed due to the node running low on memory"
        r"|Task was killed due to the node running low on memory",
        _handle_oom,
    ),
    _extractor(
        "ray_oom_summary", r"Workers \(tasks / actors\) killed due to memory pressure \(OOM\)", _handle_oom_summary
    ),
    _extractor(
        "ray_worker_died",
        r"A worker died or was killed while executing a task by an unexpected system error",
        _handle_worker_died,
    ),
    _extractor(
        "ray_actor_died",
        r"(?:ActorDiedError|RayActorError): The actor died unexpectedly|The actor is dead because its worker process"
        r"|The actor died because (?:its node has died|of an error raised in its creation task)",
        _handle_actor_died,
    ),
    _extractor(
        "ray_actor_unavailable", r"ActorUnavailableError: The actor [0-9a-f]+ is unavailable", _handle_actor_unavailable
    ),
    _extractor(
        "ray_task_failed", r'Task attempt [0-9a-f]+ failed with error \w+|^\s*error_message: "', _handle_task_failed
    ),
    _extractor(
        "ray_task_header", r"RayTaskError\([\w.]+\): .*ray::[\w.<>]+\(\).* \(pid=\d+, ip=", _handle_ray_task_header
    ),
    # a line printed by a Ray worker (a `(... pid=N)` prefix) is not the end of a driver's RayTaskError chain
    _extractor("ray_inner_exception", EXCEPTION_TRIGGER, _handle_inner_exception, folds=PRINTED_BY_A_WORKER),
]
