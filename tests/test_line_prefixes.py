"""Colour codes are stripped from a line, also those whose ESC a paste lost, and nothing else."""

from __future__ import annotations

from forensics.line_prefixes import FileContext, attribute


def test_a_colour_code_that_lost_its_esc_is_stripped_but_a_bracketed_word_is_kept():
    ucx = "[master:19546:0:19546] ib_mlx5_log.c:139  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15)"
    assert attribute(ucx, FileContext()).body == ucx  # UCX's [host:pid:thread:tid] prefix, from corpus case 0244
    ray = "[36m(TaskRunner pid=1)[0m ValueError: bad config"
    assert attribute(ray, FileContext()).body.endswith("ValueError: bad config")
    assert "[0m" not in attribute(ray, FileContext()).body
