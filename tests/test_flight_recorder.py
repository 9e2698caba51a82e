"""Flight-recorder verdicts on dumps written by PyTorch's own recorder, and on the real 2×H200 NCCL dumps,
compared with PyTorch's `torchfrtrace` (fr_trace) run in-process on the same folders.

The dumps: tests/fixtures/fr (2-rank gloo jobs, scripts/capture/fr_cases.py) and
tests/fixtures/runs/stall_timeout_fr/fr (NCCL, rank 1 stuck before collective 57). The comparisons need
torch (`pip install -e '.[fr]'`) and are skipped without it; the forensics halves always run.
"""

from __future__ import annotations

import copy
import io
import logging
import pickle
import shutil
from pathlib import Path

import pytest

from forensics.analyses.flight_recorder import entry_mismatch
from forensics.model import Analysis
from forensics.pipeline import analyze

FR = Path(__file__).parent / "fixtures" / "fr"
STALL = Path(__file__).parent / "fixtures" / "runs" / "stall_timeout_fr" / "fr"


def _fr(folder: Path) -> Analysis:
    return analyze([folder])


def _findings(a: Analysis, rule: str) -> list:
    return [f for f in a.findings if f.rule == rule]


class FrTrace:
    """torchfrtrace's verdict on a folder: its database (or the error it refused with) and what it logged.

    The dumps are handed to its builder in rank order: it reads them in the directory's order, and its
    matching of a coalesced group of collectives (`match_coalesced_groups_with_non_p2p`) compares the lowest
    rank with itself when another rank's dump was read first, reporting a healthy group as "not all ranks
    joining" (PyTorch 2.13)."""

    def __init__(self, folder: Path):
        fr = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir

        log = io.StringIO()
        handler = logging.StreamHandler(log)
        logger = logging.getLogger("Flight Recorder")
        logger.addHandler(handler)
        self.db, self.error = None, None
        try:
            args = JobConfig().parse_args([str(folder)])
            details, version = read_dir(args)
            details = dict(sorted(details.items(), key=lambda kv: kv[1]["rank"]))
            self.db = fr.build_db(details, args, version)
        except AssertionError as exc:
            self.error = str(exc)
        finally:
            logger.removeHandler(handler)
        self.log = log.getvalue()

    @property
    def flagged(self) -> list:
        """The collectives fr_trace reports as broken: a failed check or missing ranks."""
        return [c for c in self.db.collectives if c.pass_check is False or c.missing_ranks]


# --- the forensics verdicts (no torch needed) ------------------------------------------------------


def test_healthy_dumps_give_no_finding():
    a = _fr(FR / "healthy")
    assert [f.rule for f in a.findings] == [] and a.verdict.status == "healthy"


def test_dtype_mismatch_is_found():
    (f,) = _findings(_fr(FR / "dtype_mismatch"), "fr-collective-mismatch")
    assert (f.fields["seq"], f.fields["kind"], f.fields["rank"]) == (4, "dtype", 1)
    assert f.title == "Ranks issued different collectives (dtype)"
    assert "rank 1 gloo:all_reduce input sizes [[4]] dtypes ['Int']" in f.explanation


def test_uneven_all_to_all_is_legal():
    a = _fr(FR / "alltoall_uneven")
    assert _findings(a, "fr-collective-mismatch") == [] and a.verdict.status == "healthy"


def test_a_rank_without_a_dump_is_named_and_counts_against_it():
    a = _fr(FR / "missing_dump")
    (f,) = _findings(a, "fr-missing-dump")
    assert (f.rank, f.severity, f.cls) == (1, "error", "hang")
    assert any("no dump from rank(s) 1 of 2 ranks" in w for w in a.warnings)
    assert a.verdict.status != "healthy" and a.verdict.root_cause is f


def test_a_rank_far_behind_names_its_first_missing_collective_not_the_buffer_start():
    """Rank 1 stopped at #100; rank 0 went on to #357 and its 200-entry ring buffer starts at #158."""
    (f,) = _findings(_fr(FR / "far_behind"), "fr-rank-never-joined")
    assert (f.rank, f.fields["seq"], f.fields["in_buffers"]) == (1, 101, False)
    assert "never issued collective #101" in f.explanation and "(from #158)" in f.explanation


def _coalesced(folder: Path, out: Path, sizes_on_rank_1: list[int]) -> Path:
    """The healthy dumps with collective #4 made a coalesced group of two all-reduces, as ProcessGroupNCCL
    records one: the group's ops share the sequence number, then a `coalesced` entry with no tensors."""
    out.mkdir()
    for path in sorted(folder.iterdir()):
        dump = pickle.loads(path.read_bytes())
        rank = int(path.name.rsplit("_", 1)[1])
        entries = []
        for e in dump["entries"]:
            entries.append(e)
            if e["collective_seq_id"] == 4:
                second = copy.deepcopy(e)
                second["input_sizes"] = second["output_sizes"] = [sizes_on_rank_1 if rank == 1 else [3]]
                end = copy.deepcopy(e)
                backend = e["profiling_name"].split(":")[0]
                end.update(profiling_name=f"{backend}:coalesced", input_sizes=[], output_sizes=[])
                end.update(input_dtypes=[], output_dtypes=[])
                entries += [second, end]
        for i, e in enumerate(entries):
            e["record_id"], e["op_id"] = i, i + 1
        dump["entries"] = entries
        (out / path.name).write_bytes(pickle.dumps(dump))
    return out


def test_a_size_mismatch_inside_a_coalesced_group_is_found(tmp_path: Path):
    (f,) = _findings(_fr(_coalesced(FR / "healthy", tmp_path / "bad", [5])), "fr-collective-mismatch")
    assert (f.fields["seq"], f.fields["kind"], f.fields["coalesced_index"]) == (4, "size", 1)
    assert "entry 2 of its coalesced group" in f.explanation
    assert _fr(_coalesced(FR / "healthy", tmp_path / "good", [3])).findings == []


def test_all_to_all_totals_must_agree():
    """fr_trace's rule for all-to-all: uneven splits are fine, the element totals over ranks are not."""
    a = {"op": "gloo:all_to_all", "input_sizes": [[4]], "output_sizes": [[4]], "dtypes": ["Float"]}
    a["output_dtypes"] = ["Float"]
    b = {**a, "input_sizes": [[6]], "output_sizes": [[6]]}
    assert entry_mismatch(a, b, 2) is None
    assert entry_mismatch(a, {**b, "op": "gloo:all_reduce"}, 2) == "operation"


# --- the same folders through torchfrtrace -----------------------------------------------------------


def test_fr_trace_agrees_on_the_healthy_and_the_uneven_all_to_all_dumps():
    for case in ("healthy", "alltoall_uneven"):
        assert FrTrace(FR / case).flagged == [], case


def test_fr_trace_agrees_on_the_dtype_mismatch():
    ours = _findings(_fr(FR / "dtype_mismatch"), "fr-collective-mismatch")[0]
    theirs = FrTrace(FR / "dtype_mismatch")
    (broken,) = [c for c in theirs.flagged if c.pass_check is False]
    assert broken.collective_seq_id == ours.fields["seq"] == 4
    assert "COLLECTIVE_DTYPE_MISMATCH" in theirs.log


def test_fr_trace_refuses_the_folder_with_a_missing_dump_and_names_the_same_rank():
    theirs = FrTrace(FR / "missing_dump")
    assert theirs.error == "Missing dump files from ranks {1}"
    (ours,) = _findings(_fr(FR / "missing_dump"), "fr-missing-dump")
    assert ours.rank == 1


def test_fr_trace_agrees_on_the_rank_far_behind():
    """Same rank; fr_trace aligns the dumps on their common window and so starts at #158, the oldest entry
    rank 0's buffer still holds, which forensics names as where the buffers begin."""
    theirs = FrTrace(FR / "far_behind")
    first = min(theirs.flagged, key=lambda c: c.collective_seq_id)
    (ours,) = _findings(_fr(FR / "far_behind"), "fr-rank-never-joined")
    assert first.missing_ranks == {ours.rank} == {1}
    assert f"(from #{first.collective_seq_id})" in ours.explanation and ours.fields["seq"] == 101


def test_fr_trace_agrees_on_the_coalesced_size_mismatch(tmp_path: Path):
    bad = _coalesced(FR / "healthy", tmp_path / "bad", [5])
    theirs = FrTrace(bad)
    assert "SIZE_OR_SYNTAX_MISMATCH" in theirs.log and "has errors" in theirs.log
    assert FrTrace(_coalesced(FR / "healthy", tmp_path / "good", [3])).flagged == []


def test_fr_trace_agrees_on_the_real_nccl_dumps(tmp_path: Path):
    """The 2×H200 capture: rank 1 never issued #57; both tools name rank 1 and #57."""
    folder = tmp_path / "fr"
    shutil.copytree(STALL, folder)
    theirs = FrTrace(folder)
    first = min(theirs.flagged, key=lambda c: c.collective_seq_id)
    (ours,) = _findings(_fr(folder), "fr-rank-never-joined")
    assert (first.collective_seq_id, first.missing_ranks) == (ours.fields["seq"], {ours.rank}) == (57, {1})


def _all_to_all_short_by_one(out: Path) -> Path:
    """The uneven all-to-all with rank 1's output one element short: the totals over ranks no longer agree."""
    shutil.copytree(FR / "alltoall_uneven", out)
    path = out / "fr_trace_rank_1"
    dump = pickle.loads(path.read_bytes())
    (last,) = [e for e in dump["entries"] if e["profiling_name"].endswith("all_to_all")]
    last["output_sizes"] = [[5]]
    path.write_bytes(pickle.dumps(dump))
    return out


def test_all_to_all_whose_totals_disagree_is_a_size_mismatch_for_both(tmp_path: Path):
    folder = _all_to_all_short_by_one(tmp_path / "a2a")
    (ours,) = _findings(_fr(folder), "fr-collective-mismatch")
    assert (ours.fields["seq"], ours.fields["kind"]) == (7, "size")
    theirs = FrTrace(folder)
    assert "Input/output mismatch in the collective sequence number" in theirs.log
    assert [c.collective_seq_id for c in theirs.flagged] == [7]
