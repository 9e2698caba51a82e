"""Failure knowledge that reasons from the exception: families, cut tracebacks, retried attempts, and the verdicts
they give on real excerpts (the open corpus) and captured runs.

The excerpts are read from corpus/cases/open/ as pasted; each test names what the excerpt shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.pipeline import analyze
from forensics.report.json_report import to_json_dict
from forensics.rules import load_rules
from forensics.rules.model import ExceptionMatch
from forensics.scan import TextScanner
from forensics.sources import line_extractors
from forensics.sources.base import Sink
from forensics.tracebacks import cut_traceback, parse_exception_line, reported_as_retried
from tests.conftest import FIXTURES, REPO

OPEN = REPO / "corpus" / "cases" / "open"
RUNS = FIXTURES / "runs"


def _case(case_id: str) -> str:
    return (OPEN / f"{case_id}.log").read_text(encoding="utf-8", errors="replace")


def _verdict(path: Path) -> dict:
    return to_json_dict(analyze([path]))["verdict"]


def _class_and_rules(path: Path) -> tuple[str, set[str]]:
    """The root cause's class and every rule that fired (a family and a text rule may both know one line)."""
    doc = to_json_dict(analyze([path]))
    root = doc["verdict"]["root_cause"]
    return (root["class"] if root else "healthy"), {f["rule"] for f in doc["findings"]}


@pytest.mark.parametrize(
    ("case_id", "cls", "rule"),
    [
        # load_state_dict's header, then "size mismatch for ..." lines: the shapes are the finding
        ("0418", "shape_mismatch", "state-dict-size-mismatch"),
        ("0552", "shape_mismatch", "state-dict-size-mismatch"),
        # a vLLM weight loader's bare `assert param_slice.shape == loaded_weight.shape`
        ("0110", "shape_mismatch", "state-dict-size-mismatch"),
        ("0515", "shape_mismatch", "tensor-shape-mismatch"),
        # configuration problems named by the exception's message shape or its class
        ("0314", "config_error", "config-value-invalid"),
        ("0399", "config_error", "config-value-invalid"),
        ("0510", "config_error", "config-validation-failed"),
        ("0469", "config_error", "hydra-config-error"),  # config-schema-rejected stands aside for it
        ("0471", "config_error", "configured-path-missing"),
        ("0491", "config_error", "option-not-implemented"),
        # the environment: a model attribute an API change removed, NVML's version mismatch
        ("0566", "env_version_mismatch", "api-attribute-missing"),
        ("0271", "env_version_mismatch", "cuda-driver-mismatch"),
        ("0150", "env_version_mismatch", "extension-build-failed"),
        # a CUDA error that is not an out-of-memory, raised as torch.AcceleratorError
        ("0520", "cuda_error", "cuda-device-error"),  # cuda-runtime-error stands aside for it
        # Xid 32 (hardware) beside Xid 31 (a page fault the program could cause): the hardware is the cause
        ("0240", "gpu_hardware", "gpu-xid-hardware"),
        ("0139", "gpu_hardware", "gpu-firmware-error"),
        # non-finite metrics in any trainer's line format
        ("0612", "training_instability", "non-finite-loss"),
        ("0346", "training_instability", "non-finite-loss"),
        ("0442", "training_instability", "loss-scale-collapse"),
        # Ray: a node declared dead in the old wording, a raylet's fatal check
        ("0185", "ray_node_died", "ray-node-died"),
        ("0161", "ray_node_died", "ray-node-died"),
    ],
)
def test_real_excerpts_get_the_class_their_exception_or_message_names(case_id, cls, rule):
    got, fired = _class_and_rules(OPEN / f"{case_id}.log")
    assert got == cls
    assert rule in fired


def test_a_traceback_cut_before_its_exception_line_is_a_crash_raised_where_its_frames_end():
    """vLLM's add_request raising EngineDeadError, the paste cut inside the class name: nothing names a class, but
    an exception was raised, so it is not healthy."""
    cut = cut_traceback(_case("0101").split("\n"))
    assert cut is not None
    assert cut[1].cls == "" and cut[1].frames[-1].func == "add_request"
    verdict = _verdict(OPEN / "0101.log")
    root = verdict["root_cause"]
    assert (verdict["status"], root["class"]) == ("failed", "unknown_crash")
    assert "add_request" in root["explanation"] and "before its exception line" in root["explanation"]
    assert root["evidence"][0]["line"] == 10  # the last frame line


@pytest.mark.parametrize("case_id", ["0110", "0515"])
def test_a_complete_traceback_is_not_read_as_cut(case_id):
    assert cut_traceback(_case(case_id).split("\n")) is None


@pytest.mark.parametrize(
    ("case_id", "last_func"),
    [
        ("0085", "_init_sampling_tensors"),  # vLLM's `ERROR 02-25 11:11:34 engine.py:139] ` before every line
        ("0477", "__init__"),  # the same header, the paste cut inside the last one: `ERROR 03-31 11:1`
        ("0114", "_run_code"),  # FastChat's `2024-01-22 14:32:27 | ERROR | stderr | `
    ],
)
def test_a_traceback_printed_by_a_logger_is_read_as_cut_below_its_headers(case_id, last_func):
    cut = cut_traceback(_case(case_id).split("\n"))
    assert cut is not None
    assert cut[1].frames[-1].func == last_func
    verdict = _verdict(OPEN / f"{case_id}.log")
    assert (verdict["status"], verdict["root_cause"]["class"]) == ("failed", "unknown_crash")


def test_a_paste_cut_inside_the_ray_prefix_of_its_next_line_is_read_as_cut():
    """verl's Trainer actor importing flash_attn; the paste stops at `(Trainer pid`, the start of the next line."""
    assert _case("0320").rstrip().endswith("(Trainer pid")
    verdict = _verdict(OPEN / "0320.log")
    root = verdict["root_cause"]
    assert (verdict["status"], root["class"], root["rule"]) == ("failed", "env_version_mismatch", "import-cut-short")
    assert "flash_attn_interface.py" in root["evidence"][0]["text"]


def test_a_cut_traceback_below_a_named_exception_does_not_replace_it():
    """Ray's `Unhandled error` printout, cut inside a frame, below the ConfigKeyError it reports."""
    assert cut_traceback(_case("0469").split("\n")) is not None
    root = _verdict(OPEN / "0469.log")["root_cause"]
    assert (root["class"], root["rule"]) == ("config_error", "hydra-config-error")


def test_a_named_exception_outranks_the_frames_of_a_cut_one():
    """RayTaskError(ValueError), then the remote frames, cut: the wrapper names ValueError; the cut frames below it
    do not make a second, anonymous crash the root."""
    root = _verdict(OPEN / "0586.log")["root_cause"]
    assert root["class"] == "unknown_crash"
    assert "RayTaskError(ValueError)" in root["evidence"][0]["text"]


def test_a_small_file_that_ends_in_frames_is_scanned(tmp_path):
    rules, _ = load_rules([REPO / "patterns"])
    scanner = TextScanner(rules, line_extractors())
    ends_in_frames = _case("0475").encode()
    assert scanner.may_match([ends_in_frames, b"all is well\n"]) == [True, False]


def test_a_family_claims_a_cut_traceback_only_when_its_frames_alone_name_it(tmp_path):
    frames = ["/opt/verl/verl/trainer/main_ppo.py:run", "/opt/verl/verl/utils/config.py:validate_config"]
    telling = ExceptionMatch(("AssertionError",), frames=r":validate_config$", frames_alone=True)
    not_telling = ExceptionMatch(("AssertionError",), frames=r":validate_config$")
    assert telling.matches("", "", "", frames) and not not_telling.matches("", "", "", frames)
    assert not telling.matches("", "", "", ["/opt/verl/verl/workers/actor/dp_actor.py:update_policy"])
    assert not telling.matches("KeyError", "", "'x'", frames)  # a named exception still needs its type
    outer = [*frames, "a.py:f", "b.py:g", "c.py:h"]  # the check is an outer frame: the cut happened deeper
    assert not telling.matches("", "", "", outer)


def test_the_scanner_hands_a_cut_traceback_to_the_families(tmp_path):
    log = tmp_path / "driver.log"
    log.write_text(
        "(TaskRunner pid=2210) Traceback (most recent call last):\n"
        '(TaskRunner pid=2210)   File "/opt/verl/verl/trainer/main_ppo.py", line 211, in run\n'
        "(TaskRunner pid=2210)     validate_config(config=config, use_reference_policy=True, use_critic=False)\n"
        '(TaskRunner pid=2210)   File "/opt/verl/verl/utils/config.py", line 98, in validate_config\n'
        "(TaskRunner pid=2210)     assert config.actor_rollout_ref.rollout.n > 1, (\n",
        encoding="utf-8",
    )
    rules, _ = load_rules([REPO / "patterns"])
    sink = Sink()
    TextScanner(rules, line_extractors()).scan(log, "driver.log", sink)
    cut = [json.loads(f) for f in sink.events()["fields"] if '"truncated"' in f]
    assert len(cut) == 1
    assert cut[0]["rules"] == ["config-check-failed"]
    assert cut[0]["raised_at"]["func"] == "validate_config"


def test_an_attempt_ray_retried_is_no_failure_and_the_finished_run_is_healthy():
    """The reward task of step 3 failed twice with a ConnectionError and succeeded on the third attempt."""
    lines = (RUNS / "ray_task_retried" / "driver.log").read_text(encoding="utf-8").split("\n")
    exceptions = [i for i, line in enumerate(lines) if line.startswith("ConnectionError: ")]
    assert len(exceptions) == 2
    assert all(reported_as_retried(lines[:i]) for i in exceptions)
    verdict = _verdict(RUNS / "ray_task_retried")
    assert (verdict["status"], verdict["root_cause"]) == ("healthy", None)


def test_an_exception_that_follows_a_retry_report_of_another_task_is_still_a_failure():
    """A retry report above, then a blank line and a traceback of its own: only the report's own lines count."""
    lines = [
        "(raylet) Task f failed. There are 2 retries remaining, so the task will be retried. Error: User exception:",
        "ray::f() (pid=1, ip=10.0.0.1)",
        '  File "job.py", line 3, in f',
        "ConnectionError: refused",
        "step:4 - actor/pg_loss:0.1",
        "Traceback (most recent call last):",
        '  File "job.py", line 9, in main',
    ]
    assert reported_as_retried(lines[:3])
    assert not reported_as_retried(lines)


def test_an_unschedulable_request_is_a_hang_not_a_healthy_run():
    root = _verdict(RUNS / "ray_unschedulable")["root_cause"]
    assert (root["class"], root["rule"]) == ("hang", "ray-request-unschedulable")


def test_an_auth_token_refused_by_the_head_is_configuration_not_a_dead_node():
    verdict = _verdict(RUNS / "ray_auth_token")
    assert verdict["root_cause"]["class"] == "config_error"
    assert [s["class"] for s in verdict["symptoms"]] == ["ray_node_died"]


@pytest.mark.parametrize(
    ("previous", "cls"),
    [("149", "gpu_hardware"), ("74", "gpu_hardware"), ("31", "cuda_error"), ("13", "cuda_error")],
)
def test_a_channel_cleanup_takes_the_class_of_the_xid_that_caused_it(tmp_path, previous, cls):
    """The driver appends " caused by previous Xid N" to an Xid 45 it raises because of an earlier one (the format
    string in open-gpu-kernel-modules' robust-channel code); a kernel log cut to that line still names the first
    fault."""
    (tmp_path / "dmesg.log").write_text(
        "[1183.002231] NVRM: GPU at PCI:0000:cb:00: GPU-6e4a22b5-7a27-2c04-8b43-6d1bb2c8e1f0\n"
        f"[1183.285702] NVRM: Xid (PCI:0000:cb:00): 45, pid=3301, name=python3, Ch 00000008 caused by previous Xid "
        f"{previous}\n",
        encoding="utf-8",
    )
    assert _verdict(tmp_path)["root_cause"]["class"] == cls


def test_a_bare_exception_is_a_crash_that_names_nothing_and_a_bare_error_line_is_no_exception():
    """rllm's `raise Exception(f"Trajectory {idx} cannot complete ...")`: an exception of no particular class, so the
    verdict is unknown_crash; the autoscaler's "Error: No available node types ..." is not a Python exception."""
    root = _verdict(OPEN / "0571.log")["root_cause"]
    assert root["class"] == "unknown_crash"
    assert root["evidence"][0]["text"].startswith("Exception: Trajectory 8 cannot complete")
    assert parse_exception_line("Error: No available node types can fulfill resource request") is None
    assert parse_exception_line("Exception in thread Thread-13 (runner):") is None


def test_pytest_short_summary_states_the_exception_of_a_failed_test():
    """SkyRL's CI: `FAILED tests/...::test[...] - AssertionError: a (4) and b (1) must be the same ...`."""
    raised = parse_exception_line(
        "FAILED tests/gpu/test_ckpt.py::test_save[fsdp-False] - AssertionError: num_policy_gpus (4) and "
        "num_rollout_gpus (1) must be the same when colocating all models"
    )
    assert raised is not None and raised.cls == "AssertionError" and raised.message.startswith("num_policy_gpus")
    assert parse_exception_line("FAILED tests/test_a.py::test_b - see the log above") is None
    root = _verdict(OPEN / "0578.log")["root_cause"]
    assert (root["class"], root["rule"]) == ("config_error", "config-value-invalid")


def test_deepspeeds_launcher_reporting_a_failed_child_is_a_crash_and_a_clean_exit_is_not(tmp_path):
    log = tmp_path / "launcher.log"
    log.write_text(
        "[2024-01-01 00:00:00,000] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
        "'--local_rank=3'] exits with return code = 1\n",
        encoding="utf-8",
    )
    root = _verdict(log)["root_cause"]
    assert root["class"] == "unknown_crash" and "exits with return code = 1" in root["evidence"][0]["text"]
    log.write_text(log.read_text(encoding="utf-8").replace("code = 1", "code = 0"), encoding="utf-8")
    assert _verdict(log)["status"] == "healthy"
