#!/usr/bin/env python3
"""A real GRPO loop on CPU: a tiny policy samples responses, a program scores them, the policy learns.

The task: given a prompt of digits, answer them in reverse order and stop (EOS). Each step samples
`--group` responses per prompt at temperature 1, scores each (share of positions right, a penalty for
a wrong length), normalises the rewards within each group (GRPO's advantage), and updates the policy
with PPO's clipped surrogate over `--epochs` passes, a k3 KL penalty to the frozen initial policy and
an optional entropy bonus. It prints verl's console step lines with verl's metric names (actor/pg_loss,
actor/pg_clipfrac, actor/ppo_kl, actor/kl_loss, actor/entropy, critic/score/mean, response_length/*, ...)
and writes verl's file-logger JSONL; `--also tensorboard` writes the same to TensorBoard event files.

Faults (`--fault KIND@STEP`, real): `lr_high` (from the start), `lr_jump` (the learning rate times
`--jump` from STEP), `no_kl` (from STEP the KL penalty is dropped and the learning rate raised `--jump` times, a
resumed run with the wrong config), `entropy_sign` (from STEP an entropy bonus of 0.5 has the wrong sign),
`reward_bug` (from STEP the reward parser looks for the wrong stop token: every answer scores as
unfinished), `nan` (from STEP the learning rate is 1e4 without clipping: the weights overflow and
sampling then fails), `leak` (from STEP every rollout is kept with its graph: host memory grows).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import pprint
import resource
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

DIGITS = 6
EOS, SEP = DIGITS, DIGITS + 1
VOCAB = DIGITS + 2


class Policy(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(tokens))
        return self.head(out)


def rss_gb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 1024**3


def fmt_line(step: int, metrics: dict) -> str:
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in metrics.items())])


@torch.no_grad()
def sample(policy: Policy, prompts: torch.Tensor, max_len: int, temperature: float) -> torch.Tensor:
    """Responses (padded with EOS after the first EOS), sampled token by token."""
    seq = torch.cat([prompts, torch.full((len(prompts), 1), SEP)], 1)
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out = []
    for _ in range(max_len):
        logits = policy(seq)[:, -1] / temperature
        tok = torch.multinomial(F.softmax(logits, -1), 1).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, EOS), tok)
        out.append(tok)
        done |= tok == EOS
        seq = torch.cat([seq, tok[:, None]], 1)
    return torch.stack(out, 1)


def lengths(responses: torch.Tensor, stop: int) -> torch.Tensor:
    """Tokens up to and including the first stop token (the whole response when there is none)."""
    hit = responses == stop
    first = torch.where(hit.any(1), hit.float().argmax(1), torch.full((len(responses),), responses.shape[1]))
    return torch.clamp(first + 1, max=responses.shape[1])


def score(prompts: torch.Tensor, responses: torch.Tensor, stop: int) -> torch.Tensor:
    """Share of the reversed prompt answered right, +0.5 for stopping at the right length, -0.5 if unfinished."""
    target = prompts.flip(1)
    n = target.shape[1]
    right = (responses[:, :n] == target).float().mean(1)
    length = lengths(responses, stop) - 1
    finished = (responses == stop).any(1)
    return right + 0.5 * (finished & (length == n)).float() - 0.5 * (~finished).float()


def token_logp(policy: Policy, prompts: torch.Tensor, responses: torch.Tensor):
    seq = torch.cat([prompts, torch.full((len(prompts), 1), SEP), responses], 1)
    logits = policy(seq[:, :-1])[:, prompts.shape[1] :]
    logp = F.log_softmax(logits, -1)
    return logp.gather(-1, responses[..., None]).squeeze(-1), logp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--name", default="grpo_reverse")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--kl-coef", type=float, default=0.01)
    ap.add_argument("--entropy-coef", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-every", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--fault", default="")
    ap.add_argument("--jump", type=float, default=30.0)
    ap.add_argument("--also", default="")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    policy = Policy(args.width)
    reference = copy.deepcopy(policy).requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    kind, _, at_text = args.fault.partition("@")
    at = int(at_text or 1)
    kept = []
    args.run_dir.mkdir(parents=True, exist_ok=True)
    (args.run_dir / "logs").mkdir(exist_ok=True)
    jsonl = open(args.run_dir / "logs" / f"{args.name}.jsonl", "w")  # noqa: SIM115 - held for the run
    tb = None
    if "tensorboard" in args.also:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(args.run_dir / "tensorboard_log" / args.name))
    pprint.pprint(
        {
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
            "actor_rollout_ref": {
                "actor": {
                    "optim": {"lr": args.lr},
                    "ppo_epochs": args.epochs,
                    "clip_ratio": args.clip,
                    "use_kl_loss": args.kl_coef > 0,
                    "kl_loss_coef": args.kl_coef,
                    "entropy_coeff": args.entropy_coef,
                },
                "rollout": {"n": args.group, "temperature": args.temperature},
            },
            "data": {"train_batch_size": args.prompts, "max_response_length": args.max_len},
            "trainer": {"total_training_steps": args.steps, "experiment_name": args.name},
        }
    )
    gen = torch.Generator().manual_seed(1000 + args.seed)
    val_prompts = torch.randint(0, DIGITS, (64, args.prompt_len), generator=torch.Generator().manual_seed(7))

    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        lr, kl_coef, ent_coef, clip_grad, stop = args.lr, args.kl_coef, args.entropy_coef, 1.0, EOS
        if kind == "lr_jump" and step >= at:
            lr *= args.jump
        if kind == "no_kl" and step >= at:
            kl_coef, lr = 0.0, lr * args.jump
        if kind == "entropy_sign" and step >= at:
            ent_coef = -0.5
        if kind == "reward_bug" and step >= at:
            stop = SEP
        if kind == "nan" and step >= at:
            lr, clip_grad = 1e4, float("inf")
        for group in opt.param_groups:
            group["lr"] = lr

        prompts = torch.randint(0, DIGITS, (args.prompts, args.prompt_len), generator=gen)
        prompts = prompts.repeat_interleave(args.group, 0)
        responses = sample(policy, prompts, args.max_len, args.temperature)
        t_gen = time.perf_counter()
        rewards = score(prompts, responses, stop)
        grouped = rewards.view(-1, args.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
        resp_len = lengths(responses, EOS)
        mask = (torch.arange(args.max_len)[None] < resp_len[:, None]).float()
        with torch.no_grad():
            old_logp, _ = token_logp(policy, prompts, responses)
            ref_logp, _ = token_logp(reference, prompts, responses)

        stats = {k: [] for k in ("pg_loss", "clipfrac", "ppo_kl", "kl", "entropy", "grad_norm")}
        t_upd = time.perf_counter()
        for _ in range(args.epochs):
            logp, full = token_logp(policy, prompts, responses)
            ratio = torch.exp(logp - old_logp)
            surrogate = torch.min(ratio * adv[:, None], torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * adv[:, None])
            denom = mask.sum()
            pg_loss = -(surrogate * mask).sum() / denom
            log_r = ref_logp - logp
            kl = ((torch.exp(log_r) - log_r - 1) * mask).sum() / denom  # k3, low variance
            entropy = (-(full.exp() * full).sum(-1) * mask).sum() / denom
            loss = pg_loss + kl_coef * kl - ent_coef * entropy
            opt.zero_grad(set_to_none=True)
            loss.backward(retain_graph=kind == "leak" and step >= at)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), clip_grad)
            opt.step()
            if kind == "leak" and step >= at:
                kept.append((loss, full, torch.randn(4_000_000)))  # ~16 MB a step, never freed
            with torch.no_grad():
                stats["pg_loss"].append(pg_loss.item())
                clipped = ((ratio - 1).abs() > args.clip).float()
                stats["clipfrac"].append(((clipped * mask).sum() / denom).item())
                stats["ppo_kl"].append((((old_logp - logp) * mask).sum() / denom).item())
                stats["kl"].append(kl.item())
                stats["entropy"].append(entropy.item())
                stats["grad_norm"].append(float(grad_norm))
        t_end = time.perf_counter()
        mean = {k: sum(v) / len(v) for k, v in stats.items()}
        lens = resp_len.float()
        metrics = {
            "actor/pg_loss": mean["pg_loss"],
            "actor/pg_clipfrac": mean["clipfrac"],
            "actor/ppo_kl": mean["ppo_kl"],
            "actor/kl_loss": mean["kl"],
            "actor/kl_coef": kl_coef,
            "actor/entropy": mean["entropy"],
            "actor/grad_norm": mean["grad_norm"],
            "actor/lr": lr,
            "critic/score/mean": rewards.mean().item(),
            "critic/score/max": rewards.max().item(),
            "critic/score/min": rewards.min().item(),
            "critic/rewards/mean": rewards.mean().item(),
            "critic/advantages/mean": adv.mean().item(),
            "critic/advantages/max": adv.max().item(),
            "critic/advantages/min": adv.min().item(),
            "response_length/mean": lens.mean().item(),
            "response_length/max": lens.max().item(),
            "response_length/min": lens.min().item(),
            "response_length/clip_ratio": (~(responses == EOS).any(1)).float().mean().item(),
            "timing_s/gen": t_gen - t0,
            "timing_s/update_actor": t_end - t_upd,
        }
        if args.val_every and step % args.val_every == 0:
            with torch.no_grad():
                val = sample(policy, val_prompts, args.max_len, 0.3)
                metrics["val-core/reverse/reward/mean@1"] = score(val_prompts, val, stop).mean().item()
        if args.save_every and step % args.save_every == 0:
            path = args.run_dir / "checkpoints" / f"global_step_{step}"
            path.mkdir(parents=True, exist_ok=True)
            torch.save(policy.state_dict(), path / "actor.pt")
            (path / "actor.pt").unlink()  # the fixture keeps the log line, not the weights
        elapsed = time.perf_counter() - t0
        metrics["timing_s/step"] = elapsed
        metrics["perf/throughput"] = float(mask.sum()) / elapsed
        metrics["perf/cpu_memory_used_gb"] = rss_gb()
        metrics["training/global_step"] = step
        print(fmt_line(step, metrics), flush=True)
        if args.save_every and step % args.save_every == 0:
            print(f"Saved checkpoint to checkpoints/global_step_{step}", flush=True)
        jsonl.write(
            json.dumps({"step": step, "data": {k: v if math.isfinite(v) else None for k, v in metrics.items()}})
        )
        jsonl.write("\n")
        jsonl.flush()
        if tb:
            for k, v in metrics.items():
                tb.add_scalar(k, v, step)
    jsonl.close()
    if tb:
        tb.close()
    print(f"Training finished after {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
