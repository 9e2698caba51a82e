"""One colour per finding class and per verdict status, the same in every report and every plot.

A reader who has learnt that CUDA OOM is red in one report finds it red in the batch index, in the diff
and on next week's timeline; a class missing here gets a colour derived from its name, never a random one.
"""

from __future__ import annotations

import hashlib

CLASS_COLOURS = {
    "cuda_oom": "#d62728",
    "host_oom": "#e377c2",
    "kv_cache_insufficient": "#f7b6d2",
    "process_killed": "#8c564b",
    "nccl_timeout": "#ff7f0e",
    "nccl_error": "#bcbd22",
    "collective_mismatch": "#dbdb8d",
    "hang": "#ffbb78",
    "ray_actor_died": "#1f77b4",
    "ray_node_died": "#aec7e8",
    "cuda_error": "#9467bd",
    "gpu_hardware": "#c5b0d5",
    "weight_key_mismatch": "#2ca02c",
    "shape_mismatch": "#98df8a",
    "env_version_mismatch": "#7f7f7f",
    "config_error": "#c49c94",
    "training_instability": "#17becf",
    "straggler": "#9edae5",
    "disk_or_io": "#393b79",
    "unknown_crash": "#5f5f5f",
}
STATUS_COLOURS = {
    "failed": "#b42318",
    "degraded": "#b54708",
    "healthy": "#067647",
    "inconclusive": "#3e4784",
    "error": "#475467",
}


def class_colour(cls: str | None) -> str:
    """The class's colour; a class this table does not know gets a stable one from a hash of its name."""
    if cls in CLASS_COLOURS:
        return CLASS_COLOURS[cls]
    if cls in STATUS_COLOURS:
        return STATUS_COLOURS[cls]
    digest = hashlib.sha256((cls or "").encode()).digest()
    return f"hsl({digest[0] * 360 // 256}, 45%, 45%)"
