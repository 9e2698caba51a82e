"""Ray session folders read whole: the captured runs (Ray 2.60, scripts/capture/ray/) and the parsers behind them.

The generic checks of every fixture (status, class, rule, rank, evidence, rules fired) live in
test_fixture_runs.py; here: the actor role and node the verdict names, the Ray section of the report, and
what each piece of Ray's logs contributes.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from forensics.analyses.ray_cluster import Actor, RayCluster, _verl_ranks, logs_dir
from forensics.line_prefixes import file_context
from forensics.model import Analysis
from forensics.pipeline import analyze
from forensics.report.html import render_html
from forensics.report.json_report import to_json_dict
from forensics.scan import TextScanner
from forensics.sources import line_extractors
from forensics.sources.base import Sink
from forensics.sources.ray_session import actor_class, parse_oom_report, split_task_name
from tests.conftest import FIXTURES

RUNS = FIXTURES / "runs"


@cache
def _analysis(*paths: Path) -> Analysis:
    return analyze(list(paths))


def _doc(name: str) -> dict:
    return to_json_dict(_analysis(RUNS / name))


def test_memory_monitor_victim_is_the_rank_not_the_writer():
    """The raylet writes the kill, the GCS the exit, the TaskRunner's core worker the failed call: all name rank 1."""
    events = _analysis(RUNS / "ray_memory_monitor").events
    kills = events.filter(pl.col("kind") == "ray_oom_kill")
    assert kills.height >= 5
    assert set(kills["pid"].to_list()) == {931}
    assert set(kills["rank"].to_list()) == {1}
    assert set(kills["role"].to_list()) == {"WorkerDict"}
    report = kills.filter(pl.col("file").str.ends_with("raylet.out")).row(0, named=True)
    fields = json.loads(report["fields"])
    assert fields["killed_task"] == "ZWa6a8WorkerDict_0:1:WorkerDict.__init__"
    assert (fields["usage_bytes"], fields["threshold_bytes"], fields["limit_bytes"]) == (
        4202475520,
        4170622976,
        25276502016,
    )


def test_driver_echo_takes_the_time_the_cluster_logged():
    """The driver prints the OOM exception with no time; it gets the GCS/raylet time of that worker's death."""
    events = _analysis(RUNS / "ray_memory_monitor").events
    echo = events.filter((pl.col("file") == "driver.log") & (pl.col("line") == 132)).row(0, named=True)
    assert echo["ts_inferred"] is True
    assert echo["ts"].isoformat() == "2026-11-30T05:19:18.877000+00:00"  # the owner's failed call + 1 ms


def test_node_hang_explains_heartbeats_and_lists_the_lost_actors():
    root = _doc("ray_node_hang")["verdict"]["root_cause"]
    assert "stopped answering the GCS's health checks (first missed at 05:24:04)" in root["explanation"]
    assert "WorkerDict rank 0 (IoaqVWWorkerDict_0:0, pid 15292)" in root["explanation"]
    assert root["fields"]["actors_lost"] == ["WorkerDict rank 0 (pid 15292)", "WorkerDict rank 1 (pid 15290)"]


def test_node_died_is_told_apart_from_a_hang():
    root = _doc("ray_node_died")["verdict"]["root_cause"]
    assert root["explanation"].startswith(
        "Node 127.0.0.2 (13f20c52): its raylet was terminated unexpectedly at 05:22:59"
    )


def test_config_error_inside_a_ray_task_is_attributed_to_the_task_that_raised_it():
    """`AssertionError` is printed bare under `RayTaskError(AssertionError): ray::TaskRunner.run() (pid=1792, …)`."""
    events = _analysis(RUNS / "ray_config_error").events
    inner = events.filter((pl.col("file") == "driver.log") & (pl.col("line") == 29)).row(0, named=True)
    assert (inner["role"], inner["pid"], inner["host"]) == ("TaskRunner", 1792, "192.0.2.2")


@pytest.mark.parametrize(
    ("name", "cls", "role", "rank", "host"),
    [
        ("ray_worker_sigkill", "ray_actor_died", "WorkerDict", 1, "192.0.2.2"),
        ("ray_memory_monitor", "host_oom", "WorkerDict", 1, "192.0.2.2"),
        ("ray_node_hang", "ray_node_died", "WorkerDict", None, "127.0.0.2"),
    ],
)
def test_the_driver_log_alone_names_the_same_cause(name, cls, role, rank, host):
    root = to_json_dict(_analysis(RUNS / name / "driver.log"))["verdict"]["root_cause"]
    assert (root["class"], root["role"], root["rank"], root["host"]) == (cls, role, rank, host)


def test_session_folders_given_one_by_one_like_copies_from_each_node():
    run = RUNS / "ray_node_died"
    parts = (run / "driver.log", run / "ray_session_node1", run / "ray_session_node2")
    root = to_json_dict(_analysis(*parts))["verdict"]["root_cause"]
    assert (root["class"], root["host"], root["role"]) == ("ray_node_died", "127.0.0.2", "WorkerDict")
    assert root["evidence"][0]["file"].startswith("ray_session_node2/")


def test_a_worker_prefix_line_gets_the_actors_rank_and_node(tmp_path):
    """`(WorkerDict pid=N)` in any log: role from the prefix, rank and node from the session's map."""
    extra = tmp_path / "worker_stderr.log"
    extra.write_text(
        "\x1b[36m(WorkerDict pid=32470)\x1b[0m torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
        " GPU 0 has a total capacity of 79.11 GiB of which 1.02 GiB is free.\n",
        encoding="utf-8",
    )
    events = analyze([RUNS / "ray_worker_sigkill", extra]).events
    row = events.filter(pl.col("file") == "worker_stderr.log").row(0, named=True)
    assert (row["role"], row["rank"], row["host"], row["pid"]) == ("WorkerDict", 1, "192.0.2.2", 32470)


def test_healthy_run_fires_nothing_and_lists_its_actors():
    a = _analysis(RUNS / "ray_healthy")
    assert a.findings == [] and a.verdict.status == "healthy"
    assert {x["state"] for x in a.ray["actors"]} <= {"stopped", "no failure logged"}


def test_html_report_has_the_ray_section():
    html = render_html(_analysis(RUNS / "ray_worker_sigkill"))
    section = html[html.index('id="ray"') :]
    assert "4mOKVHWorkerDict_0:1" in section and "SYSTEM_ERROR" in section and "192.0.2.2" in section


# --- parsers on their own ----------------------------------------------------------------------------------

GEN_A = [
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
    "Memory on the node (IP: 192.168.1.103, ID: db89c4f2e6a1b3d5c7e9f0a2b4c6d8e0f1a3b5c7d9e1f3a5b7c9d1e3) where the"
    " lease (lease ID: 01000000a1b2c3d4, name=1HsG1ZWorkerDict_0:0:WorkerDict.__init__, pid=3048142, memory"
    " used=49.21GB) was running was 59.84GB / 62.51GB (0.957347), which exceeds the memory usage threshold of 0.95."
    " Ray killed this worker (ID: a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1a2f3e4d5c6b7a8f9e0d1) because it was the most"
    " recently scheduled task;",
]


def test_memory_monitor_report_of_ray_2_5x():
    """A real verl-fork OOM's shape (reference §6.1, ids filled in): the victim is in the 'Memory on the node' line."""
    found = parse_oom_report(GEN_A)
    assert (found["node_ip"], found["node_used_gb"], found["node_total_gb"]) == ("192.168.1.103", 59.84, 62.51)
    assert (found["node_fraction"], found["threshold"]) == (0.957347, 0.95)
    assert (found["killed_pid"], found["killed_used_gb"]) == (3048142, 49.21)
    assert (found["actor_name"], found["actor_class"]) == ("1HsG1ZWorkerDict_0:0", "WorkerDict")
    assert found["worker_id"].startswith("a4f5e6")


@pytest.mark.parametrize(
    ("text", "cls"),
    [
        ("create_colocated_worker_cls.<locals>.WorkerDict", "WorkerDict"),
        ("TaskRunner.run", "TaskRunner"),
        ("ZWa6a8WorkerDict_0:1:WorkerDict.__init__", "WorkerDict"),
        ("vLLMHttpServer.generate", "vLLMHttpServer"),
    ],
)
def test_actor_class_from_ray_names(text, cls):
    assert actor_class(text) == cls


def test_task_names_split_into_actor_name_and_class():
    assert split_task_name("ZWa6a8WorkerDict_0:1:WorkerDict.__init__") == ("ZWa6a8WorkerDict_0:1", "WorkerDict")
    assert split_task_name("TaskRunner.__init__") == (None, "TaskRunner")


def test_verl_rank_counts_across_placement_groups():
    """`{prefix}{Class}_{pg}:{local}`: RANK counts up pg after pg (verl single_controller/ray/base.py)."""
    cluster = RayCluster()
    names = ["abcdefWorkerDict_0:0", "abcdefWorkerDict_0:1", "abcdefWorkerDict_1:0", "abcdefWorkerDict_1:1"]
    cluster.actors = {n: Actor(n, name=n) for n in names}
    cluster.actors["lone"] = Actor("lone", name="zzzzzzWorkerDict_1:0")  # pg 0 never seen: rank unknown
    _verl_ranks(cluster)
    assert [cluster.actors[n].rank for n in names] == [0, 1, 2, 3]
    assert cluster.actors["lone"].rank is None


def test_events_json_line_is_read_with_its_node_and_time(tmp_path):
    line = (RUNS / "ray_node_hang").glob("ray_session_node1/*/logs/events/event_GCS.log")
    path = next(line)
    sink = Sink()
    TextScanner([], line_extractors()).scan(path, "events/event_GCS.log", sink)
    row = sink.events().row(0, named=True)
    assert (row["kind"], row["level"], row["host"]) == ("ray_node_marked_dead", "error", "127.0.0.2")
    assert row["ts"].isoformat() == "2026-11-30T05:24:56+00:00"
    assert json.loads(row["fields"])["label"] == "RAY_NODE_REMOVED"


@pytest.mark.parametrize(
    "name",
    [
        "logs/worker-9df9c9b9-01000000-931.out",
        "logs/old/worker-9df9c9b9-01000000-931.err.2",
        "logs/python-core-worker-9df9c9b9_931.1.log",
        "logs/python-core-worker-9df9c9b9_931.log.1",
    ],
)
def test_rotated_and_moved_worker_files_keep_their_pid(name):
    assert file_context(name).pid == 931


def test_files_in_events_and_old_belong_to_their_session():
    assert logs_dir("n1/session_x/logs/events/event_GCS.log") == "n1/session_x/logs"
    assert logs_dir("n1/session_x/logs/old/worker-a-b-1.out") == "n1/session_x/logs"
    assert logs_dir("n1/session_x/logs/raylet.out.1") == "n1/session_x/logs"


@pytest.mark.parametrize(
    ("case", "cls", "role", "rank", "host"),
    [
        ("009", "host_oom", "WorkerDict", 3, "10.20.49.141"),  # "where the task (actor ID: …" wording
        ("007", "ray_actor_died", "WorkerDict", 3, "10.29.214.5"),  # space-indented block, IP pasted as a link
    ],
)
def test_public_issue_logs_name_the_ray_actor(corpus, case, cls, role, rank, host):
    root = analyze([next((corpus / "cases").glob(f"{case}_*"))]).verdict.root_cause
    assert (root.cls, root.role, root.rank, root.host) == (cls, role, rank, host)
