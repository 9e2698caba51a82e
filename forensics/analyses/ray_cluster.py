"""One map of a Ray cluster from its logs: nodes, worker processes and actors, and who died why.

Ray spreads identity over many files: the raylet says which pid a worker id got, the GCS which worker
an actor was placed on and on which node, a worker's own files which actor class it ran, the memory
monitor and the driver's ActorDiedError which actor name (verl's `{prefix}{Class}_{pg}:{local_rank}`).
Joined, they attribute every event (a `(WorkerDict pid=N)` driver line, a line of a worker's log, the
GCS's report about a worker) to a role, a node and, for verl's worker groups, a rank; and the report
can say which actors died, when, why and on which node.

Echoes are stamped too: the driver prints Ray's messages without a time, long after the line before
it; a message about a worker, actor or node that the cluster logs recorded with a time gets that time
(plus a millisecond: the driver learnt it afterwards), marked as inferred.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from forensics.model import Finding, iso

SOURCE = "ray"
NORMAL_EXITS = {"INTENDED_USER_EXIT", "INTENDED_SYSTEM_EXIT"}
VERL_ACTOR_NAME = re.compile(r"^(?P<group>.+?)_(?P<pg>\d+):(?P<local>\d+)$")
COMPONENT_FILE = re.compile(
    r"^(?P<comp>raylet|gcs_server|dashboard_agent|dashboard|monitor|log_monitor|runtime_env_agent|ray_client_server)"
    r"(?:_\w+)?(?:\.\d+)?\.(?:out|err|log)(?:\.\d+)?$"
)
SUBDIRS = {"events", "old", "export_events"}
EVENTS_FILE = r"(?:^|/)events/event_[^/]+$"  # Ray's structured events: stamped to the second only
WRITER_ROLES = (None, "raylet", "gcs_server", "autoscaler")
SUBJECT_IP_KINDS = ("ray_actor_died", "ray_actor_death_cause", "ray_oom_kill", "ray_task_failed", "ray_worker_died")
IDENTITY_KINDS = ("ray_node_registered", "ray_raylet_started", "ray_core_worker_init")
ECHO_DELAY = timedelta(milliseconds=1)
NODE_DEATH_KINDS = {
    "ray_node_dead",
    "ray_node_marked_dead",
    "ray_node_health_dead",
    "ray_raylet_died",
    "ray_raylet_terminated",
}
NODE_DEATH_WHY = {
    "ray_node_marked_dead": "the GCS missed too many heartbeats from it",
    "ray_node_health_dead": "it failed the GCS's health checks",
    "ray_raylet_died": "its raylet was terminated unexpectedly",
    "ray_raylet_terminated": "its raylet was terminated unexpectedly",
}
TEARDOWN_WEIGHT = 5
ACTOR_DEATH_KINDS = {
    "ray_oom_kill",
    "ray_worker_exit",
    "ray_actor_failed",
    "ray_worker_died",
    "ray_actor_died",
    "ray_actor_death_cause",
    "ray_task_failed",
    "ray_worker_raylet_lost",
    "ray_actor_owner_died",
}

# messages that repeat what the cluster logged elsewhere with a time (the GCS's own records are the source)
ECHO_KINDS = (ACTOR_DEATH_KINDS | NODE_DEATH_KINDS) - {"ray_worker_exit", "ray_actor_failed", "ray_node_dead"} | {
    "ray_oom_summary",
    "ray_actor_unavailable",
    "ray_event",
    "exception",
}


@dataclass
class Fact:
    """One Ray event row, its fields parsed."""

    kind: str
    file: str
    line: int
    ts: datetime | None
    precise: bool  # stamped by its own line, to the millisecond
    host: str | None
    pid: int | None
    fields: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.fields.get(key)


@dataclass
class Death:
    ts: datetime | None
    why: str
    file: str
    line: int
    exit_type: str | None = None
    exit_detail: str | None = None
    weight: int = 2  # how much the fact says about why: 0 (the memory monitor's kill) … 5 (torn down afterwards)

    @property
    def teardown(self) -> bool:
        return self.weight >= TEARDOWN_WEIGHT


@dataclass
class Node:
    node_id: str
    ip: str | None = None
    head: bool = False
    deaths: list[Death] = field(default_factory=list)
    first_missed_heartbeat: datetime | None = None
    raylet_terminated: bool = False


@dataclass
class Actor:
    key: str
    actor_id: str | None = None
    name: str | None = None
    cls: str | None = None
    pid: int | None = None
    worker_id: str | None = None
    node_id: str | None = None
    ip: str | None = None
    rank: int | None = None
    deaths: list[Death] = field(default_factory=list)


@dataclass
class RayCluster:
    nodes: dict[str, Node] = field(default_factory=dict)
    actors: dict[str, Actor] = field(default_factory=dict)
    worker_pid: dict[str, int] = field(default_factory=dict)
    worker_node: dict[str, str] = field(default_factory=dict)
    dir_node: dict[str, str] = field(default_factory=dict)
    entity_death: dict[str, datetime] = field(default_factory=dict)  # id → latest precise death-related time
    _by_pid: dict[int, list[Actor]] = field(default_factory=lambda: defaultdict(list), repr=False)
    _by_worker: dict[str, Actor] = field(default_factory=dict, repr=False)

    def node_ip(self, node_id: str | None) -> str | None:
        node = self.nodes.get(node_id or "")
        return node.ip if node else None

    def index(self) -> None:
        """Look-ups by pid and worker id; call again after actors change."""
        self._by_pid, self._by_worker = defaultdict(list), {}
        for actor in self.actors.values():
            self.add_to_index(actor)

    def add_to_index(self, actor: Actor) -> None:
        if actor.pid is not None:
            self._by_pid[actor.pid].append(actor)
        if actor.worker_id:
            self._by_worker.setdefault(actor.worker_id, actor)

    def actor_by_pid(self, pid: int | None, ip: str | None) -> Actor | None:
        """The actor a pid ran; with several nodes reusing a pid (containers), the one on `ip`."""
        if pid is None:
            return None
        same_pid = self._by_pid.get(pid, [])
        exact = [a for a in same_pid if ip and a.ip == ip]
        if exact:
            return exact[0]
        return same_pid[0] if len({a.ip for a in same_pid}) == 1 else None

    def actor_of(self, fact: Fact) -> Actor | None:
        aid = fact.get("actor_id")
        if aid and aid in self.actors:
            return self.actors[aid]
        wid = fact.get("worker_id")
        if wid and wid in self._by_worker:
            return self._by_worker[wid]
        return self.actor_by_pid(fact.pid, fact.host)

    def is_empty(self) -> bool:
        return not self.nodes and not self.actors


def logs_dir(path: str) -> str:
    """The session's logs folder a file belongs to (files in events/ and old/ belong to the folder above)."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    head, _, name = parent.rpartition("/")
    return head if name in SUBDIRS else parent


def logs_dir_expr(column: str = "file") -> pl.Expr:
    """`logs_dir` for a whole column, in Rust."""
    parent = pl.col(column).str.replace(r"^[^/]*$", "").str.replace(r"/[^/]*$", "")
    return parent.str.replace(r"(?:^|/)(?:events|old|export_events)$", "")


def _facts(events: pl.DataFrame) -> list[Fact]:
    """The Ray rows, repeats of one fact in one session folder read once (a raylet re-logging a worker start)."""
    rows = (
        events.filter(pl.col("source") == SOURCE)
        .select("kind", "file", "line", "ts", "ts_inferred", "host", "pid", "fields", logs_dir_expr().alias("_dir"))
        .with_columns(pl.col("file").str.contains(EVENTS_FILE).alias("_coarse"))
    )
    identity = rows.filter(~pl.col("kind").is_in(list(ACTOR_DEATH_KINDS | NODE_DEATH_KINDS)))
    identity = identity.unique(["kind", "_dir", "host", "pid", "fields"], keep="first", maintain_order=True)
    deaths = rows.filter(pl.col("kind").is_in(list(ACTOR_DEATH_KINDS | NODE_DEATH_KINDS)))
    out = []
    columns = ("kind", "file", "line", "ts", "ts_inferred", "host", "pid", "fields", "_coarse")
    for kind, file, line, ts, inferred, host, pid, raw, coarse in (
        pl.concat([identity, deaths]).select(columns).iter_rows()
    ):
        try:
            fields = json.loads(raw or "{}")
        except ValueError:
            fields = {}
        out.append(Fact(kind, file, line or 0, ts, ts is not None and not inferred and not coarse, host, pid, fields))
    return out


def _learn_nodes(cluster: RayCluster, facts: list[Fact]) -> None:
    votes: dict[str, Counter[str]] = defaultdict(Counter)
    gcs_dirs = set()
    for f in facts:
        node_id, ip = f.get("node_id"), f.get("node_ip")
        if node_id:
            node = cluster.nodes.setdefault(node_id, Node(node_id))
            if ip and (f.kind in IDENTITY_KINDS or not node.ip):
                node.ip = ip
        if f.kind in ("ray_raylet_started", "ray_core_worker_init") and node_id:
            votes[logs_dir(f.file)][node_id] += 10 if f.kind == "ray_raylet_started" else 1
        if f.file.rsplit("/", 1)[-1].startswith("gcs_server"):
            gcs_dirs.add(logs_dir(f.file))
    cluster.dir_node = {d: c.most_common(1)[0][0] for d, c in votes.items()}
    for d in gcs_dirs:
        if d in cluster.dir_node:
            cluster.nodes[cluster.dir_node[d]].head = True


def _learn_workers(cluster: RayCluster, facts: list[Fact]) -> None:
    for f in facts:
        wid = f.get("worker_id")
        if not wid:
            continue
        if f.pid is not None and f.kind in ("ray_worker_started", "ray_core_worker_init", "ray_worker_actor"):
            cluster.worker_pid.setdefault(wid, f.pid)
        node_id = f.get("node_id") or (cluster.dir_node.get(logs_dir(f.file)) if f.kind == "ray_worker_actor" else None)
        if node_id:
            cluster.worker_node.setdefault(wid, node_id)


def _actor(cluster: RayCluster, key: str) -> Actor:
    return cluster.actors.setdefault(key, Actor(key, actor_id=key if not key.startswith("pid:") else None))


def _learn_actors(cluster: RayCluster, facts: list[Fact]) -> None:
    for f in facts:  # actor ids first: placement, creation, names
        aid = f.get("actor_id")
        if not aid:
            continue
        actor = _actor(cluster, aid)
        if f.kind in ("ray_actor_placed", "ray_actor_failed") and f.get("worker_id"):
            actor.worker_id = actor.worker_id or f.get("worker_id")
        if f.kind in ("ray_actor_creating", "ray_actor_died", "ray_oom_kill") and f.pid is not None:
            actor.pid = actor.pid or f.pid
        actor.name = actor.name or f.get("actor_name")
        actor.cls = actor.cls or f.get("actor_class")
        if f.kind in SUBJECT_IP_KINDS:  # these name the actor's own node
            actor.ip = actor.ip or f.get("node_ip")
            actor.node_id = actor.node_id or f.get("node_id")
    for actor in cluster.actors.values():
        if actor.worker_id:
            actor.pid = actor.pid or cluster.worker_pid.get(actor.worker_id)
            actor.node_id = actor.node_id or cluster.worker_node.get(actor.worker_id)
        if actor.pid is not None and not actor.worker_id:
            actor.worker_id = next((w for w, p in cluster.worker_pid.items() if p == actor.pid), None)
            actor.node_id = actor.node_id or cluster.worker_node.get(actor.worker_id or "")
        actor.ip = cluster.node_ip(actor.node_id) or actor.ip
    cluster.index()
    for f in facts:  # facts that know a pid but no actor id: worker files, the driver's echoes
        if f.pid is None or not (f.get("actor_class") or f.get("actor_name")):
            continue
        ip = f.host or cluster.node_ip(cluster.dir_node.get(logs_dir(f.file)))
        actor = cluster.actor_by_pid(f.pid, ip)
        if actor is None and f.kind == "ray_worker_actor":
            actor = _actor(cluster, f"pid:{ip}:{f.pid}")
            actor.pid, actor.ip, actor.worker_id = f.pid, ip, f.get("worker_id")
            actor.node_id = cluster.worker_node.get(actor.worker_id or "")
            cluster.add_to_index(actor)
        if actor is not None:
            actor.cls = actor.cls or f.get("actor_class")
            actor.name = actor.name or f.get("actor_name")
    cluster.actors = {k: a for k, a in cluster.actors.items() if a.cls or a.name or a.pid is not None}
    for actor in cluster.actors.values():
        if not actor.cls and actor.name:
            m = VERL_ACTOR_NAME.match(actor.name)
            actor.cls = m["group"] if m else actor.name
    _verl_ranks(cluster)
    cluster.index()


def _verl_ranks(cluster: RayCluster) -> None:
    """verl names worker-group actors `{prefix}{Class}_{pg}:{local_rank}`; RANK counts up across pgs in order."""
    groups: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    parsed = {}
    for actor in cluster.actors.values():
        m = VERL_ACTOR_NAME.match(actor.name or "")
        if m:
            parsed[actor.key] = (m["group"], int(m["pg"]), int(m["local"]))
            groups[m["group"]][int(m["pg"])].add(int(m["local"]))
    for key, (group, pg, local) in parsed.items():
        pgs = groups[group]
        if all(p in pgs for p in range(pg)):
            cluster.actors[key].rank = sum(max(pgs[p]) + 1 for p in range(pg)) + local


def _actor_death(f: Fact) -> tuple[str, int]:
    """Why an actor died, as one fact tells it, and how much that fact says (lower says more)."""
    exit_type = f.get("exit_type")
    if f.kind == "ray_oom_kill" or exit_type == "NODE_OUT_OF_MEMORY" or f.get("error_type") == "OUT_OF_MEMORY":
        used, total = f.get("node_used_gb"), f.get("node_total_gb")
        figures = f" ({used} of {total} GB in use)" if used and total else ""
        return f"killed by Ray's memory monitor: the node ran low on memory{figures}", 0
    node_died = f.get("death_cause") == "node_died" or f.get("death_reason") == "NODE_DIED"
    if node_died or f.kind == "ray_worker_raylet_lost":
        return "its node died", 1
    if f.get("death_cause") == "creation_task_error":
        return "its constructor raised an exception", 1
    if exit_type == "SYSTEM_ERROR":
        return "its worker process died without a Python error (killed by a signal, e.g. SIGKILL, or crashed)", 1
    if exit_type == "USER_ERROR":
        return "an exception in the actor", 1
    if f.kind == "ray_actor_owner_died":
        return "stopped when its owner (the driver or the actor that created it) exited", TEARDOWN_WEIGHT
    if f.kind == "ray_actor_failed":
        context = f.get("death_context")
        if context == "ActorDiedErrorContext":
            return "stopped with the job (the GCS marked it failed: ActorDiedErrorContext)", TEARDOWN_WEIGHT
        return f"the GCS marked it failed ({context})", 3
    if f.get("error_type"):
        return f"a call to it failed with {f.get('error_type')}", 3
    return "died", 3


def _learn_deaths(cluster: RayCluster, facts: list[Fact]) -> None:
    for f in facts:
        if f.kind in NODE_DEATH_KINDS:
            if f.kind == "ray_node_dead" and f.get("death_reason") == "EXPECTED_TERMINATION":
                continue
            node = cluster.nodes.get(f.get("node_id") or cluster.dir_node.get(logs_dir(f.file), ""))
            if node is None:
                continue
            if f.kind in ("ray_raylet_died", "ray_raylet_terminated"):
                node.raylet_terminated = True
            node.deaths.append(
                Death(f.ts, NODE_DEATH_WHY.get(f.kind) or f.get("death_message") or "died", f.file, f.line)
            )
        elif f.kind == "ray_health_check_failed":
            node = cluster.nodes.get(f.get("node_id") or "")
            if node and f.ts and (node.first_missed_heartbeat is None or f.ts < node.first_missed_heartbeat):
                node.first_missed_heartbeat = f.ts
        elif f.kind in ACTOR_DEATH_KINDS:
            if f.kind == "ray_worker_exit" and f.get("exit_type") in NORMAL_EXITS:
                continue
            actor = cluster.actor_of(f)
            if actor is None:
                continue
            why, weight = _actor_death(f)
            actor.deaths.append(Death(f.ts, why, f.file, f.line, f.get("exit_type"), f.get("exit_detail"), weight))
        if f.kind == "ray_node_actors_lost":
            for aid in f.get("actor_ids") or []:
                if aid in cluster.actors:
                    cluster.actors[aid].node_id = cluster.actors[aid].node_id or f.get("node_id")
        _note_death_time(cluster, f)
    for actor in cluster.actors.values():
        node = cluster.nodes.get(actor.node_id or "")
        if node and node.deaths:
            first = min(node.deaths, key=_death_key)
            why = f"its node {node.ip or node.node_id[:8]} died"
            actor.deaths.append(Death(first.ts, why, first.file, first.line, weight=1))
        actor.ip = actor.ip or cluster.node_ip(actor.node_id)


def _note_death_time(cluster: RayCluster, f: Fact) -> None:
    """The latest precise time the cluster logs say something about a death, per actor, worker and node id."""
    if not f.precise or f.ts is None or (f.kind == "ray_node_dead" and f.get("death_reason") == "EXPECTED_TERMINATION"):
        return
    if f.kind in ACTOR_DEATH_KINDS and not (f.kind == "ray_worker_exit" and f.get("exit_type") in NORMAL_EXITS):
        keys = ("actor_id", "worker_id")
    elif f.kind in NODE_DEATH_KINDS:
        keys = ("node_id",)
    else:
        return
    for key in keys:
        value = f.get(key)
        if value and (value not in cluster.entity_death or f.ts > cluster.entity_death[value]):
            cluster.entity_death[value] = f.ts


def _death_key(d: Death) -> tuple[bool, datetime | None]:
    return (d.ts is None, d.ts)


def build_cluster(events: pl.DataFrame) -> RayCluster:
    """The map of nodes, workers and actors that the Ray events of a run describe."""
    cluster = RayCluster()
    if events.is_empty():
        return cluster
    facts = _facts(events)
    if not facts:
        return cluster
    _learn_nodes(cluster, facts)
    _learn_workers(cluster, facts)
    _learn_actors(cluster, facts)
    _learn_deaths(cluster, facts)
    return cluster


# --- attributing events ---------------------------------------------------------------------------------


def _subject(cluster: RayCluster, host: str | None, pid: int | None, role: str | None, raw: str) -> tuple:
    """(host, pid, role, rank, new fields or None) of one Ray event, from the ids it names."""
    fields = json.loads(raw or "{}")
    node_id = fields.get("node_id") or cluster.worker_node.get(fields.get("worker_id") or "")
    changed = False
    if not node_id and fields.get("quoted_worker_ids"):  # a dead raylet's last lines name its workers
        node_id = next((cluster.worker_node[w] for w in fields["quoted_worker_ids"] if w in cluster.worker_node), None)
        if node_id:
            fields["node_id"], changed = node_id, True
    host = host or cluster.node_ip(node_id)
    if pid is None and fields.get("worker_id"):
        pid = cluster.worker_pid.get(fields["worker_id"])
    about_node = fields.get("subject") == "node"
    actor = None if about_node else cluster.actors.get(fields.get("actor_id") or "")
    if actor is not None:  # the actor the message names is its subject
        pid = actor.pid if actor.pid is not None else pid
        role = actor.cls or role
    actor = actor or (None if about_node else cluster.actor_by_pid(pid, host))
    if actor is not None and pid is None:
        pid = actor.pid
    if actor is not None and role in WRITER_ROLES:
        role = actor.cls or role  # a `(raylet)` re-print about a worker is about that worker
    node = cluster.nodes.get(node_id or "")
    if actor is None and node is not None and node.deaths and not fields.get("actors_lost"):
        lost = [a for a in cluster.actors.values() if a.node_id == node.node_id]
        if lost:
            fields["actors_lost"] = sorted(_actor_label(a) for a in lost)
            role = role if role and role not in ("raylet", "gcs_server") else _roles(lost)
            changed = True
    new_fields = json.dumps(fields, default=str) if changed else None
    return host, pid, role or (actor.cls if actor else None), actor.rank if actor else None, new_fields


def _subject_updates(events: pl.DataFrame, cluster: RayCluster) -> pl.DataFrame:
    """Host, pid, role and rank of Ray events from the ids they name, worked out once per distinct row."""
    keys = ["host", "pid", "role", "fields"]
    distinct = events.filter(pl.col("source") == SOURCE).select(keys).unique()
    solved = [(*key, *_subject(cluster, *key)) for key in distinct.iter_rows()]
    schema = {
        **{k: events.schema[k] for k in keys},
        "_host": pl.String,
        "_pid": pl.Int64,
        "_role": pl.String,
        "_rank": pl.Int64,
        "_fields": pl.String,
    }
    return pl.DataFrame(solved, schema=schema, orient="row")


def _actor_label(actor: Actor) -> str:
    rank = f" rank {actor.rank}" if actor.rank is not None else ""
    return f"{actor.cls or actor.name}{rank} (pid {actor.pid})"


def _roles(actors: list[Actor]) -> str:
    return ", ".join(sorted({a.cls for a in actors if a.cls}))


def _by_pid_frame(cluster: RayCluster) -> pl.DataFrame:
    rows = [(a.pid, a.ip, a.cls, a.rank) for a in cluster.actors.values() if a.pid is not None]
    frame = pl.DataFrame(
        rows, schema={"pid": pl.Int64, "_ip": pl.String, "_cls": pl.String, "_rank": pl.Int64}, orient="row"
    )
    return frame.unique(["pid", "_ip"])


def attribute_events(events: pl.DataFrame, cluster: RayCluster) -> pl.DataFrame:
    """Fill host, pid, role and rank of every event from the cluster map (never overwriting what a line said)."""
    if cluster.is_empty() or events.is_empty():
        return events
    keys = ["host", "pid", "role", "fields"]
    updates = _subject_updates(events, cluster).with_columns(pl.lit(SOURCE).alias("source"))
    events = (
        events.with_row_index("_idx")
        .join(updates, on=[*keys, "source"], how="left", nulls_equal=True)
        .with_columns(
            pl.coalesce("_host", "host").alias("host"),
            pl.coalesce("_pid", "pid").alias("pid"),
            pl.coalesce("_role", "role").alias("role"),
            pl.coalesce("rank", "_rank").alias("rank"),
            pl.coalesce("_fields", "fields").alias("fields"),
        )
        .drop("_host", "_pid", "_role", "_rank", "_fields")
    )
    dirs = pl.DataFrame(
        {"_dir": list(cluster.dir_node), "_dir_ip": [cluster.node_ip(n) for n in cluster.dir_node.values()]},
        schema={"_dir": pl.String, "_dir_ip": pl.String},
    )
    events = (
        events.with_columns(logs_dir_expr().alias("_dir"))
        .join(dirs, on="_dir", how="left")
        .with_columns(pl.coalesce("host", "_dir_ip").alias("host"))
    )
    by_pid = _by_pid_frame(cluster)
    unique_pid = by_pid.group_by("pid").agg(pl.all().first(), pl.len().alias("_n")).filter(pl.col("_n") == 1)
    events = events.join(
        by_pid.rename({"_ip": "host", "_cls": "_cls_h", "_rank": "_rank_h"}), on=["pid", "host"], how="left"
    ).join(unique_pid.select("pid", "_cls", "_rank", pl.col("_ip").alias("_ip_u")), on="pid", how="left")
    component = pl.col("file").str.extract(r"([^/]+)$").str.extract(COMPONENT_FILE.pattern, 1)
    return (
        events.with_columns(
            pl.coalesce("role", "_cls_h", "_cls", component).alias("role"),
            pl.coalesce("rank", "_rank_h", "_rank").alias("rank"),
            pl.coalesce("host", "_ip_u").alias("host"),
        )
        .sort("_idx")
        .drop("_idx", "_dir", "_dir_ip", "_cls_h", "_rank_h", "_cls", "_rank", "_ip_u")
    )


def align_echo_times(events: pl.DataFrame, cluster: RayCluster) -> pl.DataFrame:
    """Messages about a worker, actor or node that carry no time of their own take the cluster's time for it."""
    if not cluster.entity_death or events.is_empty():
        return events
    indexed = events.with_row_index("_idx")
    loose = indexed.with_columns(pl.col("file").str.contains(EVENTS_FILE).alias("_coarse"))
    loose = loose.filter(pl.col("ts").is_null() | pl.col("ts_inferred") | pl.col("_coarse")).filter(
        pl.col("kind").is_in(list(ECHO_KINDS))
        & pl.col("fields").str.contains(r'"(?:actor_id|worker_id|node_id|killed_worker_id)"')
    )
    idx, stamps = [], []
    for i, ts, coarse, raw in loose.select("_idx", "ts", "_coarse", "fields").iter_rows():
        fields = json.loads(raw or "{}")
        about_process = [fields.get(k) for k in ("actor_id", "worker_id", "killed_worker_id")]
        known = [cluster.entity_death[v] for v in about_process if v in cluster.entity_death]
        if not known and fields.get("node_id") in cluster.entity_death:
            known = [cluster.entity_death[fields["node_id"]]]
        if not known:
            continue
        when = max(known) + ECHO_DELAY
        if coarse and ts is not None and not (ts <= when < ts + timedelta(seconds=2)):
            continue
        idx.append(i)
        stamps.append(when)
    if not idx:
        return events
    fix = pl.DataFrame(
        {"_idx": idx, "ts": stamps, "ts_inferred": [True] * len(idx)},
        schema={"_idx": pl.UInt32, "ts": pl.Datetime("us", "UTC"), "ts_inferred": pl.Boolean},
    )
    return indexed.update(fix, on="_idx", how="left").drop("_idx")


# --- the report's Ray section ------------------------------------------------------------------------------


def _death_json(deaths: list[Death]) -> dict[str, Any]:
    if not deaths:
        return {"state": "no failure logged"}
    real = [d for d in deaths if not d.teardown]
    facts = real or deaths
    first = min(facts, key=_death_key)
    telling = min(facts, key=lambda d: (d.weight, *_death_key(d)))
    typed = next((d for d in sorted(facts, key=_death_key) if d.exit_type), None)
    out: dict[str, Any] = {
        "state": "dead" if real else "stopped",
        "why": telling.why,
        "when": iso(first.ts),
        "evidence": {"file": telling.file, "line": telling.line},
    }
    if typed:
        out["exit_type"] = typed.exit_type
        out["exit_detail"] = (typed.exit_detail or "")[:300]
    return out


def _node_json(node: Node, cluster: RayCluster) -> dict[str, Any]:
    actors = [a for a in cluster.actors.values() if a.node_id == node.node_id]
    out: dict[str, Any] = {"node_id": node.node_id, "ip": node.ip, "head": node.head, "actors": len(actors)}
    out.update(_death_json(node.deaths))
    if node.deaths:
        if node.raylet_terminated:
            out["why"] = "its raylet was terminated unexpectedly (SIGKILL, the OOM killer, or a crash)"
        elif any("heartbeat" in d.why for d in node.deaths):
            out["why"] = "the GCS missed its heartbeats (the node hung, was overloaded or unreachable)"
    if node.first_missed_heartbeat:
        out["first_missed_heartbeat"] = iso(node.first_missed_heartbeat)
    return out


def _actor_json(actor: Actor) -> dict[str, Any]:
    out = {
        "role": actor.cls,
        "name": actor.name,
        "actor_id": actor.actor_id,
        "pid": actor.pid,
        "rank": actor.rank,
        "node_ip": actor.ip,
        "node_id": actor.node_id,
    }
    out.update(_death_json(actor.deaths))
    return out


def ray_summary(cluster: RayCluster) -> dict[str, Any]:
    """Nodes and actors for the report: dead ones first, in the order they died."""
    if cluster.is_empty():
        return {}
    nodes = [_node_json(n, cluster) for n in cluster.nodes.values() if n.ip or n.deaths]
    actors = [_actor_json(a) for a in cluster.actors.values() if a.cls != "driver"]

    def order(item: dict[str, Any]) -> tuple[bool, str, str]:
        state = {"dead": 0, "stopped": 1}.get(item["state"], 2)
        return (state, item.get("when") or "~", str(item.get("ip") or item.get("name") or ""))

    return {
        "nodes": sorted(nodes, key=order),
        "actors": sorted(
            actors, key=lambda a: (*order(a)[:2], a.get("rank") if a.get("rank") is not None else 1 << 30)
        ),
    }


# --- naming the root cause's actor and node ----------------------------------------------------------------


def _short_time(ts: datetime | None) -> str:
    return ts.strftime("%H:%M:%S") if ts else "an unstamped time"


def _actor_words(actor: Actor, extra: str = "") -> str:
    rank = f" rank {actor.rank}" if actor.rank is not None else ""
    name = f"{actor.name}, " if actor.name else ""
    return f"{actor.cls or 'actor'}{rank} ({name}pid {actor.pid}{extra})"


def _finding_actor(root: Finding, cluster: RayCluster) -> Actor | None:
    f = root.fields
    if f.get("actor_id") in cluster.actors:
        return cluster.actors[f["actor_id"]]
    for actor in cluster.actors.values():
        if f.get("worker_id") and actor.worker_id == f.get("worker_id"):
            return actor
    pid = f.get("killed_pid") or f.get("task_pid")
    if pid is not None:
        return cluster.actor_by_pid(int(pid), root.host)
    same = [a for a in cluster.actors.values() if root.rank is not None and a.rank == root.rank and a.ip == root.host]
    return same[0] if len(same) == 1 else None


def _finding_node(root: Finding, cluster: RayCluster) -> Node | None:
    node = cluster.nodes.get(root.fields.get("node_id") or "")
    if node is None and root.host:
        node = next((n for n in cluster.nodes.values() if n.ip == root.host and n.deaths), None)
    return node


def _node_story(node: Node, cluster: RayCluster) -> str:
    deaths = sorted(node.deaths, key=_death_key)
    declared = next((d for d in deaths if d.file.split("/")[-1].startswith("gcs_server")), deaths[-1])
    where = f"Node {node.ip or '?'} ({node.node_id[:8]})"
    if node.raylet_terminated:
        text = f"{where}: its raylet was terminated unexpectedly at {_short_time(deaths[0].ts)}"
    else:
        text = f"{where} stopped answering the GCS's health checks"
        if node.first_missed_heartbeat:
            text += f" (first missed at {_short_time(node.first_missed_heartbeat)})"
    text += f"; the GCS declared it dead at {_short_time(declared.ts)}."
    lost = sorted(
        (a for a in cluster.actors.values() if a.node_id == node.node_id), key=lambda a: (a.rank or 0, a.pid or 0)
    )
    if lost:
        text += " Lost with it: " + ", ".join(_actor_words(a) for a in lost) + "."
    return text


def _actor_story(root: Finding, actor: Actor) -> str:
    ip = actor.ip or root.host or "?"
    f = root.fields
    if root.cls == "host_oom" and root.explanation:  # the figures are told already: name the victim
        return f"The worker it killed: {_actor_words(actor)} on node {ip}."
    if root.cls == "host_oom" and f.get("node_used_gb"):
        used = f", using {f['killed_used_gb']} GB" if f.get("killed_used_gb") else ""
        text = f"Ray's memory monitor on node {ip} killed {_actor_words(actor, used)} at {_short_time(root.ts)}"
        text += f": the node used {f['node_used_gb']} of {f.get('node_total_gb')} GB"
        if f.get("threshold"):
            text += f", above the kill threshold of {f['threshold']} (RAY_memory_usage_threshold)"
        return text + "."
    if not [d for d in actor.deaths if not d.teardown]:
        return f"It was raised in {_actor_words(actor)} on node {ip}."
    real = [d for d in actor.deaths if not d.teardown] or actor.deaths
    first = min(real, key=_death_key)
    telling = min(real, key=lambda d: (d.weight, *_death_key(d)))
    typed = next((d for d in sorted(real, key=_death_key) if d.exit_type), None)
    text = f"{_actor_words(actor)} on node {ip} died at {_short_time(first.ts)}: {telling.why}"
    if typed:
        text += f" (exit type {typed.exit_type})"
    return text + "."


def root_story(root: Finding, cluster: RayCluster) -> str:
    """The actor (role, verl rank, pid) and node behind a Ray root cause, and what died with them; the root
    takes the actor's role, rank and host where it lacks them."""
    if cluster.is_empty():
        return ""
    node = _finding_node(root, cluster) if root.cls == "ray_node_died" else None
    actor = None if node else _finding_actor(root, cluster)
    if node is not None and node.deaths:
        root.host = root.host or node.ip
        return _node_story(node, cluster)
    if actor is None:
        return ""
    story = _actor_story(root, actor)
    root.role = root.role or actor.cls
    root.rank = root.rank if root.rank is not None else actor.rank
    root.host = root.host or actor.ip
    if actor.name:
        root.fields.setdefault("actor_name", actor.name)
    return story
