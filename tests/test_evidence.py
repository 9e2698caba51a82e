"""Reading the evidence: OOM numbers, key renamings, shape factors, Ray chains, cross-rank order.

Lines are the real formats quoted in the reference notes (PyTorch, Ray, NCCL, vLLM); logs built from them
go to tmp_path.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from forensics.analyses.explain.checkpoint import renaming, shape_diff
from forensics.analyses.explain.cuda_oom import OomBudget, oom_budget, oom_case
from forensics.pipeline import analyze, load_catalogue

CUDA_OOM = load_catalogue([]).entry("cuda-oom")


def parse_oom(line: str) -> OomBudget | None:
    """The budget of an OOM line as the analysis gets it: the rule's extracted fields, read by the explain room."""
    return oom_budget(CUDA_OOM.extract_fields([line]))


CURRENT_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.15 GiB. GPU 0 has a total capacity of "
    "39.56 GiB of which 6.80 GiB is free. Including non-PyTorch memory, this process has 36.61 GiB memory in use. "
    "Of the allocated memory 31.66 GiB is allocated by PyTorch, and 4.11 GiB is reserved by PyTorch but unallocated."
)

FRAGMENTED_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 2.93 GiB is free. Including non-PyTorch memory, this process has 76.10 GiB memory in use. "
    "Of the allocated memory 52.00 GiB is allocated by PyTorch, and 22.50 GiB is reserved by PyTorch but unallocated."
)


def _run(tmp_path: Path, name: str, lines: list[str]):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return analyze([path])


def test_oom_numbers_of_the_current_message():
    b = parse_oom(CURRENT_OOM)
    assert b is not None
    assert (b.gpu, b.tried, b.capacity, b.free) == (0, 3.15, 39.56, 6.80)
    assert (b.allocated, b.unused_reserved, b.this_process, b.others) == (31.66, 4.11, 36.61, 0.0)
    assert oom_case(b) == "refused_while_free"  # 3.15 GiB asked with 6.80 GiB free: a limit or a race


def test_oom_numbers_of_the_pre_2_0_message():
    b = parse_oom(
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.50 GiB already allocated; 3.50 MiB free; 14.69 GiB reserved in total by PyTorch)"
    )
    assert b is not None
    assert math.isclose(b.tried, 20 / 1024) and b.capacity == 15.78 and b.allocated == 14.50
    assert math.isclose(b.unused_reserved, 0.19, abs_tol=1e-9)
    assert oom_case(b) == "exhaustion"


def test_oom_fragmentation_and_memory_of_other_processes():
    fragmented = parse_oom(FRAGMENTED_OOM)
    assert fragmented is not None and oom_case(fragmented) == "fragmentation"
    crowded = parse_oom(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 2.93 GiB is free. Process 4711 has 40.02 GiB memory in use. Including non-PyTorch memory, "
        "this process has 36.10 GiB memory in use. Of the allocated memory 34.00 GiB is allocated by PyTorch, and "
        "1.10 GiB is reserved by PyTorch but unallocated."
    )
    assert crowded is not None and crowded.others == pytest.approx(40.02)
    assert oom_case(crowded) == "other_process"


def test_oom_explanation_reorders_the_remediation_and_quotes_earlier_peaks(tmp_path):
    result = _run(
        tmp_path,
        "driver.log",
        [
            "(TaskRunner pid=7) step:1 - actor/pg_loss:0.1 - perf/max_memory_allocated_gb:61.2",
            "(TaskRunner pid=7) step:2 - actor/pg_loss:0.1 - perf/max_memory_allocated_gb:75.5",
            "(WorkerDict pid=9, ip=10.0.0.2) " + FRAGMENTED_OOM,
        ],
    )
    root = result.verdict.root_cause
    assert root is not None and root.cls == "cuda_oom" and root.evidence[0].line == 3
    assert root.fields["oom_case"] == "fragmentation"
    assert "expandable_segments" in root.remediation[0]
    assert "75.50 GB at step 2" in root.explanation


def test_key_sets_summarised_by_their_renaming():
    missing = ["layers.0.mlp.weight", "layers.1.mlp.weight", "embed.weight"]
    unexpected = ["module.layers.0.mlp.weight", "module.layers.1.mlp.weight", "module.embed.weight"]
    assert renaming(missing, unexpected) == (
        "the checkpoint adds the prefix 'module.' (3 of 3 missing keys match an unexpected key that way)"
    )
    peft = renaming(["q_proj.weight"], ["q_proj.base_layer.weight"])
    assert peft is not None and "'.base_layer'" in peft


def test_hf_checkpoint_into_megatron_core_model(tmp_path):
    result = _run(
        tmp_path,
        "load.log",
        [
            "RuntimeError: Error(s) in loading state_dict for GPTModel:",
            '\tMissing key(s) in state_dict: "decoder.layers.0.self_attention.linear_qkv.weight", '
            '"decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.self_attention.linear_qkv.weight". ',
            '\tUnexpected key(s) in state_dict: "model.layers.0.self_attn.q_proj.weight", '
            '"model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.q_proj.weight". ',
        ],
    )
    root = result.verdict.root_cause
    assert root is not None and root.cls == "weight_key_mismatch"
    assert root.fields["key_naming"] == {"model": "Megatron-core", "checkpoint": "Hugging Face"}
    assert "converter_hf_to_mcore" in root.explanation
    assert "decoder.layers.N.{" in root.explanation


@pytest.mark.parametrize(
    ("key", "ckpt", "model", "kind", "factor"),
    [
        ("decoder.layers.0.self_attn.q_proj.weight", (4096, 4096), (1024, 4096), "tp_shard", 4),
        ("decoder.layers.0.final_layer_norm.weight", (12288,), (768,), "model_size", None),
        ("decoder.layers.0.fc1.weight", (49152, 12288), (3072, 768), "model_size", None),
        ("model.embed_tokens.weight", (151936, 4096), (152064, 4096), "vocabulary", None),
    ],
)
def test_shape_differences(key, ckpt, model, kind, factor):
    d = shape_diff(key, ckpt, model)
    assert d is not None and d.kind == kind and d.factor == factor


def test_innermost_ray_task_is_named_with_its_host(tmp_path):
    result = _run(
        tmp_path,
        "driver.log",
        [
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=11, ip=10.0.0.1, actor_id=ab)",
            '  File "verl/single_controller/ray/base.py", line 47, in func',
            "    output = ray.get(output)",
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() "
            "(pid=22, ip=10.0.0.7, actor_id=cd)",
        ],
    )
    root = result.verdict.root_cause
    assert root is not None and root.rule == "out-of-memory-error"  # no remote traceback: taken for torch's
    assert root.evidence[0].line == 4 and root.host == "10.0.0.7"
    assert "WorkerDict.actor_rollout_update_actor (pid 22 on 10.0.0.7)" in root.explanation
    assert "re-raised by TaskRunner.run" in root.explanation


def test_host_oom_explains_the_wrapped_oom_and_the_dead_actor(tmp_path):
    result = _run(
        tmp_path,
        "driver.log",
        [
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=11, ip=10.0.0.1, actor_id=ab)",
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "Memory on the node (IP: 10.0.0.1, ID: db89) where the lease (lease ID: 0100, name=WorkerDict.__init__, "
            "pid=3048142, memory used=49.21GB) was running was 59.84GB / 62.51GB (0.957347), which exceeds the "
            "memory usage threshold of 0.95. Ray killed this worker (ID: a4f5) because it was the most recently "
            "scheduled task;",
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        ],
    )
    v = result.verdict
    assert v.root_cause is not None and v.root_cause.cls == "host_oom"
    # the wrapper's printout ends with Ray's OutOfMemoryError: a host-memory kill, not a CUDA OOM symptom
    assert {s.cls for s in v.symptoms} == {"host_oom", "ray_actor_died"}
    wrapper = next(f for f in result.findings if f.evidence[0].line == 1)
    assert (wrapper.rule, wrapper.cls) == ("ray-out-of-memory-error", "host_oom")
    assert "59.84 GB of 62.51 GB" in v.root_cause.explanation and v.root_cause.host == "10.0.0.1"


def test_dead_actor_is_a_symptom_of_an_exception_no_rule_knows(tmp_path):
    result = _run(
        tmp_path,
        "driver.log",
        [
            "(WorkerDict pid=5, ip=10.0.0.3) Traceback (most recent call last):",
            '(WorkerDict pid=5, ip=10.0.0.3)   File "reward.py", line 3, in score',
            "(WorkerDict pid=5, ip=10.0.0.3) ZeroDivisionError: division by zero",
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        ],
    )
    root = result.verdict.root_cause
    assert root is not None and root.cls == "unknown_crash" and root.evidence[0].line == 3
    assert [s.cls for s in result.verdict.symptoms] == ["ray_actor_died"]


def test_log_lines_of_native_components_are_not_crashes(tmp_path):
    result = _run(
        tmp_path,
        "gcs_server.out",
        [
            "[2026-11-30 05:11:18,469 I 6498 6498] (gcs_server) gcs_actor_manager.cc:1999: Node with actor is "
            "already dead, return status: Invalid: KillActor RPC failed for actor 6ec9: RpcError: RPC error: "
            "Cancelling all calls",
        ],
    )
    assert result.verdict.status == "healthy"


def test_lagging_rank_named_from_enqueued_numbers(tmp_path):
    result = _run(
        tmp_path,
        "train.log",
        [
            "[rank0]:[E1016 03:31:38.929 ProcessGroupNCCL.cpp:1709] [PG 0 Rank 0] Timeout at NCCL work: 9141, "
            "last enqueued NCCL work: 9141, last completed NCCL work: 9140.",
            "[rank1]:[E1016 03:31:38.930 ProcessGroupNCCL.cpp:1709] [PG 0 Rank 1] Timeout at NCCL work: 9141, "
            "last enqueued NCCL work: 9141, last completed NCCL work: 9140.",
            "[rank2]:[E1016 03:31:38.931 ProcessGroupNCCL.cpp:1709] [PG 0 Rank 2] Timeout at NCCL work: 9140, "
            "last enqueued NCCL work: 9140, last completed NCCL work: 9139.",
        ],
    )
    root = result.verdict.root_cause
    assert root is not None and root.cls == "nccl_timeout" and root.rank == 2
    assert "Rank 2 enqueued only up to collective 9140" in root.explanation


def test_undecidable_timeout_names_no_rank_and_lists_candidates(tmp_path):
    watchdog = (
        "[rank{r}]:[E1130 05:20:11.123 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=58, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600020 "
        "milliseconds before timing out."
    )
    init = "node1:100{r}:200 [{r}] NCCL INFO comm 0x55 rank {r} nranks 4 cudaDev {r} busId 1000 - Init COMPLETE"
    lines = [init.format(r=r) for r in range(3)] + [watchdog.format(r=r) for r in range(2)]
    root = _run(tmp_path, "train.log", lines).verdict.root_cause
    assert root is not None and root.cls == "nccl_timeout"
    assert root.rank is None and root.fields["candidate_ranks"] == [2, 3]
    assert "cannot tell" in root.explanation and "no lines at all from [3]" in root.explanation


def test_rank_that_joined_late_is_named_from_watchdog_times(tmp_path):
    """torch 2.11 words: rank 0 gives up at SeqNum 57; rank 1, stuck elsewhere, times out a minute later at 63."""
    timeout = (
        "[rank{r}]:[E1130 05:{m}:38.4 ProcessGroupNCCL.cpp:689] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=524288, NumelOut=524288, Timeout(ms)=30000) "
        "ran for 30064 milliseconds before timing out."
    )
    state = (
        "[rank{r}]:[E1130 05:{m}:38.5 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank {r}]  failure "
        "detected by watchdog at work sequence id: {s} PG status: last enqueued work: {e}, last completed work: {d}"
    )
    lines = [
        timeout.format(r=0, m=19, s=57),
        state.format(r=0, m=19, s=57, e=61, d=56),
        timeout.format(r=1, m=20, s=63),
        state.format(r=1, m=20, s=63, e=67, d=62),
    ]
    root = _run(tmp_path, "train.log", lines).verdict.root_cause
    assert root is not None and root.cls == "nccl_timeout"
    assert root.rank == 1  # not rank 0, whose enqueued numbers are lower only because it stopped first
    assert "rank(s) [1] timed out only 60 s later" in root.explanation


def test_collective_mismatch_reads_each_ranks_own_fingerprint(tmp_path):
    report = (
        "[rank{r}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {r} is running collective: "
        "CollectiveFingerPrint(SequenceNumber=30, OpType={op}, TensorShape=[{shape}], TensorDtypes=Float), but Rank "
        "{o} is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=SCATTER)."
    )
    lines = [report.format(r=0, o=1, op="ALLREDUCE", shape="4"), report.format(r=1, o=0, op="ALLGATHER", shape="3, 5")]
    root = _run(tmp_path, "train.log", lines).verdict.root_cause
    assert root is not None and root.cls == "collective_mismatch" and root.rank is None
    assert "rank(s) [0] run ALLREDUCE [4] Float; rank(s) [1] run ALLGATHER [3, 5] Float" in root.explanation


def test_oom_after_steady_growth_is_called_a_leak(tmp_path):
    steps = [
        f"step:{s} - actor/pg_loss:0.1 - perf/max_memory_allocated_gb:{1.6 + 6 * (s - 1):.1f}" for s in range(1, 8)
    ]
    oom = (
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 1 has a total capacity "
        "of 79.11 GiB of which 5.62 GiB is free. Including non-PyTorch memory, this process has 73.17 GiB memory in "
        "use. Of the allocated memory 71.49 GiB is allocated by PyTorch, and 0.14 GiB is reserved by PyTorch but "
        "unallocated."
    )
    root = _run(tmp_path, "train.log", [*steps, oom]).verdict.root_cause
    assert root is not None and root.cls == "cuda_oom" and root.rank == 1
    assert root.fields["oom_case"] == "exhaustion" and root.fields["memory_trend"] == "leak"
    assert "grows from step to step" in root.remediation[0]
