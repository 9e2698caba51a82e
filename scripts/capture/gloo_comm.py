"""Communication faults on CPU (torch.distributed with Gloo), for fixtures of distributed-progress failures.

Run under torchrun, one scenario per job (see run_gloo.sh):
- rank_timing: every rank times its own all_reduce and prints it; rank RANK_LATE starts each timed collective
  late (sleeps first), so the others wait for it inside the collective: a per-rank timing table.
- peer_killed: the last rank is killed (SIGKILL) while the others wait for it in a collective; they lose the
  connection to it.
- gloo_timeout: the process group timeout is short; the last rank sleeps past it before a collective. The others
  time out first; the sleeper then finds them gone.
- size_mismatch: the ranks all_reduce tensors of different sizes.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

ELEMENTS = 1 << 20  # 4 MiB of float32


def timed_all_reduce(rank: int, late: int, delay_s: float) -> None:
    x = torch.ones(ELEMENTS)
    for _ in range(3):  # warm up the pairs
        dist.all_reduce(x)
    dist.barrier()
    for step in range(3):
        if rank == late:
            time.sleep(delay_s)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        ms = (time.perf_counter() - t0) * 1e3
        gbps = x.numel() * x.element_size() / (ms / 1e3) / 1e9
        print(f"step {step} all_reduce of {x.numel() * 4 >> 20} MiB: {ms:.2f} ms, {gbps:.3f} GB/s", flush=True)
        dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    scenarios = ["rank_timing", "peer_killed", "gloo_timeout", "size_mismatch"]
    ap.add_argument("--scenario", required=True, choices=scenarios)
    args = ap.parse_args()
    timeout = timedelta(seconds=10 if args.scenario == "gloo_timeout" else 60)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    last = world - 1
    print(f"rank {rank}/{world} joined ({args.scenario})", flush=True)
    x = torch.ones(ELEMENTS)
    dist.all_reduce(x)
    if args.scenario == "rank_timing":
        timed_all_reduce(rank, last, 0.4)
    elif args.scenario == "peer_killed":
        dist.barrier()
        if rank == last:  # the others are already waiting in the all_reduce when it dies
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(x)
    elif args.scenario == "gloo_timeout":
        if rank == last:
            time.sleep(20)
        dist.all_reduce(x)
    elif args.scenario == "size_mismatch":
        dist.all_reduce(torch.ones(ELEMENTS + 1024 * rank))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
