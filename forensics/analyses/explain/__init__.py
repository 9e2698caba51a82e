"""Explain rooms: what the evidence of a finding says, one module per failure family.

A rule gives a class; the numbers and names in its lines give the story. Each room turns the fields the
rules and readers extracted (and, where a line holds many values, the lines themselves) into the finding's
`explanation`, adds a few `fields`, and reorders the remediation so that the step that fits the case comes
first. `EXPLAINERS` says which rooms read which class; what every finding may need said (a rank that is a
launcher's local rank, taken as global on one node) is said after them.
"""

from __future__ import annotations

from collections.abc import Callable

from forensics.analyses.explain.checkpoint import explain_key_mismatch, explain_shape_mismatch
from forensics.analyses.explain.context import Reading
from forensics.analyses.explain.cuda_oom import explain_cuda_oom
from forensics.analyses.explain.gpu import explain_cuda_error, explain_xid
from forensics.analyses.explain.hang import explain_stall
from forensics.analyses.explain.host import explain_host_oom, explain_process_killed
from forensics.analyses.explain.nccl import explain_barrier_timeout, explain_nccl_error
from forensics.analyses.explain.ray import explain_actor_death, explain_node_death, explain_ray_wrapper
from forensics.analyses.explain.training import explain_instability
from forensics.model import Finding

Explainer = Callable[[Finding, Reading], None]

EXPLAINERS: dict[str, tuple[Explainer, ...]] = {
    "cuda_oom": (explain_cuda_oom, explain_ray_wrapper),
    "weight_key_mismatch": (explain_key_mismatch,),
    "shape_mismatch": (explain_shape_mismatch,),
    "ray_actor_died": (explain_actor_death,),
    "ray_node_died": (explain_node_death,),
    "gpu_hardware": (explain_xid,),
    "cuda_error": (explain_xid, explain_cuda_error),
    "training_instability": (explain_instability,),
    "nccl_error": (explain_nccl_error,),
    "nccl_timeout": (explain_barrier_timeout,),
    "process_killed": (explain_process_killed,),
    "host_oom": (explain_host_oom,),
    "hang": (explain_stall,),
}


def explain(finding: Finding, reading: Reading) -> None:
    """Fill the finding's explanation (and fields, remediation order) from what its evidence says."""
    for room in EXPLAINERS.get(finding.cls, ()):
        room(finding, reading)
    _rank_from_local(finding)


def _rank_from_local(finding: Finding) -> None:
    if finding.fields.get("rank_from_local") and finding.rank is not None:
        finding.explanation += (
            f" Rank {finding.rank} is the local rank the launcher named; the logs show one node, so it is taken as"
            " the global rank."
        )


__all__ = ["EXPLAINERS", "Reading", "explain"]
