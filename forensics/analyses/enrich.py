"""Complete the events table: ranks from the pid→rank map, times inferred from neighbours.

A launcher's report of a failed child names its local rank (torchrun's `local_rank: 5`, DeepSpeed's
`--local_rank=5`); where nothing else gives that event a rank and the logs show no more than one host, the
local rank is the global one (one node), and the event takes it, marked `rank_from_local`.

Ray runs add a map of nodes, workers and actors (analyses/ray_cluster.py): role, node and verl rank by
pid and by the ids Ray's messages name, and times for the driver's echoes of cluster events.
"""

from __future__ import annotations

import polars as pl

from forensics.analyses.ray_cluster import RayCluster, align_echo_times, attribute_events, build_cluster


def pid_rank_map(events: pl.DataFrame) -> pl.DataFrame:
    """(host, pid) → rank learnt from lines that state both, such as NCCL `Init COMPLETE`.

    A pid seen with several ranks (one process in several communicators) keeps its smallest
    global-communicator rank, the one from the communicator with the most ranks.
    """
    known = events.filter(pl.col("pid").is_not_null() & pl.col("rank").is_not_null())
    if known.is_empty():
        return pl.DataFrame(schema={"pid": pl.Int64, "map_rank": pl.Int64})
    nranks = known.select(
        "pid",
        "rank",
        pl.col("fields").str.json_path_match("$.nranks").cast(pl.Int64, strict=False).fill_null(0).alias("n"),
    )
    return (
        nranks.sort(["pid", "n", "rank"], descending=[False, True, False])
        .group_by("pid", maintain_order=True)
        .first()
        .select("pid", pl.col("rank").alias("map_rank"))
    )


def fill_ranks(events: pl.DataFrame) -> pl.DataFrame:
    mapping = pid_rank_map(events)
    if mapping.is_empty():
        return events
    return (
        events.join(mapping, on="pid", how="left")
        .with_columns(pl.coalesce("rank", "map_rank").alias("rank"))
        .drop("map_rank")
    )


def local_ranks_on_one_node(events: pl.DataFrame) -> pl.DataFrame:
    """Rankless events that name a local rank take it as their rank when the logs show at most one host."""
    if events.is_empty() or events.get_column("host").drop_nulls().n_unique() > 1:
        return events
    local = pl.col("fields").str.json_path_match("$.local_rank").cast(pl.Int64, strict=False)
    taken = pl.col("rank").is_null() & local.is_not_null()
    return events.with_columns(
        pl.when(taken).then(local).otherwise(pl.col("rank")).alias("rank"),
        pl.when(taken)
        .then(pl.col("fields").str.replace(r"\}$", ', "rank_from_local": true}'))
        .otherwise(pl.col("fields"))
        .alias("fields"),
    )


def infer_times(events: pl.DataFrame) -> pl.DataFrame:
    """Lines without a time take the time of the nearest earlier (else later) stamped line of their file."""
    if events.is_empty():
        return events
    return (
        events.sort(["file", "line"])
        .with_columns(pl.col("ts").is_null().alias("_missing"))
        .with_columns(pl.col("ts").forward_fill().backward_fill().over("file"))
        .with_columns((pl.col("ts_inferred") | (pl.col("_missing") & pl.col("ts").is_not_null())).alias("ts_inferred"))
        .drop("_missing")
    )


def enrich(events: pl.DataFrame) -> tuple[pl.DataFrame, RayCluster]:
    """The completed events, and the Ray cluster map they were completed with (built once per run)."""
    cluster = build_cluster(events)
    events = infer_times(local_ranks_on_one_node(fill_ranks(attribute_events(events, cluster))))
    return align_echo_times(events, cluster), cluster
