#!/usr/bin/env python3
"""Fault capture: the checkpoint disk fills up during training (a real ENOSPC inside torch.save).

Launch with torchrun (2 ranks; gloo on CPU, NCCL on GPUs). The job trains train.py's small causal transformer
with DDP and, like verl's FSDP checkpoint manager, makes every rank save its model and optimizer shards every
`--save-freq` steps under `--ckpt-dir/global_step_N/actor/`, keeping all of them. `--ckpt-dir` is meant to be a
small volume (ckpt_disk_full.sh mounts a tmpfs, or points the files at /dev/full where mounting is not
allowed), so a save fails part-way with the error the storage really returns; the other rank then waits in the
next collective until torchrun terminates it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import TinyLM, fmt_line, make_dataset  # the capture model and verl's step-line format


def save_checkpoint(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt_dir: str, step: int) -> None:
    """verl's layout: global_step_N/actor/{model,optim}_world_size_W_rank_R.pt, one pair per rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    local = os.path.join(ckpt_dir, f"global_step_{step}", "actor")
    os.makedirs(local, exist_ok=True)
    model_path = os.path.join(local, f"model_world_size_{world}_rank_{rank}.pt")
    optim_path = os.path.join(local, f"optim_world_size_{world}_rank_{rank}.pt")
    torch.save(model.state_dict(), model_path)
    print(f"[rank-{rank}]: Saved model to {os.path.abspath(model_path)}", flush=True)
    torch.save(opt.state_dict(), optim_path)
    print(f"[rank-{rank}]: Saved optim to {os.path.abspath(optim_path)}", flush=True)
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save-freq", type=int, default=5)
    ap.add_argument("--pg-timeout", type=float, default=60.0)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.pg_timeout))

    vocab, d, layers, heads, seq, bsz = 256, 128, 2, 4, 64, 8
    if rank == 0:
        print(f"TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}", flush=True)
        print(f"Total training steps: {args.steps}", flush=True)
        print(f"trainer.default_local_dir={args.ckpt_dir} trainer.save_freq={args.save_freq}", flush=True)
    torch.manual_seed(0)
    model = TinyLM(vocab, d, layers, heads, seq).to(dev)
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    data = make_dataset(512, seq, vocab, seed=100 + rank, device=dev)
    for step in range(1, args.steps + 1):
        batch = data[(step * bsz) % len(data) :][:bsz]
        logits = ddp(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        if rank == 0:
            metrics = {"actor/pg_loss": round(loss.item(), 6), "actor/grad_norm": round(grad_norm.item(), 6)}
            metrics["training/global_step"] = step
            print(fmt_line(step, metrics), flush=True)
        if step % args.save_freq == 0:
            save_checkpoint(model, opt, args.ckpt_dir, step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
