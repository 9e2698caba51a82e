#!/usr/bin/env python3
"""Fault-injection training job for capturing real multi-GPU failure logs.

Launch with torchrun (2 ranks). It trains a small causal transformer with DDP on a
synthetic but learnable next-token task and, on rank 0, prints verl-style console
step lines (`step:N - key:value - ...`, values via pprint.pformat as verl >= 2025-07
does) and writes verl's file-logger JSONL (`<run>/<project>/<experiment>.jsonl`).

`--scenario` selects the injected fault; see SCENARIOS below. Without CUDA the job
falls back to gloo on CPU with tiny sizes (only for debugging the Python logic; the
CUDA-only faults are then simulated and say so).
"""

import argparse
import json
import math
import os
import pprint
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# name -> default settings (steps, lr); faults are keyed on the name below.
SCENARIOS = {
    "healthy": dict(steps=80, lr=1e-3),
    "oom_then_timeout": dict(steps=40, lr=1e-3),
    "stall_timeout_fr": dict(steps=40, lr=1e-3),
    "sigkill": dict(steps=40, lr=1e-3),
    "device_assert": dict(steps=40, lr=1e-3),
    "collective_mismatch": dict(steps=40, lr=1e-3),
    "bad_socket_ifname": dict(steps=40, lr=1e-3),
    "leak_oom": dict(steps=60, lr=1e-3),
    "lr_divergence": dict(steps=60, lr=3e-2),
    "lr_oscillation": dict(steps=80, lr=6e-3),
    "nan_injection": dict(steps=60, lr=1e-3),
    "slow_rank": dict(steps=80, lr=1e-3),
    "trace_healthy": dict(steps=12, lr=1e-3),
    "trace_slow_rank": dict(steps=12, lr=1e-3),
    "trace_large": dict(steps=16, lr=1e-3),
    # issue 19 (several GPUs): what-if pairs traced on every rank, and cascades with the faulty rank chosen
    "whatif_base": dict(steps=30, lr=1e-3),
    "whatif_slow_rank": dict(steps=30, lr=1e-3),
    "whatif_slow_loader": dict(steps=30, lr=1e-3),
    "cascade_nccl_error": dict(steps=40, lr=1e-3),
    "resume_mismatch": dict(steps=40, lr=1e-3),
}
FAULTY = int(os.environ.get("CAPTURE_FAULTY_RANK", "1"))  # the rank a fault is injected on

GIB = 1024**3


class TinyLM(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.ln(x))


def make_dataset(n, seq, vocab, seed, device, p_follow=0.85):
    """Sequences from a fixed random 'grammar': next = perm[cur] w.p. p_follow, else uniform."""
    g = torch.Generator().manual_seed(1234)  # same grammar on every rank
    perm = torch.randperm(vocab, generator=g)
    g2 = torch.Generator().manual_seed(seed)
    out = torch.empty(n, seq + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (n,), generator=g2)
    for t in range(seq):
        follow = torch.rand(n, generator=g2) < p_follow
        rnd = torch.randint(0, vocab, (n,), generator=g2)
        out[:, t + 1] = torch.where(follow, perm[out[:, t]], rnd)
    return out.to(device)


def fmt_line(step, metrics):
    # verl/utils/logger/aggregate_logger.py concat_dict_to_str (after PR #2303)
    out = [f"step:{step}"]
    for k, v in metrics.items():
        out.append(f"{k}:{pprint.pformat(v)}")
    return " - ".join(out)


def orjson_like(metrics):
    # verl's file logger uses orjson, which writes non-finite floats as null
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in metrics.items()}


def resume_from_other_config(model, run_dir, rank, arch):
    """resume_mismatch: resume from a checkpoint that an earlier run wrote with another model config (a larger
    vocabulary, one layer fewer), as after changing the tokenizer and the depth between runs. Rank 0 writes
    that earlier run's checkpoint; every rank then loads it, strictly, as a resume does."""
    path = os.path.join(run_dir, "checkpoints", "global_step_40", "model.pt")
    if rank == 0:
        earlier = dict(arch, vocab=arch["vocab"] * 2, layers=arch["layers"] - 1)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(TinyLM(**earlier).state_dict(), path)
    dist.barrier()
    if rank == 0:
        print(f"Resuming from {path}", flush=True)
    model.load_state_dict(torch.load(path, map_location="cpu"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--project", default="forensics_capture")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU logic test)")
    ap.add_argument("--pg-timeout", type=float, default=30.0)
    ap.add_argument("--bsz", type=int, default=None, help="override per-rank batch size")
    ap.add_argument("--seq", type=int, default=None, help="override sequence length")
    args = ap.parse_args()

    cfg = dict(SCENARIOS[args.scenario])
    steps = args.steps or cfg["steps"]
    lr = args.lr or cfg["lr"]
    sc = args.scenario

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    if sc == "cascade_nccl_error" and rank == FAULTY:
        # this rank alone cannot reach its peers: NCCL's bootstrap fails on it, the others wait for it
        os.environ.update(NCCL_SOCKET_IFNAME="doesnotexist0", NCCL_IB_DISABLE="1")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.pg_timeout))

    if args.tiny:
        vocab, d, layers, heads, seq, bsz = 128, 64, 2, 4, 32, 8
    else:
        vocab, d, layers, heads, seq, bsz = 1024, 512, 6, 8, 256, 32
    bsz = args.bsz or bsz
    seq = args.seq or seq
    micro_bsz = max(1, bsz // 4)

    config = {
        "actor_rollout_ref": {
            "actor": {
                "strategy": "ddp",
                "ppo_mini_batch_size": bsz * world,
                "ppo_micro_batch_size_per_gpu": micro_bsz,
                "ppo_epochs": 1,
                "grad_clip": 1.0,
                "optim": {"lr": lr, "lr_warmup_steps": 5, "weight_decay": 0.01},
                "use_dynamic_bsz": False,
            },
            "model": {"path": f"tinylm-{layers}l-{d}d", "enable_gradient_checkpointing": False},
            "rollout": {"name": "none", "n": 1, "gpu_memory_utilization": 0.5},
        },
        "data": {"train_batch_size": bsz * world, "max_prompt_length": 1, "max_response_length": seq},
        "trainer": {
            "project_name": args.project,
            "experiment_name": sc,
            "logger": ["console", "file"],
            "n_gpus_per_node": world,
            "nnodes": 1,
            "total_training_steps": steps,
            "save_freq": -1,
            "test_freq": -1,
        },
    }

    jsonl = None
    if rank == 0:
        print(f"TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}", flush=True)
        pprint.pprint(config)
        print("[validate_config] All configuration checks passed successfully!", flush=True)
        n_train = 2048 * world // (bsz * world)
        print(f"Size of train dataloader: {n_train}, Size of val dataloader: 1", flush=True)
        print(f"Total training steps: {steps}", flush=True)
        jpath = os.path.join(args.run_dir, args.project, f"{sc}.jsonl")
        os.makedirs(os.path.dirname(jpath), exist_ok=True)
        print(f"Creating file logger at {jpath}", flush=True)
        jsonl = open(jpath, "wb", buffering=0)  # noqa: SIM115 - held open for the run, like verl's file logger

    torch.manual_seed(0)
    model = TinyLM(vocab, d, layers, heads, seq).to(dev)
    if sc == "resume_mismatch":
        resume_from_other_config(model, args.run_dir, rank, dict(vocab=vocab, d=d, layers=layers, heads=heads, seq=seq))
    no_ddp = os.environ.get("CAPTURE_NO_DDP") == "1"  # hand-rolled gradient all-reduce instead of DDP
    ddp = model if no_ddp else DDP(model, device_ids=[local_rank] if use_cuda else None)
    if no_ddp:
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    optim_name = os.environ.get("CAPTURE_OPTIM", "adamw")  # adamw | adamw:b1,b2 | sgd:momentum
    if optim_name.startswith("sgd"):
        mom = float(optim_name.split(":")[1]) if ":" in optim_name else 0.0
        opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=mom)
    else:
        betas = tuple(float(b) for b in optim_name.split(":")[1].split(",")) if ":" in optim_name else (0.9, 0.999)
        opt = torch.optim.AdamW(ddp.parameters(), lr=lr, betas=betas, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    data = make_dataset(2048, seq, vocab, seed=100 + rank, device=dev)
    if rank == 0:
        print("Training from scratch", flush=True)

    leak = []  # leak_oom: rank 1's "rollout cache" that is never freed
    prof = None
    if sc.startswith(("trace_", "whatif_")):
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        if sc == "trace_large":
            sch = schedule(wait=2, warmup=2, active=10, repeat=1)
            extra = dict(with_stack=True, profile_memory=True)
        elif sc.startswith("whatif_"):  # the whole run after warm-up: steps to compare with and without the fault
            sch = schedule(wait=2, warmup=2, active=steps - 4, repeat=1)
            extra = dict(with_stack=True, profile_memory=True)
        else:
            sch = schedule(wait=2, warmup=2, active=5, repeat=1)
            extra = {}
        prof = profile(
            activities=acts,
            schedule=sch,
            on_trace_ready=tensorboard_trace_handler(
                os.path.join(args.run_dir, "traces"), worker_name=f"rank{rank}", use_gzip=True
            ),
            record_shapes=True,
            **extra,
        )
        prof.start()

    def sync():
        if use_cuda:
            torch.cuda.synchronize()

    def extra_gpu_work(n):
        if use_cuda:
            a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
            for _ in range(n):
                a = (a @ a).clamp_(-1, 1)
        else:
            time.sleep(0.003 * n)

    g = torch.Generator(device="cpu").manual_seed(7 + rank)
    for step in range(1, steps + 1):
        sync()
        t0 = time.perf_counter()
        idx = torch.randint(0, data.shape[0], (bsz,), generator=g).to(dev)
        batch = data[idx]
        inp, tgt = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

        # ---------------- injected faults before the update ----------------
        if sc == "stall_timeout_fr" and step == 10 and rank == FAULTY:
            time.sleep(60)  # stuck in "data loading"
        if sc == "sigkill" and step == 10 and rank == FAULTY:
            os.kill(os.getpid(), signal.SIGKILL)
        if sc == "whatif_slow_loader" and rank == FAULTY:
            time.sleep(0.05)  # a slow host-side data loader: the GPU of this rank idles, the others wait in NCCL
        if sc == "device_assert" and step == 8 and rank == 0:
            inp[3, 17] = vocab + 7  # corrupt token id >= vocab
        if sc == "leak_oom" and rank == 1 and step >= 2:
            if use_cuda:
                leak.append(torch.ones(6 * GIB // 2, dtype=torch.bfloat16, device=dev))
            else:
                leak.append(torch.ones(1024))
        if sc == "oom_then_timeout" and step == 12 and rank == FAULTY:
            try:
                # log-prob pass over an over-long micro-batch: fp32 logits of a 152k-vocab
                # model for 2 x 16384 tokens per micro-batch, kept until the loss is built
                logits_cache = []
                for _mb in range(16):
                    if use_cuda:
                        logits_cache.append(torch.empty(2, 16384, 151936, dtype=torch.float32, device=dev))
                    else:
                        raise torch.OutOfMemoryError("CUDA out of memory. (simulated: no CUDA here)")
            except Exception:
                # like a Ray actor: report and stay alive; the driver never gets a result
                traceback.print_exc()
                sys.stderr.flush()
                del logits_cache
                time.sleep(90)
                sys.exit(1)
        if sc in ("slow_rank",) and step >= 40 and rank == 1:
            extra_gpu_work(200)
        if sc in ("trace_slow_rank", "whatif_slow_rank") and rank == FAULTY:
            extra_gpu_work(30)

        # ---------------- "rollout" statistics pass (no grad) ----------------
        t_gen = time.perf_counter()
        with torch.no_grad():
            logits = model(inp[:micro_bsz])
            logp = F.log_softmax(logits.float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(-1).mean()
            acc = (logits.argmax(-1) == tgt[:micro_bsz]).float().mean()
        sync()
        t_upd = time.perf_counter()

        # ---------------- update_actor ----------------
        opt.zero_grad(set_to_none=True)
        logits = ddp(inp)
        loss = F.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1))
        if sc == "nan_injection" and step == 30 and rank == 0:
            loss = loss * float("nan")
        loss.backward()
        if no_ddp:
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g_.reshape(-1) for g_ in grads])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for g_ in grads:
                g_.copy_(flat[off : off + g_.numel()].view_as(g_))
                off += g_.numel()
        grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        cur_lr = sched.get_last_lr()[0]
        sched.step()

        if sc == "collective_mismatch" and step == 5:
            if rank == 0:
                dist.all_reduce(torch.ones(4, device=dev))
            else:
                out = [torch.empty(3, 5, device=dev) for _ in range(world)]
                dist.all_gather(out, torch.ones(3, 5, device=dev))

        # ---------------- metrics (mean over ranks; memory max over ranks) ----------------
        mean_t = torch.stack([loss.detach().float(), grad_norm.float(), entropy.float(), acc.float()])
        dist.all_reduce(mean_t, op=dist.ReduceOp.SUM)
        mean_t /= world
        if use_cuda:
            mem = torch.tensor(
                [torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB], device=dev
            )
        else:
            mem = torch.zeros(2)
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        sync()
        t1 = time.perf_counter()
        if prof is not None:
            prof.step()

        if rank == 0:
            pg_loss, gn, ent, score = [float(x) for x in mean_t.tolist()]
            step_t = t1 - t0
            resp_len = float(seq * (0.55 + 0.35 * (1 - math.exp(-step / 25.0))) + 4.0 * math.sin(step * 1.7))
            metrics = {
                "actor/entropy": ent,
                "actor/pg_loss": pg_loss,
                "actor/grad_norm": gn,
                "perf/max_memory_allocated_gb": float(mem[0].item()),
                "perf/max_memory_reserved_gb": float(mem[1].item()),
                "actor/lr": float(cur_lr),
                "training/global_step": step,
                "training/epoch": 0,
                "critic/score/mean": score,
                "response_length/mean": resp_len,
                "timing_s/gen": t_upd - t_gen,
                "timing_s/update_actor": t1 - t_upd,
                "timing_s/step": step_t,
                "perf/total_num_tokens": bsz * seq * world,
                "perf/time_per_step": step_t,
                "perf/throughput": float(bsz * seq * world / (step_t * world)),
            }
            print(fmt_line(step, metrics), flush=True)
            jsonl.write(
                json.dumps({"step": step, "data": orjson_like(metrics)}, separators=(",", ":")).encode() + b"\n"
            )

    if prof is not None:
        prof.stop()
    dist.barrier()
    if rank == 0:
        print(f"Final validation metrics: {{'train/last_step': {steps}}}", flush=True)
        jsonl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("CAPTURE_RECORD") == "1":
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
