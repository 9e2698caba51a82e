"""Distributed communication and progress, on real excerpts: timeouts, NCCL and transport errors, mismatches,
hangs seen only in stack dumps, per-rank timing tables; and which came first when an NCCL error and a timeout
are both in the logs."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from forensics.analyses.rank_timings import rank_timing_spread
from forensics.pipeline import analyze
from forensics.sources.rank_measurements import _measurements

OPEN_CASES = Path(__file__).resolve().parents[1] / "corpus" / "cases" / "open"

# (open case, class, rule, line of the first evidence, rank or ..., words of the explanation)
CASES = [
    # a wrapper line ("watchdog thread terminated with exception: <reason>") is read as its reason
    ("0168", "nccl_timeout", "nccl-watchdog-timeout", 1, 2, "only rank 2's timeout is in these logs"),
    ("0397", "nccl_timeout", "nccl-watchdog-timeout", 7, 1, ""),  # hard-wrapped at 75 columns
    ("0355", "nccl_timeout", "nccl-watchdog-timeout", 21, 5, ""),  # cut in the middle of the word
    ("0534", "nccl_timeout", "nccl-watchdog-timeout", 1, ..., ""),  # the flight-recorder dump signal
    ("0701", "nccl_timeout", "nccl-watchdog-timeout", 1, 2, ""),  # a rule's last-enqueued text beside a reader's number
    ("0207", "nccl_timeout", "watchdog-hang", 1, ..., ""),  # the heartbeat monitor
    ("0349", "nccl_timeout", "rendezvous-timeout", 5, ..., ""),  # the store carrying the NCCL unique id
    ("0094", "nccl_error", "nccl-warn-failure", 4, ..., "no network interface"),
    ("0205", "nccl_error", "nccl-return-chain", 14, ..., ""),  # the "file:line -> 2" return chain, no WARN line
    ("0243", "nccl_error", "comm-transport-error", 1, ..., ""),  # RDMA retry counter exceeded
    ("0206", "nccl_error", "c10d-connection-error", 6, ..., ""),  # raised from init_process_group
    ("0446", "nccl_error", "dist-backend-error", 14, ..., ""),  # RayTaskError(DistBackendError), message cut
    ("0698", "collective_mismatch", "collective-op-mismatch", 4, 0, "_ALLGATHER_BASE of 75264 elements on rank(s) [0]"),
    ("0259", "collective_mismatch", "collective-mismatch", 1, ..., "posted 496640 bytes"),
    ("0615", "collective_mismatch", "collective-mismatch", 4, 7, "names rank(s) [7]"),  # desync report's next line
    ("0639", "collective_mismatch", "collective-mismatch", 1, ..., "(peer 192.168.161.30) 1048576"),
    ("0148", "hang", "stuck-process-stack-dump", 5, ..., "wait (threading.py:355)"),  # the dump's MainThread line
    ("0253", "hang", "stuck-process-stack-dump", 2, ..., ""),  # gdb -p, quoted in a reply
    ("0097", "hang", "progress-stalled", 2, ..., "waiting 60 s"),
    ("0840", "hang", "progress-stalled", 5, ..., ""),  # SGLang's newer "Watchdog timeout (self.watchdog_timeout=300)"
    ("0857", "hang", "stuck-process-stack-dump", 1, ..., ""),  # a faulthandler frame inside all_reduce
    ("0859", "hang", "stuck-process-stack-dump", 1, ..., ""),  # cuda-gdb's `info cuda kernels` on a stuck rank
    ("0845", "gpu_hardware", "gpu-firmware-error", 3, ..., ""),  # NVRM: the GSP's heartbeat timed out
    ("0836", "gpu_hardware", "nvlink-error", 4, ..., ""),  # a socket's ENOTCONN above it is not storage
    ("0624", "straggler", "rank-timing-spread", 1, None, "rank 3 arrived last"),
]
FIXTURE_RUNS = Path(__file__).resolve().parent / "fixtures" / "runs"


@pytest.mark.parametrize(("case", "cls", "rule", "line", "rank", "words"), CASES, ids=[c[0] for c in CASES])
def test_real_excerpt_verdict(case, cls, rule, line, rank, words):
    root = analyze([OPEN_CASES / f"{case}.log"]).verdict.root_cause
    assert root is not None
    assert (root.cls, root.rule, root.evidence[0].line) == (cls, rule, line)
    if rank is not ...:
        assert root.rank == rank
    assert words in root.explanation


def _run(tmp_path: Path, lines: list[str]):
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written = datetime(2025, 11, 25, tzinfo=timezone.utc).timestamp()  # c10 times take the year from the file
    os.utime(path, (written, written))
    return analyze([path]).verdict


TIMEOUT = (
    "[rank0]:[E1124 11:{m}:21.001 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=58, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600020 milliseconds "
    "before timing out."
)
PEER_GONE = (
    "[2025-11-24 11:{m}:22] gpu-server320:1234:1299 [5] misc/socket.cc:58 NCCL WARN socketProgress: Connection "
    "closed by remote peer gpu-server321<42830>"
)


def test_an_nccl_error_before_the_timeout_is_its_cause(tmp_path):
    verdict = _run(tmp_path, [PEER_GONE.format(m="10"), TIMEOUT.format(m="20")])
    assert verdict.root_cause.cls == "nccl_error"
    assert "nccl_timeout" in [s.cls for s in verdict.symptoms]


def test_an_nccl_error_after_the_timeout_is_its_consequence(tmp_path):
    """The rank that timed out tore its communicator down: its peers then see the connection close."""
    verdict = _run(tmp_path, [TIMEOUT.format(m="20"), PEER_GONE.format(m="20")])
    assert verdict.root_cause.cls == "nccl_timeout"
    assert [s.cls for s in verdict.symptoms] == ["nccl_error"]


def test_the_watchdog_wrapper_printed_with_its_timeout_is_the_timeout(tmp_path):
    """The watchdog prints 'Some NCCL operations have failed or timed out' a millisecond before its reason."""
    wrapper = (
        "[rank3]:[E1124 11:20:03.614679108 ProcessGroupNCCL.cpp:684] [Rank 3] Some NCCL operations have failed or "
        "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
        "corrupted/incomplete data."
    )
    reason = (
        "[rank3]:[E1124 11:20:03.616086576 ProcessGroupNCCL.cpp:1899] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process "
        "group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=460631, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 "
        "milliseconds before timing out."
    )
    verdict = _run(tmp_path, [wrapper, reason])
    assert (verdict.root_cause.cls, verdict.root_cause.rule) == ("nccl_timeout", "nccl-watchdog-timeout")
    assert verdict.root_cause.evidence[0].line == 2


def test_a_row_per_rank_is_split_into_its_measurements():
    row = "has data tensor(4., device='cuda:0') time cost 23.34592056274414 bandwidth 17.133614368513168"
    template, shared, measures, rates = _measurements(row)
    assert template == "has data tensor(4., device='cuda:#') time cost # bandwidth #"
    assert shared == []  # the device index differs per rank: it does not split the table
    assert measures == {"cost": 23.34592056274414, "bandwidth": 17.133614368513168}
    assert rates == ["bandwidth"]


def test_rows_of_torchrun_ranks_form_one_table(tmp_path):
    """The rank may come from the torchrun prefix instead of the text; rows of other steps stay apart."""
    rows = [line.replace("> ", "") for line in (OPEN_CASES / "0624.log").read_text().splitlines()]
    lines = [f"[rank{r}]: step 7:{row.split('has data', 1)[1]}" for r, row in enumerate(rows)]
    lines += [f"[rank{r}]: step 8: time cost 2.5 bandwidth 150.0" for r in range(4)]
    verdict = _run(tmp_path, lines)
    assert verdict.root_cause.rule == "rank-timing-spread"
    assert verdict.root_cause.fields["values"] == {
        0: 23.34592056274414,
        1: 7.981215953826904,
        2: 3.405440092086792,
        3: 2.7865920066833496,
    }


@pytest.mark.parametrize("case", ["0068", "0005", "0059"])
def test_step_logs_and_benchmark_tables_are_not_per_rank_tables(tmp_path, case):
    """Healthy controls: step lines with a slow data-loading step, Megatron iterations, an nccl-tests table."""
    shutil.copy(OPEN_CASES / f"{case}.log", tmp_path / "train.log")
    result = analyze([tmp_path / "train.log"])
    assert rank_timing_spread(result.events, {}) == []
    assert result.verdict.status == "healthy"


def test_a_timed_collective_names_the_rank_that_arrived_last():
    """Real 4-rank Gloo run: rank 3 starts each timed all_reduce 0.4 s late; it spends the least time in it."""
    root = analyze([FIXTURE_RUNS / "gloo_rank_timing"]).verdict.root_cause
    assert (root.cls, root.rank) == ("straggler", 3)
    assert root.fields["quickest"] == 3 and root.fields["spread"] > 40
    assert "rank 3, with the least time in it, arrived last" in root.explanation


def test_a_gloo_timeout_names_the_rank_that_never_timed_out():
    """Real 2-rank Gloo run: rank 0 times out; rank 1, asleep, logged but never timed out."""
    root = analyze([FIXTURE_RUNS / "gloo_timeout"]).verdict.root_cause
    assert (root.cls, root.rank) == ("nccl_timeout", 1)
    assert "Rank 1 logged but never timed out while ranks [0] waited" in root.explanation


def test_lines_that_only_name_a_rank_are_not_read_and_the_last_error_still_is(tmp_path):
    """NCCL INFO and ProcessGroupNCCL lines name ranks by the hundred thousand: Rust's engine leaves out those with
    no measurement hint, so they neither cost a Python read each nor use up the distinct matching lines a file is
    read for (MAX_HITS_PER_FILE), past which its final OOM would go unread."""
    lines = [
        f"node{r % 64}:{r}:{r} [{r % 8}] NCCL INFO comm 0x{r:x} rank {r} nranks 4096 cudaDev {r % 8}"
        for r in range(210_000)
    ]
    lines.append(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    )
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    result = analyze([tmp_path / "train.log"])
    assert not [w for w in result.warnings if "distinct matching lines" in w]
    assert result.verdict.root_cause.rule == "cuda-oom"


def test_past_the_cap_of_distinct_lines_a_file_s_errors_are_still_read(tmp_path, monkeypatch):
    """A flood of distinct warnings (a retried request, each with its own object address) uses up the distinct
    lines a file is read for; the failure at the end of the file is still read, and the report says what was
    left out."""
    monkeypatch.setattr("forensics.scan.MAX_HITS_PER_FILE", 200)
    flood = (
        "2025-10-21 00:02:{s:02d},917 - verl.utils.reward_score.sandbox_fusion - WARNING - sandbox request failed, "
        "retrying: requests.exceptions.ConnectionError: HTTPConnectionPool(host='sandbox', port=8080): Max retries "
        "exceeded (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f{i:08x}>: "
        "Failed to establish a new connection'))"
    )
    lines = [flood.format(s=i % 60, i=i) for i in range(1000)]
    lines.append(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    )
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    result = analyze([tmp_path / "train.log"])
    assert [w for w in result.warnings if "after them only the lines of error rules were read" in w]
    assert (result.verdict.root_cause.rule, result.verdict.root_cause.evidence[0].line) == ("cuda-oom", 1001)


def test_a_monitored_barrier_names_the_rank_it_waited_for(tmp_path):
    """Gloo's monitored barrier, printed on rank 1, blames rank 0: rank 0 is the finding's rank; a barrier that
    lists the ranks that did not pass names them."""
    log = tmp_path / "rank1.log"
    log.write_text(
        "[rank1]: RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n",
        encoding="utf-8",
    )
    root = analyze([log]).verdict.root_cause
    assert (root.cls, root.rule, root.rank) == ("nccl_timeout", "monitored-barrier-failed", 0)
    assert "waited in vain for rank 0" in root.explanation
    log.write_text(
        "RuntimeError: [Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 1800000 ms\n", encoding="utf-8"
    )
    root = analyze([log]).verdict.root_cause
    assert root.rank is None and root.fields["lagging_ranks"] == [1, 2]
