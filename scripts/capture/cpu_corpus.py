#!/usr/bin/env python3
"""Capture the CPU corpus of real runs (healthy and unhealthy dynamics) and trim them into fixtures.

`capture OUT [--only SUBSTR]` runs every run below (cpu_lm.py / cpu_grpo.py, or torchrun with 2 gloo
ranks) into OUT/<name>/ with its console in OUT/<name>/driver.log; `fixtures OUT DEST` copies each into
DEST/<name>/ trimmed (long step lines keep every step, checkpoints and event files are kept as written)
with an expected.yaml: `status: healthy` for the healthy ones, for the others the verdict, the rules
that may be the root cause and the step the fault was injected at (found within 10%, at least 10 steps).
`tally RUNS` prints the closing figures: each detector's false-alarm rate on the healthy runs, and the
detection rate and step error on the unhealthy ones.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable


@dataclass(frozen=True)
class Spec:
    name: str
    script: str  # cpu_lm | cpu_grpo
    args: tuple[str, ...]
    ranks: int = 1
    expect: dict = field(default_factory=dict)  # empty: healthy
    note: str = ""
    tee: bool = False  # torchrun --tee 3 --log-dir torchrun_logs: every rank's output prefixed, and kept per rank


LM = ("--width", "48", "--seq", "48", "--batch", "8")
DIVERGED = ["loss-divergence", "non-finite-metric", "non-finite-loss", "grad-norm-explosion"]
HURT = [*DIVERGED, "loss-regression", "loss-oscillation", "grad-norm-surge"]  # Adam recovers from a jump
RL_BROKEN = [
    "reward-collapse",
    "entropy-collapse",
    "kl-blowup",
    "loss-divergence",
    "grad-norm-explosion",
    "grad-norm-surge",
    "responses-truncated",
]


def healthy_lm() -> list[Spec]:
    return [
        Spec("lm_cosine_s0", "cpu_lm", (*LM, "--steps", "200", "--seed", "0"), note="warm-up 20 then cosine"),
        Spec("lm_cosine_s1", "cpu_lm", (*LM, "--steps", "200", "--seed", "1")),
        Spec("lm_cosine_s2", "cpu_lm", (*LM, "--steps", "200", "--seed", "2", "--lr", "5e-3")),
        Spec("lm_constant", "cpu_lm", (*LM, "--steps", "150", "--schedule", "constant", "--lr", "1e-3")),
        Spec("lm_constant_s1", "cpu_lm", (*LM, "--steps", "150", "--schedule", "constant", "--seed", "1")),
        Spec("lm_warmup_constant", "cpu_lm", (*LM, "--steps", "200", "--schedule", "warmup", "--warmup", "40")),
        Spec(
            "lm_tiny_batch",
            "cpu_lm",
            ("--width", "48", "--seq", "48", "--batch", "2", "--steps", "200", "--lr", "2e-3"),
        ),
        Spec("lm_large_batch", "cpu_lm", ("--width", "48", "--seq", "48", "--batch", "48", "--steps", "100")),
        Spec("lm_var_len", "cpu_lm", (*LM, "--steps", "200", "--var-len"), note="a random sequence length each step"),
        Spec("lm_var_len_s1", "cpu_lm", (*LM, "--steps", "200", "--var-len", "--seed", "1", "--batch", "4")),
        Spec("lm_val_ckpt", "cpu_lm", (*LM, "--steps", "200", "--val-every", "25", "--save-every", "50")),
        Spec("lm_short", "cpu_lm", (*LM, "--steps", "30")),
        Spec("lm_long", "cpu_lm", ("--width", "32", "--seq", "32", "--batch", "8", "--steps", "600", "--warmup", "50")),
        Spec(
            "lm_warmup_bump",
            "cpu_lm",
            (*LM, "--steps", "200", "--lr", "2e-2", "--warmup", "30"),
            note="a high peak learning rate: the loss bumps during warm-up, then recovers",
        ),
        Spec("lm_no_clip", "cpu_lm", (*LM, "--steps", "150", "--clip", "inf", "--lr", "1e-3")),
        Spec("lm_hf_key", "cpu_lm", (*LM, "--steps", "150", "--loss-key", "loss", "--save-every", "40")),
        Spec("lm_ddp2", "cpu_lm", (*LM, "--steps", "120"), ranks=2),
        Spec("lm_ddp2_var_len", "cpu_lm", (*LM, "--steps", "120", "--var-len", "--val-every", "20"), ranks=2),
    ]


def healthy_ddp() -> list[Spec]:
    """Healthy multi-rank runs of 2 to 8 gloo ranks (issue 19): each rank its own data stream, the loss and
    grad norm averaged over the ranks; torchrun's --tee 3 and --log-dir as in run_gloo.sh. Sized to take at
    most about 3 minutes each on two busy cores."""
    return [
        Spec(
            "lm_ddp2_constant",
            "cpu_lm",
            (*LM, "--steps", "150", "--schedule", "constant", "--lr", "1e-3", "--seed", "3"),
            ranks=2,
            tee=True,
        ),
        Spec(
            "lm_ddp3_warmup",
            "cpu_lm",
            ("--width", "48", "--seq", "48", "--batch", "6", "--steps", "120", "--schedule", "warmup", "--seed", "4"),
            ranks=3,
            tee=True,
            note="linear warm-up over 20 steps, then constant",
        ),
        Spec(
            "lm_ddp4_cosine",
            "cpu_lm",
            ("--width", "48", "--seq", "48", "--batch", "4", "--steps", "120", "--warmup", "10", "--seed", "5"),
            ranks=4,
            tee=True,
            note="warm-up 10 then cosine to 10%",
        ),
        Spec(
            "lm_ddp6_cosine_var_len",
            "cpu_lm",
            (
                "--width",
                "48",
                "--seq",
                "48",
                "--batch",
                "4",
                "--steps",
                "100",
                "--warmup",
                "10",
                "--var-len",
                "--seed",
                "6",
                "--val-every",
                "20",
            ),
            ranks=6,
            tee=True,
            note="warm-up 10 then cosine, a random sequence length each step, validation every 20 steps",
        ),
        Spec(
            "lm_ddp8_warmup",
            "cpu_lm",
            (
                "--width",
                "32",
                "--seq",
                "32",
                "--batch",
                "2",
                "--steps",
                "100",
                "--schedule",
                "warmup",
                "--warmup",
                "15",
                "--lr",
                "2e-3",
                "--seed",
                "7",
            ),
            ranks=8,
            tee=True,
            note="linear warm-up over 15 steps to 2e-3, then constant",
        ),
        Spec(
            "lm_ddp3_tiny_batch",
            "cpu_lm",
            ("--width", "48", "--seq", "48", "--batch", "2", "--steps", "150", "--lr", "2e-3", "--seed", "8"),
            ranks=3,
            tee=True,
            note="2 sequences a rank: a noisy loss, warm-up 20 then cosine",
        ),
        Spec(
            "lm_ddp4_warmup_bump",
            "cpu_lm",
            (*LM, "--steps", "150", "--lr", "2e-2", "--warmup", "30", "--seed", "9"),
            ranks=4,
            tee=True,
            note="a high peak learning rate over 4 ranks: the loss may bump during warm-up, then recovers",
        ),
        Spec(
            "lm_ddp6_val_ckpt",
            "cpu_lm",
            (
                *LM,
                "--steps",
                "100",
                "--schedule",
                "constant",
                "--lr",
                "2e-3",
                "--seed",
                "10",
                "--val-every",
                "25",
                "--save-every",
                "50",
            ),
            ranks=6,
            tee=True,
            note="constant learning rate, validation every 25 steps, a checkpoint every 50",
        ),
        Spec(
            "lm_ddp8_cosine",
            "cpu_lm",
            ("--width", "32", "--seq", "32", "--batch", "4", "--steps", "80", "--warmup", "8", "--seed", "11"),
            ranks=8,
            tee=True,
            note="warm-up 8 then cosine to 10%",
        ),
    ]


def healthy_lm_loggers() -> list[Spec]:
    return [
        Spec("lm_plain_console", "cpu_lm", (*LM, "--steps", "150", "--console", "plain")),
        Spec("lm_flat_jsonl", "cpu_lm", (*LM, "--steps", "150", "--console", "none", "--also", "flat_jsonl")),
        Spec("lm_csv", "cpu_lm", (*LM, "--steps", "150", "--console", "none", "--also", "csv")),
        Spec("lm_tensorboard", "cpu_lm", (*LM, "--steps", "150", "--console", "none", "--also", "tensorboard")),
        Spec(
            "lm_mlflow",
            "cpu_lm",
            (*LM, "--steps", "120", "--console", "none", "--also", "mlflow"),
            note="MLflow's file store (needs mlflow importable, e.g. mlflow-skinny on PYTHONPATH)",
        ),
        Spec(
            "lm_wandb",
            "cpu_lm",
            (*LM, "--steps", "120", "--console", "none", "--also", "wandb"),
            note="an offline W&B run (needs wandb importable)",
        ),
        Spec(
            "lm_all_loggers",
            "cpu_lm",
            (*LM, "--steps", "120", "--also", "flat_jsonl,csv,tensorboard", "--val-every", "30"),
        ),
    ]


def healthy_rl() -> list[Spec]:
    return [
        Spec("grpo_s0", "cpu_grpo", ("--steps", "200", "--seed", "0")),
        Spec("grpo_s1", "cpu_grpo", ("--steps", "200", "--seed", "1")),
        Spec("grpo_s2", "cpu_grpo", ("--steps", "200", "--seed", "2")),
        Spec("grpo_no_kl", "cpu_grpo", ("--steps", "200", "--kl-coef", "0"), note="no KL penalty, as DAPO"),
        Spec("grpo_kl_high", "cpu_grpo", ("--steps", "200", "--kl-coef", "0.1")),
        Spec("grpo_entropy_bonus", "cpu_grpo", ("--steps", "200", "--entropy-coef", "0.01")),
        Spec("grpo_epochs1", "cpu_grpo", ("--steps", "200", "--epochs", "1")),
        Spec("grpo_epochs4", "cpu_grpo", ("--steps", "150", "--epochs", "4")),
        Spec("grpo_group4", "cpu_grpo", ("--steps", "200", "--group", "4")),
        Spec("grpo_group16", "cpu_grpo", ("--steps", "150", "--group", "16", "--prompts", "8")),
        Spec("grpo_temp07", "cpu_grpo", ("--steps", "200", "--temperature", "0.7")),
        Spec("grpo_val_ckpt", "cpu_grpo", ("--steps", "200", "--val-every", "20", "--save-every", "50")),
        Spec(
            "grpo_short",
            "cpu_grpo",
            (
                "--steps",
                "40",
            ),
        ),
        Spec("grpo_long", "cpu_grpo", ("--steps", "500", "--lr", "2e-3")),
        Spec("grpo_slow_lr", "cpu_grpo", ("--steps", "200", "--lr", "1e-3")),
        Spec("grpo_fast_lr", "cpu_grpo", ("--steps", "200", "--lr", "8e-3")),
        Spec("grpo_prompt4", "cpu_grpo", ("--steps", "250", "--prompt-len", "4", "--max-len", "7")),
        Spec("grpo_prompt2", "cpu_grpo", ("--steps", "150", "--prompt-len", "2", "--max-len", "5")),
        Spec("grpo_tensorboard", "cpu_grpo", ("--steps", "150", "--also", "tensorboard", "--seed", "3")),
        Spec("grpo_big_batch", "cpu_grpo", ("--steps", "120", "--prompts", "48")),
    ]


def fault(kind: str, at: int, rules: list[str], status: str = "failed|degraded") -> dict:
    return {"status": status, "root_cause_rule": rules, "step": at, "fault": kind}


def unhealthy() -> list[Spec]:
    return [
        Spec(
            "lm_lr_high",
            "cpu_lm",
            (*LM, "--steps", "150", "--lr", "0.3", "--fault", "lr_high"),
            expect=fault("lr_high", 1, HURT),
            note="learning rate 0.3 from the first step",
        ),
        Spec(
            "lm_lr_jump",
            "cpu_lm",
            (
                *LM,
                "--steps",
                "200",
                "--fault",
                "lr_jump@100",
                "--schedule",
                "constant",
                "--lr",
                "2e-3",
                "--jump",
                "100",
            ),
            expect=fault("lr_jump", 100, HURT),
        ),
        Spec(
            "lm_lr_jump_var_len",
            "cpu_lm",
            (*LM, "--steps", "200", "--var-len", "--fault", "lr_jump@140", "--jump", "100", "--seed", "1"),
            expect=fault("lr_jump", 140, HURT),
        ),
        Spec(
            "lm_nan",
            "cpu_lm",
            (*LM, "--steps", "150", "--fault", "nan@80"),
            expect=fault("nan", 80, ["non-finite-metric", "non-finite-loss", "loss-divergence"]),
        ),
        Spec(
            "lm_leak",
            "cpu_lm",
            (*LM, "--steps", "120", "--fault", "leak@30"),
            expect=fault("leak", 30, ["host-memory-growth"], "degraded"),
        ),
        Spec(
            "lm_ddp2_lr_jump",
            "cpu_lm",
            (*LM, "--steps", "150", "--fault", "lr_jump@80", "--jump", "100"),
            ranks=2,
            expect=fault("lr_jump", 80, HURT),
        ),
        Spec(
            "lm_ddp4_lr_jump",
            "cpu_lm",
            (
                "--width",
                "48",
                "--seq",
                "48",
                "--batch",
                "4",
                "--steps",
                "120",
                "--fault",
                "lr_jump@70",
                "--jump",
                "100",
            ),
            ranks=4,
            tee=True,
            expect=fault("lr_jump", 70, HURT),
            note="the control of the healthy multi-rank runs: the same prefixed console, with a fault to find",
        ),
        Spec(
            "grpo_lr_jump",
            "cpu_grpo",
            ("--steps", "200", "--fault", "lr_jump@100"),
            expect=fault("lr_jump", 100, RL_BROKEN),
        ),
        Spec(
            "grpo_lr_jump_s1",
            "cpu_grpo",
            ("--steps", "160", "--fault", "lr_jump@60", "--seed", "1"),
            expect=fault("lr_jump", 60, RL_BROKEN),
        ),
        Spec(
            "grpo_lr_high",
            "cpu_grpo",
            ("--steps", "150", "--lr", "0.5", "--fault", "lr_high"),
            expect=fault("lr_high", 1, RL_BROKEN),
        ),
        Spec(
            "grpo_no_kl_jump",
            "cpu_grpo",
            ("--steps", "200", "--fault", "no_kl@80"),
            expect=fault("no_kl", 80, ["kl-blowup", *RL_BROKEN]),
        ),
        Spec(
            "grpo_entropy_sign",
            "cpu_grpo",
            ("--steps", "200", "--fault", "entropy_sign@80"),
            expect=fault("entropy_sign", 80, ["entropy-collapse", *RL_BROKEN]),
        ),
        Spec(
            "grpo_entropy_sign_s1",
            "cpu_grpo",
            ("--steps", "200", "--fault", "entropy_sign@120", "--seed", "1"),
            expect=fault("entropy_sign", 120, ["entropy-collapse", *RL_BROKEN]),
        ),
        Spec(
            "grpo_reward_bug",
            "cpu_grpo",
            ("--steps", "200", "--fault", "reward_bug@100"),
            expect=fault("reward_bug", 100, ["reward-collapse"]),
        ),
        Spec(
            "grpo_reward_bug_s2",
            "cpu_grpo",
            ("--steps", "150", "--fault", "reward_bug@60", "--seed", "2"),
            expect=fault("reward_bug", 60, ["reward-collapse"]),
        ),
        Spec(
            "grpo_nan",
            "cpu_grpo",
            ("--steps", "200", "--fault", "nan@100"),
            expect=fault("nan", 100, ["non-finite-metric", "non-finite-loss"]),
        ),
        Spec(
            "grpo_leak",
            "cpu_grpo",
            ("--steps", "150", "--fault", "leak@50"),
            expect=fault("leak", 50, ["host-memory-growth"], "degraded"),
        ),
    ]


SPECS = [*healthy_lm(), *healthy_ddp(), *healthy_lm_loggers(), *healthy_rl(), *unhealthy()]


def capture(out: Path, only: str) -> None:
    for spec in SPECS:
        if only and only not in spec.name:
            continue
        run = out / spec.name
        if (run / "driver.log").exists() and "Training finished" in (run / "driver.log").read_text():
            continue
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        script = str(HERE / f"{spec.script}.py")
        cmd = [PY, script, "--run-dir", str(run), "--name", spec.name, *spec.args]
        if spec.ranks > 1:
            cmd = [
                PY,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(spec.ranks),
                "--master_port",
                "29517",
                *(("--tee", "3", "--log-dir", str(run / "torchrun_logs")) if spec.tee else ()),
                script,
                "--run-dir",
                str(run),
                "--name",
                spec.name,
                *spec.args,
            ]
        t = time.time()
        with open(run / "driver.log", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(f"{spec.name}: rc {rc}, {time.time() - t:.1f} s", flush=True)


KEEP_FILE_LOGGER = {"lm_all_loggers", "lm_val_ckpt", "grpo_val_ckpt", "grpo_nan", "lm_nan", "lm_ddp2"}


SOURCE_ROOT = str(HERE.parents[1])  # tracebacks name the checkout: it becomes a neutral path in a fixture


def _xz(src: Path, dest: Path, run: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    data = src.read_bytes().replace(SOURCE_ROOT.encode(), b"/src/forensics")
    with lzma.open(dest, "wb", preset=9 | lzma.PRESET_EXTREME) as out:
        out.write(data.replace(str(run).encode(), f"/runs/{run.name}".encode()))


def _trim_wandb(src: Path, dest: Path) -> None:
    """The run's history records only, framed as W&B frames them: its other records (the run, the host, the
    environment, files) name this machine's paths."""
    from wandb.proto import wandb_internal_pb2

    from forensics.sources.wandb_offline import BLOCK, FIRST, FULL, LAST, MIDDLE, RECORD_HEADER, checksum, records

    data = src.read_bytes()
    out = bytearray(data[:7])
    for payload in records(data):
        if wandb_internal_pb2.Record.FromString(payload).WhichOneof("record_type") != "history":
            continue
        first = True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < RECORD_HEADER:
                out += b"\0" * left
                continue
            piece, payload = payload[: left - RECORD_HEADER], payload[left - RECORD_HEADER :]
            kind = (FULL if not payload else FIRST) if first else (LAST if not payload else MIDDLE)
            out += struct.pack("<IHB", checksum(kind, piece), len(piece), kind) + piece
            first = False
            if not payload:
                break
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(bytes(out))


def _expected(spec: Spec, steps: int) -> str:
    lines = [
        f"# Real CPU run (scripts/capture/cpu_corpus.py, {spec.script}.py {' '.join(spec.args)}"
        + (f", {spec.ranks} gloo ranks under torchrun" if spec.ranks > 1 else "")
        + ")."
    ]
    if spec.note:
        lines.append(f"# {spec.note}.")
    if not spec.expect:
        lines += ["status: healthy", "root_cause: null", f"min_steps: {steps}"]
        return "\n".join(lines) + "\n"
    e = spec.expect
    statuses = e["status"].split("|")
    tolerance = max(10, round(0.1 * e["step"]))
    lines += [
        f"# Fault {e['fault']} injected at step {e['step']}: found there within 10% (at least 10 steps).",
        f"status: {statuses[0] if len(statuses) == 1 else '[' + ', '.join(statuses) + ']'}",
        f"root_cause: {{rule: [{', '.join(e['root_cause_rule'])}], step: {e['step']}}}",
        f"step_tolerance: {tolerance}",
        f"fault: {{kind: {e['fault']}, step: {e['step']}}}",
        f"min_steps: {steps}",
    ]
    return "\n".join(lines) + "\n"


def fixtures(raw: Path, dest: Path) -> None:
    """Each captured run as a fixture: its console compressed (xz; forensics reads it as is), the other
    loggers' files as written, the file logger's JSONL only where a run is meant to test it (it repeats
    the console), and an expected.yaml."""
    for spec in SPECS:
        run = raw / spec.name
        log = run / "driver.log"
        if not log.exists() or ("Training finished" not in log.read_text() and not spec.expect):
            print(f"{spec.name}: not captured (or not finished), skipped")
            continue
        out = dest / f"cpu_{spec.name}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        _xz(log, out / "driver.log.xz", run)
        for path in sorted(run.rglob("*")):
            rel = path.relative_to(run)
            if not path.is_file() or rel.parts[0] == "checkpoints" or path.name == "driver.log":
                continue
            if rel.parts[0] == "logs" and spec.name not in KEEP_FILE_LOGGER and "--console" not in spec.args:
                continue
            if rel.parts[0] == "mlruns" and "metrics" not in rel.parts:  # run metadata names this machine's paths
                continue
            if rel.parts[0] == "wandb":
                if path.suffix == ".wandb":
                    _trim_wandb(path, out / rel)
                continue
            if path.suffix in (".jsonl", ".csv"):
                _xz(path, out / f"{rel}.xz", run)
            else:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out / rel)
        steps = sum(1 for line in log.read_text().splitlines() if line.startswith(("step:", "step ")))
        steps = steps or int(spec.args[spec.args.index("--steps") + 1])
        (out / "expected.yaml").write_text(_expected(spec, min(steps, 10_000)))
        print(f"{spec.name}: {sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) // 1024} KiB")


def tally(runs: Path) -> None:
    """The closing figures over every fixture run with an expected.yaml: per detector, the share of healthy runs
    it raised an alarm (above info) on; over the injected faults, how many were found, and the step error."""
    import yaml

    from forensics.model import severity_rank
    from forensics.pipeline import analyze

    healthy, alarmed, alarms, infos, faults = 0, 0, Counter(), Counter(), []
    for expected_file in sorted(runs.glob("*/expected.yaml")):
        expected = yaml.safe_load(expected_file.read_text())
        a = analyze([expected_file.parent])
        if expected["status"] == "healthy":
            healthy += 1
            raised = {f.rule for f in a.findings if severity_rank(f.severity) > 0}
            alarmed += bool(raised)
            alarms.update(raised)
            infos.update({f.rule for f in a.findings if severity_rank(f.severity) == 0})
        elif "fault" in expected:
            root, want = a.verdict.root_cause, expected["root_cause"]
            error = abs(root.step - want["step"]) if root is not None and root.step is not None else None
            found = error is not None and root.rule in want["rule"] and error <= expected["step_tolerance"]
            faults.append((expected_file.parent.name, expected["fault"]["kind"], want["step"], root, error, found))
    print(f"healthy runs: {healthy}; runs with an alarm: {alarmed}")
    from forensics.pipeline import load_catalogue

    detectors = sorted(e.id for e in load_catalogue([], text_rules=False).entries.values() if e.is_detector)
    for rule in sorted(set(detectors) | set(alarms) | set(infos)):
        print(f"  {rule:32s} alarms {alarms[rule]}/{healthy} ({alarms[rule] / healthy:.1%}), info {infos[rule]}")
    hits = [f for f in faults if f[5]]
    errors = [f[4] for f in hits]
    print(
        f"unhealthy runs: {len(faults)}; found at the right step: {len(hits)} ({len(hits) / max(1, len(faults)):.0%})"
    )
    if errors:
        print(f"  step error: median {sorted(errors)[len(errors) // 2]}, max {max(errors)}")
    for name, kind, step, root, error, found in faults:
        got = f"{root.rule}@{root.step}" if root else "nothing"
        print(f"  {'ok ' if found else 'MISS'} {name:28s} {kind}@{step}: {got} (error {error})")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("out", type=Path)
    c.add_argument("--only", default="")
    f = sub.add_parser("fixtures")
    f.add_argument("raw", type=Path)
    f.add_argument("dest", type=Path)
    t = sub.add_parser("tally")
    t.add_argument("runs", type=Path)
    args = ap.parse_args()
    if args.cmd == "capture":
        capture(args.out, args.only)
    elif args.cmd == "fixtures":
        fixtures(args.raw, args.dest)
    else:
        tally(args.runs)


if __name__ == "__main__":
    main()
