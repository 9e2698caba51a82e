"""Normalisation and fingerprints on real lines: the public corpus and our Ray captures."""

from __future__ import annotations

import pytest

from forensics.fingerprint import fingerprint, normalise

# corpus 012_nccl_timeout.log and 014_nccl_timeout.log: two different jobs, torch 2.x watchdog lines
WATCHDOG_012_RANK3 = (
    "    [rank3]:[E816 01:45:40.212150935 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=80078, OpType=ALLREDUCE, NumelIn=2106881, NumelOut=2106881, Timeout(ms)=600000) "
    "ran for 600013 milliseconds before timing out."
)
WATCHDOG_012_RANK7 = (
    "    [rank7]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) "
    "ran for 600026 milliseconds before timing out."
)
WATCHDOG_014_RANK1 = (
    "(WorkerDict pid=231421) [rank1]:[E314 14:33:45.172185860 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600009 milliseconds before timing out."
)
# our Ray captures (tests/fixtures/diff): the same message in two runs, other pid and run folder
CHECKPOINT_HEALTHY = (
    "\x1b[36m(TaskRunner pid=31714)\x1b[0m Checkpoint tracker file does not exist: /data/runs/ray_healthy/"
    "checkpoints/verl_grpo_example_gsm8k/qwen2_5_0_5b_grpo/latest_checkpointed_iteration.txt"
)
CHECKPOINT_OOM = (
    "\x1b[36m(TaskRunner pid=900)\x1b[0m Checkpoint tracker file does not exist: /data/runs/ray_memory_monitor/"
    "checkpoints/verl_grpo_example_gsm8k/qwen2_5_0_5b_grpo/latest_checkpointed_iteration.txt"
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            # corpus 002_cuda_oom.log: Ray wrapper with pid, IP, actor id and object address
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::Runner.run() (pid=104449, ip=10.130.71.7, "
            "actor_id=36b6798a692f88dfb0e149e301000000, repr=<main.Runner object at 0x783e766c0ca0>)",
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::Runner.run() (pid=<n>, ip=<ip>, actor_id=<hex>, "
            "repr=<main.Runner object at <hex>>)",
        ),
        (
            WATCHDOG_014_RANK1,
            "[E<ts> ProcessGroupNCCL.cpp:<n>] [Rank <n>] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=<n>, OpType=ALLREDUCE, NumelIn=<n>, NumelOut=<n>, Timeout(ms)=<n>) ran for <n> "
            "milliseconds before timing out.",
        ),
        (
            # corpus 074_cuda_oom.log (cut): sizes and the GPU index go, the message stays
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.11 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 8.51 GiB is free. Process 148220 has 70.56 GiB memory in use.",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <n> GiB. GPU <n> has a total capacity of "
            "<n> GiB of which <n> GiB is free. Process <n> has <n> GiB memory in use.",
        ),
        (
            # corpus 037: vLLM's month-day timestamp
            "ERROR 10-25 00:26:24 registry.py:272] ModuleNotFoundError: No module named 'transformers'",
            "ERROR <ts> registry.py:<n>] ModuleNotFoundError: No module named 'transformers'",
        ),
        # corpus 053: the errno names the failure and stays
        ("OSError: [Errno 28] No space left on device", "OSError: [Errno 28] No space left on device"),
        (
            # corpus: kernel Xid line; the Xid code stays, the uptime and PCI address go
            "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
            "[<n>] NVRM: Xid (PCI:<pci>): 79, GPU has fallen off the bus.",
        ),
        (
            # Ray capture ray_memory_monitor: raylet OOM-killer summary, with Ray's colour prefix
            "\x1b[33m(raylet)\x1b[0m [2026-11-30 05:19:19,310 E 638 638] (raylet) node_manager.cc:3517: 1 Workers "
            "(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node "
            "(ID: 25d2d42416503bc8ce4aa769229a85c82db6b5ba779edbf72c0ec323, IP: 192.0.2.2) over the last time period.",
            "[<ts> E <n> <n>] (raylet) node_manager.cc:<n>: <n> Workers (tasks / actors) killed due to memory "
            "pressure (OOM), <n> Workers crashed due to other reasons at node (ID: <hex>, IP: <ip>) over the last "
            "time period.",
        ),
        (
            # Ray capture ray_memory_monitor: a traceback frame keeps the file name, not the install path
            '  File "/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 3009, in get',
            'File "<path>/worker.py", line <n>, in get',
        ),
    ],
)
def test_normalise_real_lines(line, expected):
    assert normalise(line) == expected


def test_nccl_origin_and_peer_address_are_dropped():
    # shared/reference/nccl-torch-nsys-gpu.md, from NVIDIA/nccl issue threads
    line = (
        "a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from "
        "10.200.84.247<58355> failed : Broken pipe"
    )
    assert normalise(line, ["a100-st-p4d24xlarge-22"]) == (
        "<host>:<n>:<n> misc/socket.cc:<n> NCCL WARN Net : Call to recv from <ip><<n>> failed : Broken pipe"
    )
    wrapped = "(WorkerDict pid=3569860) degamts15:3569860:3571297 [0] NCCL INFO Channel 20/24 : 0 1 2 3 4 5 6 7"
    assert normalise(wrapped) == "<host>:<n>:<n> NCCL INFO Channel <n>/<n> : <n> <n> <n> <n> <n> <n> <n> <n>"


def test_known_host_names_are_replaced_inside_a_message():
    line = "ray.exceptions.ActorDiedError: The actor died because its node died. Node: gpu-a17 (IP: 10.1.4.17)"
    assert normalise(line, ["gpu-a17"]).endswith("Node: <host> (IP: <ip>)")


def test_the_same_bug_in_two_jobs_shares_a_fingerprint():
    rule = "nccl-watchdog-timeout"
    assert fingerprint(rule, WATCHDOG_012_RANK3) == fingerprint(rule, WATCHDOG_014_RANK1)
    assert fingerprint("other-rule", WATCHDOG_012_RANK3)[0] != fingerprint(rule, WATCHDOG_012_RANK3)[0]


def test_a_different_collective_is_a_different_bug():
    rule = "nccl-watchdog-timeout"
    assert fingerprint(rule, WATCHDOG_012_RANK7)[0] != fingerprint(rule, WATCHDOG_012_RANK3)[0]


def test_run_folders_and_pids_do_not_split_a_message():
    assert fingerprint("x", CHECKPOINT_HEALTHY) == fingerprint("x", CHECKPOINT_OOM)
    assert normalise(CHECKPOINT_OOM) == (
        "Checkpoint tracker file does not exist: <path>/latest_checkpointed_iteration.txt"
    )


def test_exit_codes_and_signals_are_kept():
    a = normalise("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode  : -9 (pid: 1234)")
    b = normalise("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode  : 1 (pid: 99)")
    assert "exitcode : -9" in a and "(pid: <n>)" in a
    assert a != b


def test_secrets_never_reach_the_signature():
    line = (
        "requests.exceptions.HTTPError: 401 for https://user:hunter2secret@hub.example.com/api "
        "token=hf_abcdefghijklmnopqrstuvwx"
    )
    signature = normalise(line)
    assert "hunter2secret" not in signature and "hf_abcdefghijklmnopqrstuvwx" not in signature
