"""Memory, storage and killed-process verdicts: which OutOfMemoryError a Ray wrapper holds, exception families
beside text rules, and signals as consequences.

Lines are real ones (corpus excerpts, the reference notes, the captured fixtures); logs built from them go to
tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from forensics.pipeline import analyze
from forensics.tracebacks import parse_exception_line, wrapped_exception
from tests.conftest import FIXTURES

WRAPPER = "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=900, ip=192.0.2.2, actor_id=f817)"
REMOTE_FRAMES = [
    '  File "/home/user/verl/scripts/capture/ray/main_ppo.py", line 237, in __call__',
    "    output = ray.get(output)",
    "             ^^^^^^^^^^^^^^^",
]
RAY_OOM = (
    "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. Memory on the "
    "node (IP: 192.0.2.2, ID: 25d2d42416503bc8ce4aa769229a85c82db6b5ba779edbf72c0ec323) was 3.92GB used / 23.54GB "
    "limit (0.166413)"
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.63 GiB. GPU 7 has a total capacity of 79.11 GiB "
    "of which 2.61 GiB is free."
)


def _run(tmp_path: Path, lines: list[str], name: str = "driver.log"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return analyze([path])


def _finding_at(result, line: int):
    return next(f for f in result.findings if f.evidence[0].line == line)


@pytest.mark.parametrize("prefix", ["", "(TaskRunner pid=900) ", "[rank0]: "])
@pytest.mark.parametrize(
    ("inner", "root", "wrapper"),
    [
        (RAY_OOM, ("host_oom", "ray-memory-monitor"), ("host_oom", "ray-out-of-memory-error")),
        (TORCH_OOM, ("cuda_oom", "cuda-oom"), ("cuda_oom", "out-of-memory-error")),
    ],
)
def test_a_ray_wrapper_is_the_out_of_memory_error_its_printout_ends_with(tmp_path, prefix, inner, root, wrapper):
    result = _run(tmp_path, [prefix + line for line in (WRAPPER, *REMOTE_FRAMES, inner)])
    got = result.verdict.root_cause
    assert got is not None and (got.cls, got.rule) == root and got.evidence[0].line == 5
    assert (_finding_at(result, 1).rule, _finding_at(result, 1).cls) == (wrapper[1], wrapper[0])
    if root[0] == "host_oom":
        assert "cuda_oom" not in {s.cls for s in result.verdict.symptoms}


def test_a_wrapper_seen_alone_is_taken_for_torchs_and_a_host_oom_elsewhere_explains_it(tmp_path):
    alone = _run(tmp_path, [WRAPPER])
    assert (alone.verdict.root_cause.cls, alone.verdict.root_cause.rule) == ("cuda_oom", "out-of-memory-error")
    raylet = (
        "(raylet) [2025-09-08 18:42:49,188 E 10803 10803] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) "
        "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 1cd6e3ee8488c632, "
        "IP: 10.2.74.241) over the last time period."
    )
    both = _run(tmp_path, [raylet, "some unrelated output", WRAPPER], name="both.log")
    assert both.verdict.root_cause.cls == "host_oom"


def test_the_printout_of_a_wrapper_ends_at_a_line_that_is_not_part_of_it():
    assert wrapped_exception("OutOfMemoryError", [*REMOTE_FRAMES, RAY_OOM]).module == "ray.exceptions"
    later = ["(TaskRunner pid=900) step:3 - actor/pg_loss:0.1", RAY_OOM]
    assert wrapped_exception("OutOfMemoryError", later) is None


def test_the_host_oom_fixture_names_no_cuda_oom():
    path = FIXTURES / "runs" / "ray_memory_monitor"
    result = analyze([path])
    assert result.verdict.root_cause.cls == "host_oom"
    assert "cuda_oom" not in {f.cls for f in result.findings}


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        ("OutOfMemoryError                          Traceback (most recent call last)", "OutOfMemoryError"),
        ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", "Exception"),
        (
            "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 273. GiB for an array with shape (101, "
            "363246735) and data type int64",
            "_ArrayMemoryError",
        ),
    ],
)
def test_exception_lines_of_notebooks_bare_exception_and_private_classes_are_read(line, cls):
    raised = parse_exception_line(line)
    assert raised is not None and raised.cls == cls


def test_a_notebook_oom_is_a_cuda_oom(tmp_path):
    lines = [
        "---------------------------------------------------------------------------",
        "OutOfMemoryError                          Traceback (most recent call last)",
        "/tmp/ipykernel_36/773422404.py in <cell line: 0>()",
        "----> 1 trainer_stats = trainer.train()",
    ]
    root = _run(tmp_path, lines).verdict.root_cause
    assert root is not None and (root.cls, root.evidence[0].line) == ("cuda_oom", 2)


def test_a_family_stands_aside_for_a_text_rule_of_its_class_and_reads_what_no_rule_does(tmp_path):
    result = _run(
        tmp_path,
        [
            "OSError: [Errno 30] Read-only file system: '/data/checkpoints/global_step_100'",
            "OSError: [Errno 30] Read-on",  # a paste cut off after the errno
        ],
    )
    assert {(f.evidence[0].line, f.rule) for f in result.findings} == {(1, "io-error"), (2, "storage-os-error")}


def test_an_oserror_of_a_path_is_not_a_storage_failure(tmp_path):
    """A missing file is a wrong path in the configuration (corpus/LABELS.md), not the storage failing."""
    result = _run(tmp_path, ["FileNotFoundError: [Errno 2] No such file or directory: 'data/train.parquet'"])
    assert result.verdict.root_cause.cls == "config_error"


def test_a_terminated_rank_is_a_consequence_of_the_rank_that_failed(tmp_path):
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/user/verl/verl/trainer/main_ppo.py", line 64, in run',
        "[rank1]:     validate(config)",
        "[rank1]: ZeroDivisionError: division by zero",
        "W1019 08:21:39.599000 3036 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3042 "
        "closing signal SIGTERM",
        "E1019 08:21:39.599000 3036 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -15) "
        "local_rank: 0 (pid: 3042) of binary: /usr/bin/python",
    ]
    v = _run(tmp_path, lines).verdict
    assert v.root_cause.cls == "unknown_crash" and v.root_cause.evidence[0].line == 4
    assert [s.cls for s in v.symptoms] == ["process_killed"]


def test_an_abort_with_no_cause_in_the_logs_is_a_killed_process(tmp_path):
    lines = [
        "pure virtual method called",
        "terminate called without an active exception",
        "E1019 08:21:39.599000 3036 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -6) "
        "local_rank: 0 (pid: 3042) of binary: /usr/bin/python",
    ]
    root = _run(tmp_path, lines).verdict.root_cause
    assert (root.cls, root.rule) == ("process_killed", "process-terminated")
    assert "SIGABRT" in root.explanation and "SIGKILL comes from" not in root.explanation


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        (
            "RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is possible that "
            "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
            "host_oom",
        ),
        ("RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed.", "process_killed"),
        ("RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault", "unknown_crash"),
    ],
)
def test_a_dataloader_worker_killed_by_a_signal_is_read_by_the_signal(tmp_path, line, cls):
    assert _run(tmp_path, [line]).verdict.root_cause.cls == cls


def test_the_captured_full_disk_names_the_storage_although_no_line_says_no_space():
    run = FIXTURES / "runs" / "ckpt_disk_full"
    text = "\n".join(p.read_text(encoding="utf-8") for p in run.rglob("*.log"))
    assert "No space left" not in text and "Errno 28" not in text
    expected = yaml.safe_load((run / "expected.yaml").read_text(encoding="utf-8"))
    root = analyze([run]).verdict.root_cause
    assert (root.cls, root.rank) == (expected["root_cause"]["class"], expected["root_cause"]["rank"])
    assert "basic_ios::clear: iostream error" in root.evidence[0].text
