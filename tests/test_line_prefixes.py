"""Colour codes are stripped from a line, also those whose ESC a paste lost, and nothing else."""

from __future__ import annotations

from forensics.line_prefixes import RANK_IN_MESSAGE, FileContext, attribute
from forensics.pipeline import analyze
from tests.conftest import REPO


def test_a_colour_code_that_lost_its_esc_is_stripped_but_a_bracketed_word_is_kept():
    ucx = "[master:19546:0:19546] ib_mlx5_log.c:139  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15)"
    assert attribute(ucx, FileContext()).body == ucx  # UCX's [host:pid:thread:tid] prefix, from corpus case 0244
    ray = "[36m(TaskRunner pid=1)[0m ValueError: bad config"
    assert attribute(ray, FileContext()).body.endswith("ValueError: bad config")
    assert "[0m" not in attribute(ray, FileContext()).body


def test_a_harness_stream_name_is_peeled_and_torchruns_summary_read_behind_it():
    line = "stderr: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    assert attribute(line, FileContext()).body == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    a = analyze([REPO / "corpus" / "cases" / "open" / "0329.log"])  # accelerate's test runner: `stderr: ` on each line
    rc = a.verdict.root_cause
    assert a.verdict.status == "failed" and rc.cls == "unknown_crash"
    assert (rc.rank, rc.host) == (1, "wph178") and rc.evidence[0].text.strip() == "exitcode  : 1 (pid: 8835)"


def test_the_rank_a_torch_message_was_raised_on_is_read_from_its_words():
    """torch's desync check names its own rank first; communicator setup names it in brackets; a torchrun failure
    entry pasted flat keeps `rankN (local rank: N)`. A rank a message only mentions as a peer is not taken."""
    said = {
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE), but Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).": 1,
        "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from "
        "[0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout": 3,
        "rank2 (local rank: 2)exitcode: -9 (pid: 36071)error file: <N/A>": 2,
        "retrieving ncclUniqueId from [0] via c10d key-value store": None,
    }
    for line, rank in said.items():
        assert attribute(line, FileContext()).rank == rank, line


def test_every_way_of_naming_a_rank_holds_what_attribute_checks_for_before_searching():
    """attribute() searches RANK_IN_MESSAGE only in lines holding "ank" or "communicator"; a new alternative
    must hold one of them too, or its lines would never be searched."""
    alternatives, depth, start = [], 0, 0
    pattern = RANK_IN_MESSAGE.pattern
    for i, char in enumerate(pattern):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0) if pattern[i - 1 : i] != "\\" else 0
        if char == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
    alternatives.append(pattern[start:])
    assert len(alternatives) >= 6
    assert all("ank" in alt or "communicator" in alt for alt in alternatives), alternatives


def test_a_dotted_exception_class_with_a_digit_is_not_a_host_prefix():
    """`node-12: ` is a host's prefix (pdsh, clush); `vllm.v1.engine.exceptions.EngineDeadError: ` is an
    exception line whose module path holds a digit, and the class must stay in the line's body."""
    line = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
    assert attribute(line, FileContext()).body == line
    assert attribute("node-12: RuntimeError: boom", FileContext()).host == "node-12"


def test_a_syslog_or_ci_timestamp_is_peeled_and_a_traceback_behind_it_read():
    """journalctl's `Mon DD HH:MM:SS host prog[pid]: ` gives the host, pid and time (the year from the file); a
    CI console's bare `Mon DD HH:MM:SS ` is peeled by one space, so a traceback keeps its indentation."""
    vllm = "Sep 22 23:46:42 ml2-1-a100-1 vllm[361991]: INFO 09-22 23:46:42 metrics.py:351] Avg prompt throughput"
    ctx = attribute(vllm, FileContext(year=2024))
    assert ctx.body.startswith("INFO 09-22") and (ctx.host, ctx.pid) == ("ml2-1-a100-1", 361991)
    assert ctx.ts is not None and ctx.ts.isoformat() == "2024-09-22T23:46:42+00:00"
    frame = "Jul 13 21:22:34     dist.barrier()"
    assert attribute(frame, FileContext()).body == "    dist.barrier()"
    a = analyze([REPO / "corpus" / "cases" / "open" / "1941.log"])  # PyTorch CI: a gloo barrier's peer went away
    rc = a.verdict.root_cause
    assert rc.cls == "nccl_error" and rc.rule == "comm-transport-error"
    assert "Connection closed by peer" in rc.evidence[0].text
