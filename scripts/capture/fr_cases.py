"""Flight-recorder dumps of 2-rank jobs on the CPU (gloo), written by PyTorch's own recorder.

    python scripts/capture/fr_cases.py OUT_DIR [CASE ...]

Each case runs two processes that issue real collectives through torch.distributed with the flight recorder
on (TORCH_FR_BUFFER_SIZE), then each rank writes `torch._C._distributed_c10d._dump_fr_trace()` (stack traces
off, so no path of the machine is in the dump) to OUT_DIR/<case>/fr_trace_rank_<rank>, as the recorder's
own dump-on-timeout would. One repair: gloo's recorder writes `pg_config` empty (`{'': {'name': '', 'desc': '',
'ranks': '[0, 1]'}}`), which `torchfrtrace` cannot read (KeyError), so it is rewritten as ProcessGroupNCCL
writes it, from the entries' process group: `{'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}}`.
The cases are the flight-recorder findings of forensics, checked against `torchfrtrace` in
tests/test_flight_recorder.py:

- healthy: 6 all-reduces on both ranks.
- dtype_mismatch: the 4th all-reduce is float32 on rank 0, int32 on rank 1 (same byte count: gloo completes it).
- alltoall_uneven: a legal all_to_all_single with uneven splits (rank 0 sends 1+3 elements, rank 1 3+3).
- missing_dump: healthy, but rank 1 writes no dump (it died before the dump).
- far_behind: rank 1 issues 100 all-reduces and stops, rank 0 issues 357 (asynchronously: they wait for rank
  1 forever); the recorder keeps the newest 200 entries of each rank.

A size mismatch inside an NCCL coalesced group (several entries sharing one sequence number, then
`nccl:coalesced`) cannot be made with gloo, which records a coalesced block as one entry: the test builds it
from the healthy dump, the way ProcessGroupNCCL records such a block.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = ("healthy", "dtype_mismatch", "alltoall_uneven", "missing_dump", "far_behind")
PORT = 29561


def _collectives(case: str, rank: int) -> None:
    if case == "far_behind":
        works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(100 if rank else 357)]
        del works
        return
    for i in range(6):
        dtype = torch.int32 if case == "dtype_mismatch" and i == 3 and rank == 1 else torch.float32
        dist.all_reduce(torch.ones(4, dtype=dtype))
    if case == "alltoall_uneven":
        sends = [1, 3] if rank == 0 else [3, 3]
        receives = [1, 3] if rank == 0 else [3, 3]
        out = torch.empty(sum(receives))
        dist.all_to_all_single(out, torch.ones(sum(sends)), output_split_sizes=receives, input_split_sizes=sends)


def _with_pg_config(dump: bytes, world: int) -> bytes:
    """The dump with `pg_config` as ProcessGroupNCCL records it (see the module doc)."""
    data = pickle.loads(dump)  # our own process's dump
    groups = {tuple(e["process_group"]) for e in data["entries"]}
    data["pg_config"] = {name: {"name": name, "desc": desc, "ranks": str(list(range(world)))} for name, desc in groups}
    return pickle.dumps(data)


def _rank(rank: int, case: str, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="200")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _collectives(case, rank)
    if not (case == "missing_dump" and rank == 1):
        dump = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)
        (out / f"fr_trace_rank_{rank}").write_bytes(_with_pg_config(dump, 2))
    os._exit(0)  # far_behind leaves collectives that never complete: no orderly shutdown


def main() -> None:
    root = Path(sys.argv[1])
    for i, case in enumerate(sys.argv[2:] or CASES):
        out = root / case
        out.mkdir(parents=True, exist_ok=True)
        mp.spawn(_rank, args=(case, out, PORT + i), nprocs=2, join=True)
        print(f"{case}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
