#!/usr/bin/env python3
"""A real tiny GPT trained on CPU (char-level, on the repository's own prose), logging as trainers do.

Healthy or with an injected fault (`--fault`), single process or gloo DDP (`--ddp 2`, launched with
torchrun). Rank 0 logs each step as verl does (console `step:N - key:value` lines via pprint.pformat,
and the file logger's JSONL), and optionally the same metrics where other tools keep them:
`--also flat_jsonl,csv,tensorboard,mlflow,wandb` (flat `{"step": N, "train/loss": ...}` records, a CSV with a
`step` column as Lightning's CSVLogger writes it, TensorBoard event files from torch's SummaryWriter, MLflow's
file store from `mlflow.log_metrics`, an offline W&B run from `wandb.log`).

Faults (real, not simulated): `lr_high` (a learning rate far too high from the start), `lr_jump@N`
(the schedule multiplies the learning rate at step N), `nan@N` (the learning rate goes to 1e4 without
clipping at step N: the weights overflow), `leak@N` (from step N the loss tensors are kept with their
graphs, so host memory grows every step).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pprint
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def corpus_text() -> str:
    """The repository's own prose: a few hundred KB of real English text that ships with it."""
    parts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in parts if p.exists())


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def lr_at(step: int, args) -> float:
    """The schedule: constant, linear warm-up then constant, or warm-up then cosine to 10%."""
    base = args.lr
    if args.schedule != "constant" and step <= args.warmup:
        factor = step / args.warmup
    elif args.schedule == "cosine":
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    else:
        factor = 1.0
    kind, at = fault(args)
    if kind == "lr_jump" and step >= at:
        factor *= args.jump
    if kind == "nan" and step >= at:
        return 1e4
    return base * factor


def fault(args) -> tuple[str, int]:
    if not args.fault:
        return "", 0
    kind, _, at = args.fault.partition("@")
    return kind, int(at or 1)


def rss_gb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 1024**3


def fmt_line(step: int, metrics: dict) -> str:
    # verl/utils/logger/aggregate_logger.py concat_dict_to_str (after PR #2303)
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in metrics.items())])


class Loggers:
    """Where rank 0 writes each step's metrics, as the real tools lay them out."""

    def __init__(self, run_dir: Path, name: str, also: set[str], console: str):
        self.dir = run_dir
        self.console = console
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        keep_verl = console == "verl"  # a run that logs elsewhere has no verl file logger
        self.verl = open(run_dir / "logs" / f"{name}.jsonl", "w") if keep_verl else None  # noqa: SIM115
        self.flat = open(run_dir / "metrics.jsonl", "w") if "flat_jsonl" in also else None  # noqa: SIM115
        self.csv_file = open(run_dir / "metrics.csv", "w", newline="") if "csv" in also else None  # noqa: SIM115
        self.csv = None
        self.tb = None
        self.mlflow = None
        if "mlflow" in also:  # MLflow's file store: mlruns/<experiment>/<run>/metrics/<key>
            import mlflow

            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 prefers SQLite; many runs keep mlruns/
            mlflow.set_tracking_uri((run_dir / "mlruns").as_uri())
            mlflow.start_run(run_name=name)
            self.mlflow = mlflow
        self.wandb = None
        if "wandb" in also:  # an offline W&B run: wandb/offline-run-*/run-*.wandb
            import wandb

            self.wandb = wandb.init(project="forensics-capture", name=name, dir=str(run_dir), mode="offline")
        if "tensorboard" in also:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard_log" / name))

    def log(self, step: int, metrics: dict) -> None:
        if self.console == "verl":
            print(fmt_line(step, metrics), flush=True)
        elif self.console == "plain":  # what a hand-written loop prints
            print(
                f"step {step} | " + " | ".join(f"{k.rsplit('/', 1)[-1]} {v:.4g}" for k, v in metrics.items()),
                flush=True,
            )
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}  # orjson: NaN -> null
        if self.verl:
            self.verl.write(json.dumps({"step": step, "data": clean}) + "\n")
            self.verl.flush()
        if self.flat:
            self.flat.write(json.dumps({"step": step, **metrics}) + "\n")  # Python's json writes NaN
            self.flat.flush()
        if self.csv_file:
            if self.csv is None:
                self.csv = csv.DictWriter(self.csv_file, fieldnames=["step", *metrics], extrasaction="ignore")
                self.csv.writeheader()
            self.csv.writerow({"step": step, **metrics})
            self.csv_file.flush()
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.mlflow:
            self.mlflow.log_metrics(metrics, step=step)
        if self.wandb:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        for f in (self.verl, self.flat, self.csv_file):
            if f:
                f.close()
        if self.tb:
            self.tb.close()
        if self.mlflow:
            self.mlflow.end_run()
        if self.wandb:
            self.wandb.finish()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--name", default="tiny_gpt")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--schedule", choices=["constant", "warmup", "cosine"], default="cosine")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--var-len", action="store_true", help="a random sequence length every step")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-every", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--fault", default="", help="lr_high | lr_jump@N | nan@N | leak@N")
    ap.add_argument("--jump", type=float, default=30.0, help="lr factor of lr_jump")
    ap.add_argument("--also", default="", help="flat_jsonl,csv,tensorboard")
    ap.add_argument("--console", choices=["verl", "plain", "none"], default="verl")
    ap.add_argument("--loss-key", default="train/loss", help="the name the loss is logged under")
    args = ap.parse_args()

    ddp = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    rank, world = 0, 1
    if ddp:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    text = corpus_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    model = TinyGPT(len(chars), args.width, args.layers, 4, args.seq)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed * 100 + rank)
    kind, at = fault(args)
    kept = []  # the leak: loss tensors with their graphs

    loggers = None
    if rank == 0:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        print(
            f"Training {args.name}: {sum(p.numel() for p in model.parameters())} parameters, "
            f"{len(chars)} symbols, world size {world}",
            flush=True,
        )
        pprint.pprint(
            {
                "trainer": {"total_training_steps": args.steps, "experiment_name": args.name},
                "actor_rollout_ref": {"actor": {"optim": {"lr": args.lr, "warmup": args.warmup}}},
                "data": {"train_batch_size": args.batch * world, "max_response_length": args.seq},
            }
        )
        loggers = Loggers(args.run_dir, args.name, set(filter(None, args.also.split(","))), args.console)

    def batch(source: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(0, len(source) - seq - 1, (args.batch,), generator=gen)
        x = torch.stack([source[i : i + seq] for i in ix])
        y = torch.stack([source[i + 1 : i + seq + 1] for i in ix])
        return x, y

    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        lr = lr_at(step, args) if kind != "lr_high" else args.lr
        for group in opt.param_groups:
            group["lr"] = lr
        seq = int(torch.randint(8, args.seq + 1, (1,), generator=gen)) if args.var_len else args.seq
        x, y = batch(train, seq)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=kind == "leak" and step >= at)
        clip = args.clip if not (kind == "nan" and step >= at) else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
        opt.step()
        if kind == "leak" and step >= at:
            kept.append((loss, logits, torch.randn(4_000_000)))  # ~16 MB more every step, never freed
        stats = torch.tensor([loss.item(), grad_norm])
        if ddp:
            dist.all_reduce(stats)
            stats /= world
        val_loss = None
        if args.val_every and step % args.val_every == 0:
            model.eval()
            with torch.no_grad():
                vx, vy = batch(val, args.seq)
                vl = model(vx)
                val_loss = float(F.cross_entropy(vl.reshape(-1, vl.shape[-1]), vy.reshape(-1)))
            model.train()
        saved = None
        if rank == 0 and args.save_every and step % args.save_every == 0:  # inside the step's time, as in verl
            saved = args.run_dir / "checkpoints" / f"global_step_{step}"
            saved.mkdir(parents=True, exist_ok=True)
            torch.save((model.module if ddp else model).state_dict(), saved / "model.pt")
        elapsed = time.perf_counter() - t0
        metrics = {
            args.loss_key: float(stats[0]),
            "train/grad_norm": float(stats[1]),
            "train/lr": lr,
            "train/seq_len": float(seq),
            "perf/throughput": args.batch * seq * world / elapsed,
            "timing_s/step": elapsed,
            "perf/cpu_memory_used_gb": rss_gb(),
        }
        if val_loss is not None:
            metrics["val/loss"] = val_loss
        if rank == 0:
            loggers.log(step, metrics)
            if saved is not None:
                print(f"Saved checkpoint to {saved.relative_to(args.run_dir)}", flush=True)
                (saved / "model.pt").unlink()  # the fixture keeps the log line, not the weights
    if rank == 0:
        loggers.close()
        print(f"Training finished after {args.steps} steps", flush=True)
    if ddp:
        # every rank waits for the others first: with 8 gloo ranks, a rank that tore its group down while a
        # peer was still logging died at exit ("terminate called without an active exception", SIGABRT)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
