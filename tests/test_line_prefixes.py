"""Colour codes are stripped from a line, also those whose ESC a paste lost, and nothing else."""

from __future__ import annotations

from forensics.line_prefixes import FileContext, attribute
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
