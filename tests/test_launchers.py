"""Launchers' reports of a task that exited non-zero (Slurm's srun, Open MPI's mpirun, pdsh), as they print them."""

from __future__ import annotations

from forensics.pipeline import analyze
from tests.conftest import REPO


def _root(tmp_path, text: str):
    log = tmp_path / "slurm-524549.out"
    log.write_text(text, encoding="utf-8")
    return analyze([log]).verdict


def test_srun_names_the_failed_task_which_is_its_rank(tmp_path):
    verdict = _root(tmp_path, "srun: error: ault44: task 3: Exited with exit code 1\n")
    root = verdict.root_cause
    assert (verdict.status, root.cls, root.rank, root.host) == ("failed", "unknown_crash", 3, "ault44")


def test_an_exception_above_the_srun_report_is_the_root(tmp_path):
    """The report is the consequence: the rank's own exception, printed above it, is what failed."""
    verdict = _root(
        tmp_path,
        "RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
        "failed to bind to [::]:29500 (errno: 98 - Address already in use).\n"
        "srun: error: ault44: task 3: Exited with exit code 1\n"
        "srun: error: ault43: task 0: Exited with exit code 1\n",
    )
    assert verdict.root_cause.evidence[0].line == 1


def test_mpirun_and_pdsh_reports_and_a_clean_exit(tmp_path):
    mpi = "Primary job  terminated normally, but 1 process returned a non-zero exit code. Per user-direction, the job"
    assert _root(tmp_path, mpi + " has been aborted.\n").root_cause.cls == "unknown_crash"
    pdsh = _root(tmp_path, "pdsh@node001: node002: ssh exited with exit code 1\n").root_cause
    assert pdsh.host == "node002"
    assert _root(tmp_path, "srun: error: n1: task 0: Exited with exit code 0\n").status == "healthy"


TORCHRUN_FAILED = (
    "E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed "
    "(exitcode: -9) local_rank: 5 (pid: 2630) of binary: /root/miniconda3/bin/python\n"
)


def test_a_local_rank_is_the_rank_when_the_logs_show_one_node(tmp_path):
    """torchrun's agent names the child's local rank; with no second host in the logs it is the global rank."""
    root = _root(tmp_path, TORCHRUN_FAILED).root_cause
    assert (root.cls, root.rank) == ("process_killed", 5)
    assert root.fields.get("rank_from_local") is True
    assert "Rank 5 is the local rank the launcher named" in root.explanation


def test_a_local_rank_stays_local_when_the_logs_show_two_hosts(tmp_path):
    two_nodes = (
        "node-a:2611:2611 [5] NCCL INFO comm 0x55d1 rank 5 nranks 16 cudaDev 5 busId 9c000 - Init COMPLETE\n"
        "node-b:3170:3170 [5] NCCL INFO comm 0x61a2 rank 13 nranks 16 cudaDev 5 busId 9c000 - Init COMPLETE\n"
        + TORCHRUN_FAILED
    )
    root = _root(tmp_path, two_nodes).root_cause
    assert root.cls == "process_killed" and root.rank is None


def test_a_root_that_names_no_rank_takes_the_one_worker_torchrun_saw_fail():
    """Corpus 2192: a resume's state-dict size mismatch printed without a rank prefix, then torchrun's agent reports
    local_rank 0 failed; corpus 1406: only the agent's report, for local_rank 2."""
    cases = REPO / "corpus" / "cases" / "open"
    mismatch = analyze([cases / "2192.log"]).verdict.root_cause
    assert (mismatch.cls, mismatch.rank) == ("shape_mismatch", 0)
    assert mismatch.evidence[0].text.startswith("\tsize mismatch for model.embed_tokens.weight: copying a param")
    assert "rank 0 is the only worker the launcher saw fail" in mismatch.explanation
    bare = analyze([cases / "1406.log"]).verdict.root_cause
    assert (bare.cls, bare.rank) == ("unknown_crash", 2)


def test_deepspeeds_report_cut_before_its_exit_code_still_names_the_local_rank():
    """Corpus 2002: the launcher's ERROR line with the child's command is hard-wrapped, so 'exits with return code
    = -9' is on a later line; the --local_rank=7 on the first line is the rank that was killed."""
    root = analyze([REPO / "corpus" / "cases" / "open" / "2002.log"]).verdict.root_cause
    assert (root.cls, root.rank) == ("process_killed", 7)
