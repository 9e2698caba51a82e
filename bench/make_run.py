"""Generate a large, realistic run folder of a failed multi-node verl/torchrun job, for benchmarks.

    python bench/make_run.py 2G /tmp/bench_runs/run2g --seed 7

What it writes (sizes scale with SIZE; the shapes are those of real lines, see
shared/reference/*.md and the Ray captures):

- `driver.log`: the verl driver: Ray init, the TaskRunner's config print, one `step:N - …` line per step (20,000
  steps by default, whatever SIZE; 150 metrics at full precision, the actor's as `np.float64(...)`), tqdm, and
  every WorkerDict's output re-printed with `(WorkerDict pid=…, ip=…)` prefixes: NCCL INFO floods
  (Init START/COMPLETE, Channel, Ring, Trees, P2P/IPC and NET transports, COLL and TUNING lines), a flood of
  ProcessGroupNCCL's "device used by this process is currently unknown" warning (10 % of SIZE), and a reward
  server outage that the TaskRunner logs at every retry (1 %: a flood that the rules' triggers do match).
- `torchrun_logs/<run>/attempt_0/<rank>/stderr.log` (+ a small stdout.log): each rank's NCCL floods,
  Python logging and c10 lines (every k-th step where the rank's share of SIZE cannot hold every step).
- `ray/<host>/session_*/logs/`: raylet.out (`[ts I pid tid] (raylet) file.cc:N: msg`), gcs_server.out on
  the head node, and per worker `worker-<id>-01000000-<pid>.out|err` and `python-core-worker-<id>_<pid>.log`.
- `launcher.log`: the torchrun agent of one node, ending in the ChildFailedError summary.

One failure is injected: rank R runs out of CUDA memory (real message shape) during step S; every other rank's
ProcessGroupNCCL watchdog times out on the next all-reduce 600 s later; torchrun's summary names another
rank, the first process to exit, as its "Root Cause". A few harmless tracebacks are sprinkled in earlier.
The truth is written beside the folder as `<OUT>.truth.json` (never inside it). Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

START = datetime(2025, 10, 16, 1, 12, 4, 217000, tzinfo=timezone.utc)
STEP_SECONDS = 71.3
WATCHDOG_MS = 600_000
GPUS_PER_NODE = 8
BLOCK_BYTES = 1 << 20

SHARE_DRIVER = 0.35  # of which the warning flood takes WARNING_SHARE and the step lines what their count needs
SHARE_TORCHRUN = 0.30
SHARE_WORKER_OUT = 0.25
# the rest (about 10 %) goes to raylet.out, gcs_server.out and python-core-worker logs
WARNING_SHARE = 0.10  # Ray-prefixed ProcessGroupNCCL "device ... currently unknown" warnings in the driver log
RETRY_SHARE = 0.01  # a reward server's outage: one worker logs the same failed request again and again
STEPS = 20_000  # a long run: the step count does not grow with SIZE, the floods do

COLL_OPS = (
    ("AllReduce", 7, 0),
    ("AllGather", 9, 0),
    ("ReduceScatter", 9, 0),
    ("Broadcast", 0, 0),
    ("AllReduce", 9, 0),
)
# 150 metrics in the key families of a verl >= 0.5 PPO/GRPO step line (verl/trainer/ppo/metric_utils.py,
# ray_trainer.py, rollout corrections, reward extras); the first 50 are the keys of this generator's earlier lines
METRICS = (
    "global_seqlen/min",
    "global_seqlen/max",
    "global_seqlen/minmax_diff",
    "global_seqlen/balanced_min",
    "global_seqlen/balanced_max",
    "global_seqlen/mean",
    "actor/entropy",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    "actor/grad_norm",
    "perf/mfu/actor",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/cpu_memory_used_gb",
    "actor/lr",
    "training/global_step",
    "training/epoch",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/rewards/max",
    "critic/rewards/min",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "prompt_length/max",
    "prompt_length/min",
    "prompt_length/clip_ratio",
    "timing_s/generate_sequences",
    "timing_s/reshard",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
    "timing_per_token_ms/gen",
    "timing_per_token_ms/update_actor",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/loss",
    "actor/entropy_coeff",
    "perf/mfu/actor_infer",
    "perf/mfu/critic",
    "critic/returns/mean",
    "critic/returns/max",
    "critic/returns/min",
    "critic/values/mean",
    "critic/values/max",
    "critic/values/min",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "critic/lr",
    "critic/vf_explained_var",
    "response_length_non_aborted/mean",
    "response_length_non_aborted/max",
    "response_length_non_aborted/min",
    "response_length_non_aborted/clip_ratio",
    "response/aborted_ratio",
    "num_turns/min",
    "num_turns/max",
    "num_turns/mean",
    "tool_call_counts/min",
    "tool_call_counts/max",
    "tool_call_counts/mean",
    "timing_s/start_profile",
    "timing_s/gen_max",
    "timing_s/values",
    "timing_s/update_critic",
    "timing_s/update_weights",
    "timing_s/testing",
    "timing_s/save_checkpoint",
    "timing_s/dump_rollout_generations",
    "timing_s/stop_profile",
    "timing_s/agent_loop/generate_sequences/min",
    "timing_s/agent_loop/generate_sequences/max",
    "timing_s/agent_loop/generate_sequences/mean",
    "timing_s/agent_loop/tool_calls/min",
    "timing_s/agent_loop/tool_calls/max",
    "timing_s/agent_loop/tool_calls/mean",
    "timing_s/agent_loop/slowest/generate_sequences",
    "timing_s/agent_loop/slowest/tool_calls",
    "timing_s/agent_loop/slowest/prompt_length",
    "timing_s/agent_loop/slowest/response_length",
    "timing_per_token_ms/ref",
    "timing_per_token_ms/adv",
    "timing_per_token_ms/values",
    "timing_per_token_ms/update_critic",
    "variance_proxy/proxy1_signal_strength",
    "variance_proxy/proxy2_total_variance",
    "variance_proxy/proxy3_pure_noise",
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
    "rollout_corr/training_ppl",
    "rollout_corr/training_log_ppl",
    "rollout_corr/rollout_ppl",
    "rollout_corr/rollout_log_ppl",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/log_ppl_diff",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/log_ppl_diff_max",
    "rollout_corr/log_ppl_diff_min",
    "rollout_corr/ppl_ratio",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_std",
    "rollout_corr/rollout_is_min",
    "rollout_corr/rollout_is_max",
    "rollout_corr/rollout_is_eff_sample_size",
    "rollout_corr/rollout_is_veto_fraction",
    "rollout_corr/rollout_is_catastrophic_token_fraction",
    "rollout_corr/rollout_is_ratio_fraction_high",
    "rollout_corr/rollout_is_ratio_fraction_low",
    "rollout_corr/rollout_rs_mean",
    "rollout_corr/rollout_rs_masked_fraction",
    "rollout_corr/rollout_rs_seq_masked_fraction",
    "reward_extra/acc/mean",
    "reward_extra/acc/max",
    "reward_extra/acc/min",
    "reward_extra/format/mean",
    "reward_extra/format/max",
    "reward_extra/format/min",
    "reward_extra/length_penalty/mean",
    "reward_extra/length_penalty/max",
    "reward_extra/length_penalty/min",
    "actor/pg_loss/token_mean",
    "actor/ppo_kl/max",
    "actor/ppo_kl/min",
    "actor/grad_norm/pre_clip",
    "actor/clip_ratio_c",
    "perf/max_memory_allocated_gb/rollout",
    "perf/max_memory_reserved_gb/rollout",
)
RAYLET_EVENTS = (  # (template, weight) of the one-line messages between the periodic dumps; spills are rare
    (
        "node_manager.cc:{n}: Disconnecting worker, graceful=false, exit_type=INTENDED_USER_EXIT, worker_id={wid}",
        20,
    ),
    ("store.cc:{n}: Disconnecting client due to connection error with code 2: End of file", 20),
    ("runtime_env_agent_client.cc:{n}: Create runtime env for job 01000000", 10),
    ("accessor.cc:{n}: Received address and liveness notification for node, IsAlive = 1 node_id={nid}", 15),
    ("object_store.cc:{n}: Object store current usage {used} / 214.748 GB.", 25),
    (
        "local_object_manager.cc:{n}: :info_message:Spilled {mib} MiB, {k} objects, write throughput {thr} MiB/s.",
        0.5,
    ),
)
RAYLET_TEMPLATES = [t for t, _ in RAYLET_EVENTS]
RAYLET_WEIGHTS = [w for _, w in RAYLET_EVENTS]
STATE_DUMP = """[state-dump] Node ID: {nid}
[state-dump] Node name: {ip}
[state-dump] InitialConfigResources: {{node:{ip}: 1, memory: 1.73537e+12, object_store_memory: 2.14748e+11, CPU: 128, \
GPU: 8}}
[state-dump] ClusterLeaseManager:
[state-dump] ========== Node: {nid} =================
[state-dump] Infeasible queue length: 0
[state-dump] Schedule queue length: 0
[state-dump] Grant queue length: {k}
[state-dump] num_waiting_for_resource: 0
[state-dump] num_waiting_for_plasma_memory: 0
[state-dump] num_waiting_for_remote_node_resources: 0
[state-dump] num_worker_not_started_by_job_config_not_exist: 0
[state-dump] num_worker_not_started_by_registration_timeout: 0
[state-dump] num_tasks_waiting_for_workers: 0
[state-dump] num_cancelled_leases: 0
[state-dump] cluster_resource_scheduler state:
[state-dump] Waiting leases size: 0
[state-dump] Number of granted lease arguments: {k}
[state-dump] Number of pinned lease arguments: 0
[state-dump] Total size of pinned lease arguments: 0
[state-dump] Number of total spilled leases: 0
[state-dump] Resource usage {{
[state-dump] }}
[state-dump] Granted leases by scheduling class:
[state-dump] ==================================================
[state-dump] LocalObjectManager:
[state-dump] - num pinned objects: {objs}
[state-dump] - pinned objects size: {size}
[state-dump] - num objects pending restore: 0
[state-dump] - num objects pending spill: 0
[state-dump] - num bytes currently spilled: 0
[state-dump] - cumulative spill requests: 0
[state-dump] ObjectManager:
[state-dump] - num local plasma objects: {objs}
[state-dump] - num unfulfilled push requests: 0
[state-dump] - num object pull requests: {k}
[state-dump] - num chunks received total: {chunks}
[state-dump] Event stats:
[state-dump] Global stats: {events} total (12 active)
[state-dump] Queueing time: mean = {q:.2f}ms, max = {qmax:.2f}ms, min = 0.01ms, total = {qtot:.2f}ms
[state-dump] Execution time:  mean = {x:.2f}ms, total = {xtot:.2f}ms
[state-dump] PushManager:
[state-dump] - num pushes remaining: 0
[state-dump] - num chunks in flight: 0
""".replace("\\\n", "")
PLASMA_DUMP = """Current usage: {used} / 214.748 GB
- num bytes created total: {size}
0 pending objects of total size 0MB
- objects spillable: {objs}
- bytes spillable: {size}
- objects unsealed: 0
- bytes unsealed: 0
- objects in use: {objs}
- bytes in use: {size}
- objects evictable: 0
- bytes evictable: 0

- objects created by worker: {objs}
- bytes created by worker: {size}
- objects restored: 0
- bytes restored: 0
- objects received: {k}
- bytes received: {size}
- objects errored: 0
- bytes errored: 0
"""
CORE_WORKER_INFO = (
    "task_event_buffer.cc:{n}: Reporting task events to GCS every 1000ms.",
    "core_worker.cc:{n}: Submitting actor task {tid} to actor {aid}",
    "normal_task_submitter.cc:{n}: Task {tid} finished, returning {k} objects",
    "reference_counter.cc:{n}: Object {oid} went out of scope, freeing {k} references",
    "direct_actor_transport.cc:{n}: Actor task {tid} received, queue length {k}",
)


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    ip: str
    pid: int
    dev: int
    bus: str
    worker_id: str


@dataclass(frozen=True)
class Plan:
    seed: int
    size: int
    world: int
    steps: int  # steps completed before the failing one
    metrics: int  # keys on each step line
    oom_rank: int
    first_exit_rank: int
    run_id: str
    ranks: tuple[Rank, ...]
    comms: tuple[tuple[str, str], ...]  # (comm pointer, commId) of each communicator every rank creates
    driver_pid: int
    task_runner_pid: int

    @property
    def fail_step(self) -> int:
        return self.steps + 1

    def step_start(self, step: int) -> datetime:
        return START + timedelta(seconds=95 + STEP_SECONDS * (step - 1))

    @property
    def oom_time(self) -> datetime:
        return self.step_start(self.fail_step) + timedelta(seconds=41.62)

    @property
    def watchdog_time(self) -> datetime:
        return self.oom_time + timedelta(milliseconds=WATCHDOG_MS + 1_204)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(?i)\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size like 512M, 1G, 4G")
    return int(float(m[1]) * 1024 ** " KMGT".index(m[2].upper() or " "))


def hexs(rng: random.Random, n: int) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def make_plan(size: int, seed: int, world: int, steps: int = STEPS, metrics: int = len(METRICS)) -> Plan:
    rng = random.Random(seed)
    nodes = max(1, world // GPUS_PER_NODE)
    hosts = [f"gpu-{rng.choice(['a', 'b', 'c'])}{n:03d}" for n in range(nodes)]
    ips = [f"10.{rng.randint(16, 31)}.{rng.randint(0, 255)}.{rng.randint(2, 254)}" for _ in range(nodes)]
    pids = rng.sample(range(20_000, 4_000_000), world + 2)
    ranks = tuple(
        Rank(
            r,
            hosts[r // GPUS_PER_NODE % nodes],
            ips[r // GPUS_PER_NODE % nodes],
            pids[r],
            r % GPUS_PER_NODE,
            rng.choice(["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]),
            hexs(rng, 56),
        )
        for r in range(world)
    )
    comms = tuple((f"0x{rng.randint(0x55D000000000, 0x55DFFFFFFFFF):x}", f"0x{hexs(rng, 16)}") for _ in range(3))
    oom = rng.randrange(1, world)
    first_exit = rng.choice([r for r in range(world) if r // GPUS_PER_NODE != oom // GPUS_PER_NODE] or [0])
    return Plan(
        seed,
        size,
        world,
        steps,
        metrics,
        oom,
        first_exit,
        f"{hexs(rng, 8)}-{hexs(rng, 4)}",
        ranks,
        comms,
        pids[world],
        pids[world + 1],
    )


class BlockWriter:
    """Buffered text writer that knows how many bytes it has written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("w", encoding="utf-8", newline="\n")
        self._parts: list[str] = []
        self._pending = 0
        self.written = 0

    def line(self, text: str) -> None:
        self._parts.append(text)
        self._parts.append("\n")
        self._pending += len(text) + 1
        if self._pending >= BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        data = "".join(self._parts)
        self._fh.write(data)
        self.written += len(data.encode("utf-8")) if not data.isascii() else len(data)
        self._parts.clear()
        self._pending = 0

    @property
    def size(self) -> int:
        return self.written + self._pending

    def close(self, mtime: datetime) -> None:
        self.flush()
        name = self._fh.name
        self._fh.close()
        stamp = mtime.timestamp()
        os.utime(name, (stamp, stamp))


class Quota:
    """Whole lines per step from a fractional rate, the remainders carried over."""

    def __init__(self, per_step: float):
        self.per_step = per_step
        self.owed = 0.0

    def take(self) -> int:
        self.owed += self.per_step
        whole = int(self.owed)
        self.owed -= whole
        return whole


# ---- line templates -------------------------------------------------------------------------------------------


def nccl_prefix(rk: Rank, tid: int) -> str:
    return f"{rk.host}:{rk.pid}:{tid} [{rk.dev}] NCCL INFO "


def nccl_init_block(plan: Plan, rk: Rank, comm_index: int, rng: random.Random, first: bool) -> list[str]:
    """The INFO lines of one communicator's creation, in the order NCCL 2.28.9 prints them (GPU captures)."""
    comm, comm_id = plan.comms[comm_index]
    comm = f"0x{int(comm, 16) + rk.rank * 0x1000:x}"
    p = nccl_prefix(rk, rk.pid)
    n = plan.world
    nodes = max(1, n // GPUS_PER_NODE)
    out: list[str] = []
    if first:
        out += [
            f"{p}ENV/Plugin: Could not find: libnccl-env.so",
            f"{p}Bootstrap: Using eth0:{rk.ip}<0>",
            f"{p}cudaDriverVersion 13000",
            f"{p}NCCL version 2.28.9+cuda13.0",
            f"{p}Comm config Blocking set to 1",
            f"{p}NET/Plugin: Could not find: libnccl-net.so",
            f"{p}NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB eth0:{rk.ip}<0>",
            f"{p}Initialized NET plugin IB",
        ]
    out += [
        f"{p}Assigned NET plugin IB to comm",
        f"{p}Using network IB",
        f"{p}ncclCommInitRankConfig comm {comm} rank {rk.rank} nranks {n} cudaDev {rk.dev} nvmlDev {rk.dev} "
        f"busId {rk.bus} commId {comm_id} - Init START",
        f"{p}RAS client listening socket at 127.0.0.1<28028>",
        f"{p}Bootstrap timings total {rng.uniform(0.0004, 2):.6f} (create 0.000019, send 0.000067, "
        f"recv {rng.uniform(0.0001, 1.5):.6f}, ring 0.000061, delay 0.000001)",
        f"{p}MNNVL busId 0x{rk.bus} fabric UUID 0.0 cliqueId 0x0 state 3 healthMask 0x0",
        f"{p}ncclTopoGetCpuAffinity: Affinity for GPU {rk.dev} is empty, ignoring. (GPU affinity =  ; "
        "CPU affinity = 0-127).",
        f"{p}NCCL_NVLS_ENABLE set by environment to 0.",
        f"{p}comm {comm} rank {rk.rank} nRanks {n} nNodes {nodes} localRanks {GPUS_PER_NODE} "
        f"localRank {rk.dev} MNNVL 0",
    ]
    order = " ".join(str(r) for r in range(n))
    out += [f"{p}Channel {ch:02d}/24 : {order}" for ch in range(24)]
    up = (rk.rank - 1) // 2 if rk.rank else -1
    down = "/".join(str(c) if c < n else "-1" for c in (2 * rk.rank + 1, 2 * rk.rank + 2)) + "/-1"
    out.append(f"{p}Trees " + " ".join(f"[{c}] {down}->{rk.rank}->{up}" for c in range(24)))
    out += [
        f"{p}P2P Chunksize set to 524288",
        f"{p}PROFILER/Plugin: Could not find: libnccl-profiler.so",
        f"{p}Check P2P Type isAllDirectP2p 0 directMode 0 isAllCudaP2p 1",
        f"{nccl_prefix(rk, rk.pid + 21 + comm_index)}[Proxy Service] Device {rk.dev} CPU core {rng.randint(0, 99)}",
        f"{nccl_prefix(rk, rk.pid + 22 + comm_index)}[Proxy Service UDS] Device {rk.dev} CPU core {rng.randint(0, 99)}",
        f"{p}TUNER/Plugin: Could not find: libnccl-tuner.so",
        f"{p}threadThresholds 8/8/64 | {8 * n}/8/64 | 512 | 512",
        f"{p}24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
        f"{p}CC Off, workFifoBytes 1048576",
        f"{p}ncclCommInitRankConfig comm {comm} rank {rk.rank} nranks {n} cudaDev {rk.dev} nvmlDev {rk.dev} "
        f"busId {rk.bus} commId {comm_id} - Init COMPLETE",
        f"{p}Init timings - ncclCommInitRankConfig: rank {rk.rank} nranks {n} total {rng.uniform(0.4, 9):.2f} "
        f"(kernels {rng.uniform(0.1, 0.4):.2f}, alloc {rng.uniform(0, 0.05):.2f}, bootstrap {rng.uniform(0.0, 5):.2f}, "
        f"allgathers {rng.uniform(0, 0.2):.2f}, topo {rng.uniform(0.01, 0.6):.2f}, graphs {rng.uniform(0, 0.05):.2f}, "
        f"connections {rng.uniform(0.01, 2):.2f}, rest {rng.uniform(0, 0.1):.2f})",
    ]
    prev, nxt = (rk.rank - 1) % n, (rk.rank + 1) % n
    for ch in range(24):
        if rk.dev < GPUS_PER_NODE - 1:
            out.append(f"{p}Channel {ch:02d}/0 : {rk.rank}[{rk.dev}] -> {nxt}[{nxt % GPUS_PER_NODE}] via P2P/CUMEM")
        else:
            out.append(
                f"{p}Channel {ch:02d}/0 : {rk.rank}[{rk.dev}] -> {nxt}[{nxt % GPUS_PER_NODE}] [send] "
                f"via NET/IB/{ch % 4}/GDRDMA"
            )
            out.append(
                f"{p}Channel {ch:02d}/0 : {prev}[{prev % GPUS_PER_NODE}] -> {rk.rank}[{rk.dev}] [receive] "
                f"via NET/IB/{ch % 4}/GDRDMA"
            )
    out.append(f"{p}Connected all rings, use ring PXN 0 GDR 1")
    return out


class CollFlood:
    """NCCL_DEBUG_SUBSYS=COLL,TUNING lines of one rank: one per collective call, with rising opCounts."""

    def __init__(self, plan: Plan, rk: Rank, rng: random.Random):
        comm = plan.comms[0][0]
        self.comm = f"0x{int(comm, 16) + rk.rank * 0x1000:x}"
        self.prefix = nccl_prefix(rk, rk.pid + 40)
        self.n = plan.world
        self.rng = rng
        self.op_count = 0
        self.stream = f"0x{rng.randint(0x55D000000000, 0x55DFFFFFFFFF):x}"
        self.buf = rng.randint(0x7F0000000000, 0x7F7FFFFFFFFF) & ~0xFFFFF

    def line(self) -> str:
        rng = self.rng
        self.op_count += 1
        if self.op_count % 5 == 0:
            size = 1 << rng.randint(10, 28)
            return (
                f"{self.prefix}{rng.choice(COLL_OPS)[0]}: {size} Bytes -> Algo {rng.choice(['RING', 'TREE'])} "
                f"proto {rng.choice(['SIMPLE', 'LL', 'LL128'])} channel{{Lo..Hi}}={{0..{rng.choice([7, 15, 23])}}}"
            )
        name, dtype, op = COLL_OPS[self.op_count % len(COLL_OPS)]
        send = self.buf + rng.randint(0, 1 << 16) * 0x200
        return (
            f"{self.prefix}{name}: opCount {self.op_count:x} sendbuff 0x{send:x} recvbuff 0x{send + 0x400000:x} "
            f"count {rng.choice([1, 64, 4096, 262144, 1048576, 16777216])} datatype {dtype} op {op} root 0 "
            f"comm {self.comm} [nranks={self.n}] stream {self.stream}"
        )


def iso(ts: datetime, sep: str = " ") -> str:
    return ts.strftime(f"%Y-%m-%d{sep}%H:%M:%S,") + f"{ts.microsecond // 1000:03d}"


def glog(ts: datetime) -> str:
    """c10's month-day form: `1016 03:31:38.929220797` (month not zero-padded)."""
    nanos = (ts.microsecond // 1000 * 7919 + ts.second * 131) % 1000
    return f"{ts.month}{ts.day:02d} {ts.strftime('%H:%M:%S')}.{ts.microsecond:06d}{nanos:03d}"


def vllm_ts(ts: datetime) -> str:
    return ts.strftime("%m-%d %H:%M:%S")


def worker_log_lines(rk: Rank, step: int, ts: datetime, rng: random.Random) -> list[str]:
    """Timestamped lines a training rank prints every step (Python logging, vLLM, memory helper)."""
    alloc = rng.uniform(38, 62)
    return [
        f"{iso(ts)} - verl.workers.fsdp_workers - INFO - [rank {rk.rank}] step {step}: "
        f"After update policy, memory allocated (GB): {alloc:.2f}, "
        f"memory reserved (GB): {alloc + rng.uniform(2, 9):.2f}, "
        f"device memory used/total (GB): {alloc + rng.uniform(9, 14):.2f}/79.19",
        f"INFO {vllm_ts(ts + timedelta(seconds=3))} [executor_base.py:{rng.randint(200, 260)}] "
        f"It took {rng.uniform(0.4, 2.5):.6f} seconds to wake up tags ['weights', 'kv_cache'].",
        f"INFO {vllm_ts(ts + timedelta(seconds=19))} [block_pool.py:321] Successfully reset prefix cache",
        f"INFO {vllm_ts(ts + timedelta(seconds=20))} [gpu_worker.py:104] Sleep mode freed "
        f"{rng.uniform(40, 60):.2f} GiB memory, {rng.uniform(4, 12):.2f} GiB memory is still in use.",
    ]


def harmless_traceback(rng: random.Random) -> list[str]:
    """A retried download: logged with its traceback, then the run goes on."""
    return [
        "WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) "
        "after connection broken by 'ProtocolError('Connection aborted.', ConnectionResetError(104, "
        "'Connection reset by peer'))': /api/models/Qwen/Qwen2.5-7B-Instruct/revision/main",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.10/site-packages/urllib3/connectionpool.py", line 793, in urlopen',
        "    response = self._make_request(",
        '  File "/usr/lib/python3.10/site-packages/urllib3/connectionpool.py", line 537, in _make_request',
        "    response = conn.getresponse()",
        '  File "/usr/lib/python3.10/http/client.py", line 1375, in getresponse',
        "    response.begin()",
        f"ConnectionResetError: [Errno 104] Connection reset by peer (attempt {rng.randint(1, 3)} of 5, retrying)",
    ]


def oom_traceback(plan: Plan, rk: Rank) -> list[str]:
    """The failing rank's traceback; the OutOfMemoryError line as torch 2.11 prints it (GPU captures)."""
    rng = random.Random(f"{plan.seed}:oom")  # the same event in every file that shows it
    tried = rng.choice(["3.15", "7.42", "11.87", "18.55"])
    free = rng.uniform(0.9, 7.9)
    in_use = 139.80 - free
    alloc = in_use - rng.uniform(0.2, 3)
    return [
        "Traceback (most recent call last):",
        '  File "/opt/verl/verl/single_controller/ray/base.py", line 701, in func',
        "    return getattr(self.worker_dict[key], name)(*args, **kwargs)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/opt/verl/verl/workers/fsdp_workers.py", line 810, in update_actor',
        "    metrics = self.actor.update_policy(data=data)",
        "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/opt/verl/verl/workers/actor/dp_actor.py", line 432, in update_policy',
        "    entropy, log_prob = self._forward_micro_batch(model_inputs, temperature=temperature)",
        "                        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/opt/verl/verl/workers/actor/dp_actor.py", line 187, in _forward_micro_batch',
        "    logits_rmpad = output.logits.squeeze(0)  # (total_nnz, vocab_size)",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried} GiB. GPU {rk.dev} has a total capacity "
        f"of 139.80 GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has "
        f"{in_use:.2f} GiB memory in use. Of the allocated memory {alloc:.2f} GiB is allocated by PyTorch, and "
        f"{(in_use - alloc) * 1024 * 0.1:.2f} MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
    ]


def seq_at_failure(plan: Plan) -> int:
    return 460 * plan.fail_step + 17


DUMP_HINT = (
    "This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order "
    "of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, "
    "this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications "
    "library (e.g. NCCL), etc. "
)
ABORT_FRAMES = [
    "frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, "
    "std::allocator<char> >) + 0x9d (0x7fb5f0d7305d in "
    "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libc10.so)",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
    "std::ratio<1l, 1000l> > >) + 0x2a7 (0x7fb53c302ba7 in "
    "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so)",
    "frame #2: c10d::ProcessGroupNCCL::Watchdog::runLoop() + 0x17b1 (0x7fb53c307fc1 in "
    "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so)",
    "frame #3: <unknown function> + 0xecdb4 (0x7fb5c0eecdb4 in /lib/x86_64-linux-gnu/libstdc++.so.6)",
    "",
]


def watchdog_lines(plan: Plan, rk: Rank) -> list[str]:
    """ProcessGroupNCCL's report on a rank that waited for the OOM rank, as torch 2.11 prints it (GPU captures)."""
    rng = random.Random(f"{plan.seed}:watchdog:{rk.rank}")
    ts = plan.watchdog_time + timedelta(milliseconds=rng.randint(0, 900))
    seq = seq_at_failure(plan)
    enq = seq + rng.randint(0, 4)
    ran = WATCHDOG_MS + rng.randint(3, 2500)
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rk.rank}]"
    work = f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=524288, NumelOut=524288, Timeout(ms)={WATCHDOG_MS})"
    timeout = (
        f"[Rank {rk.rank}] Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds "
        "before timing out."
    )

    def head(line: int, later_ms: int = 0) -> str:
        return f"[rank{rk.rank}]:[E{glog(ts + timedelta(milliseconds=later_ms))} ProcessGroupNCCL.cpp:{line}]"

    return [
        f"{head(689)} {timeout}",
        f"{head(2303)} {pg}  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: "
        f"{enq}, last completed work: {seq - 1}",
        f"{head(736)} Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. "
        "You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
        f"{head(2636, 3)} {pg} First PG on this rank to signal dumping.",
        f"{head(1914, 550)} {pg} Received a dump signal due to a collective timeout from this local rank and we will "
        f"try our best to dump the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {seq - 1}."
        + DUMP_HINT,
        f"{head(1628, 551)} {pg} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active "
        "collectives: 0",
        f"{head(750, 60_000)} [Rank {rk.rank}] Some NCCL operations have failed or timed out. Due to the asynchronous "
        "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{head(764, 60_000)} [Rank {rk.rank}] To avoid data inconsistency, we are taking the entire process down.",
        f"{head(2119, 60_001)} {pg} Process group watchdog thread terminated with exception: {timeout}",
        "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:692 "
        "(most recent call first):",
        *ABORT_FRAMES,
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  {pg} Process group watchdog thread terminated with exception: {timeout}",
    ]


def dump_signal_lines(plan: Plan, rk: Rank) -> list[str]:
    """The OOM rank, still alive, receives the others' dump signal: its last enqueued work lags by one."""
    ts = plan.watchdog_time + timedelta(milliseconds=310)
    seq = seq_at_failure(plan)
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rk.rank}]"
    head = f"[rank{rk.rank}]:[E{glog(ts)} ProcessGroupNCCL.cpp"
    other = 0 if rk.rank else 1
    return [
        f"{head}:1849] {pg} Observed flight recorder dump signal from another rank via TCPStore.",
        f"{head}:1914] {pg} Received a dump signal due to a collective timeout from  rank {other} and we will try "
        f"our best to dump the debug info. Last enqueued NCCL work: {seq - 1}, last completed NCCL work: {seq - 1}."
        + DUMP_HINT,
        f"{head}:1628] {pg} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active "
        "collectives: 0",
    ]


# ---- files ----------------------------------------------------------------------------------------------------


def metric_level(key: str, step: int) -> tuple[float, float]:
    """(typical value, noise) of a metric at a step of a healthy GRPO run: calm curves, no spikes."""
    if key == "actor/entropy":
        return 0.9 * (0.55 + 0.45 * 0.98**step), 0.01
    if key in ("actor/pg_loss",):
        return 0.0, 0.004
    if key in ("actor/ppo_kl",):
        return 2e-5, 1e-5
    if key.startswith("actor/pg_clipfrac"):
        return 0.002, 0.0005
    if key == "actor/grad_norm":
        return 0.3, 0.03
    if key.endswith("clip_ratio"):
        return 0.005, 0.001
    if key.startswith("critic/score") or key.startswith("critic/rewards"):
        return 0.3 + 0.4 * (1 - 0.97**step), 0.02
    if key.startswith("critic/advantages"):
        return 0.0, 0.05
    if key.startswith("perf/max_memory"):
        return 61.0, 0.2
    if key == "perf/cpu_memory_used_gb":
        return 310.0, 2.0
    if key.startswith("timing_s/"):
        return 7.0, 0.3
    if key.startswith("timing_per_token_ms/"):
        return 0.05, 0.003
    if key in ("perf/throughput",):
        return 3200.0, 60.0
    if key == "perf/time_per_step":
        return 71.3, 1.5
    return 0.3, 0.01


def step_values(step: int, rng: random.Random, metrics: int = len(METRICS)) -> str:
    """One `step:N - key:value - ...` line as verl >= 2025-07 prints it: `pprint.pformat` of each value, at full
    precision; the actor's metrics come from numpy reductions and read `np.float64(...)` under numpy >= 2."""
    parts = [f"step:{step}"]
    for key in METRICS[:metrics]:
        if key == "training/global_step":
            value = str(step)
        elif key == "training/epoch":
            value = str(step // 120)
        elif key.endswith("/lr"):
            value = "3e-06" if key.startswith("actor") else "1e-05"
        elif "global_seqlen" in key or "length/m" in key or key == "perf/total_num_tokens":
            value = str(int(rng.gauss(400_000 if "seqlen" in key else 600, 20_000 if "seqlen" in key else 40)))
        elif key.startswith("perf/mfu/"):
            value = "0.0"
        else:
            level, noise = metric_level(key, step)
            value = repr(rng.gauss(level, noise))
            if key.startswith("actor/"):
                value = f"np.float64({value})"
        parts.append(f"{key}:{value}")
    return " - ".join(parts)


COLL_LINE_BYTES = 185  # a CollFlood line, without the digits of the world size
LOGGED_STEP_BYTES = 800  # the four lines a rank logs in a step (worker_log_lines) and one collective line


def logged_steps(plan: Plan, budget: int) -> list[int]:
    """The steps a rank's stream covers: every one when `budget` allows, else every k-th, and the failing one."""
    stride = max(1, -(-plan.fail_step * LOGGED_STEP_BYTES // max(1, budget)))
    return [*range(stride, plan.fail_step, stride), plan.fail_step]


def rank_flood_plan(plan: Plan, budget: int, steps: int) -> Quota:
    """Collective lines per logged step so that the rest of a rank's file (`budget` bytes) is filled."""
    per_line = COLL_LINE_BYTES + len(str(plan.world))
    return Quota(max(1, budget) / per_line / max(1, steps))


def write_rank_stream(plan: Plan, rk: Rank, out: BlockWriter, budget: int, rng: random.Random, prefix: str) -> None:
    """One rank's stream: NCCL init blocks, per-step logging and collective floods, then its failure."""
    init = [nccl_init_block(plan, rk, c, rng, c == 0) for c in range(len(plan.comms))]
    fixed = sum(len(line) + len(prefix) + 1 for block in init for line in block)
    steps = logged_steps(plan, budget - fixed)
    floods = rank_flood_plan(plan, budget - fixed - (LOGGED_STEP_BYTES - COLL_LINE_BYTES) * len(steps), len(steps))
    flood = CollFlood(plan, rk, rng)
    for line in init[0]:
        out.line(prefix + line)
    if rk.rank % 97 == 3:
        for line in harmless_traceback(rng):
            out.line(prefix + line)
    previous = 0
    for step in steps:
        ts = plan.step_start(step)
        for comm, created in ((1, 2), (2, plan.fail_step // 2)):
            if previous < created <= step:
                for line in init[comm]:
                    out.line(prefix + line)
        previous = step
        logs = worker_log_lines(rk, step, ts, rng)
        per_step = floods.take()
        for i in range(per_step):
            out.line(prefix + flood.line())
            if i < 3:
                out.line(prefix + logs[i + 1])
        for line in logs[1 + min(3, per_step) :]:
            out.line(prefix + line)
        if step < plan.fail_step:
            out.line(prefix + logs[0])
    # the failing step: the OOM rank raises, the others wait in the next all-reduce until the watchdog fires
    if rk.rank == plan.oom_rank:
        out.line(
            prefix + f"{iso(plan.oom_time - timedelta(seconds=1.3))} - verl.workers.fsdp_workers - INFO - "
            f"[rank {rk.rank}] step {plan.fail_step}: update_actor micro batch 3/8, "
            f"max_token_len {rng.choice([16384, 24576, 32768])}"
        )
        for line in oom_traceback(plan, rk):
            out.line(prefix + line)
        for line in dump_signal_lines(plan, rk):
            out.line(prefix + line)
    else:
        for line in watchdog_lines(plan, rk):
            out.line(prefix + line)


def write_torchrun_rank(plan: Plan, rk: Rank, root: Path, budget: int) -> int:
    rng = random.Random(f"{plan.seed}:torchrun:{rk.rank}")
    folder = root / "torchrun_logs" / plan.run_id / "attempt_0" / str(rk.rank)
    out = BlockWriter(folder / "stderr.log")
    out.line(
        f"[W{glog(START)} ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank {rk.rank}] using GPU {rk.dev} "
        "as device used by this process is currently unknown."
    )
    write_rank_stream(plan, rk, out, budget, rng, prefix="")
    out.close(plan.watchdog_time + timedelta(seconds=5))
    small = BlockWriter(folder / "stdout.log")
    for step in logged_steps(plan, budget)[:-1]:
        small.line(f"rank {rk.rank}: finished step {step}")
    small.close(plan.watchdog_time + timedelta(seconds=5))
    return out.size + small.size


def write_ray_worker(plan: Plan, rk: Rank, session: Path, budget: int) -> int:
    rng = random.Random(f"{plan.seed}:worker:{rk.rank}")
    stem = f"worker-{rk.worker_id}-01000000-{rk.pid}"
    out = BlockWriter(session / f"{stem}.out")
    out.line(":job_id:01000000")
    out.line(":actor_name:WorkerDict")
    write_rank_stream(plan, rk, out, budget, rng, prefix="")
    out.close(plan.watchdog_time + timedelta(seconds=6))
    err = BlockWriter(session / f"{stem}.err")
    err.line(":job_id:01000000")
    err.line(":actor_name:WorkerDict")
    err.line("Training Progress: 0it [00:00, ?it/s]")
    err.close(plan.watchdog_time + timedelta(seconds=6))
    core = BlockWriter(session / f"python-core-worker-{rk.worker_id}_{rk.pid}.log")
    size = max(4096, budget // 10)
    ts = START + timedelta(seconds=20)
    while core.size < size:
        ts += timedelta(milliseconds=rng.randint(50, 4000))
        tmpl = rng.choice(CORE_WORKER_INFO)
        core.line(
            f"[{iso(ts)} I {rk.pid} {rk.pid + rng.randint(1, 40)}] "
            + tmpl.format(
                n=rng.randint(100, 2000), tid=hexs(rng, 48), aid=hexs(rng, 32), oid=hexs(rng, 56), k=rng.randint(0, 9)
            )
        )
    core.close(plan.watchdog_time + timedelta(seconds=6))
    return out.size + err.size + core.size


def _raylet_values(rng: random.Random, nid: str, ip: str) -> dict:
    objs = rng.randint(0, 4000)
    q = rng.uniform(0.01, 3)
    return dict(
        n=rng.randint(100, 4000),
        wid=hexs(rng, 56),
        nid=nid,
        ip=ip,
        k=rng.randint(0, 64),
        objs=objs,
        size=objs * rng.randint(1 << 10, 1 << 24),
        chunks=rng.randint(0, 10**6),
        events=rng.randint(10**4, 10**7),
        q=q,
        qmax=q * rng.uniform(10, 500),
        qtot=q * rng.uniform(10**4, 10**6),
        x=q / 3,
        xtot=q * rng.uniform(10**3, 10**5),
        used=f"{rng.uniform(0, 200):.4f}",
        mib=rng.randint(1, 4096),
        thr=rng.randint(50, 2500),
    )


def write_raylet(plan: Plan, host_index: int, session: Path, budget: int, head: bool) -> int:
    """One node's raylet.out: startup, each worker started once, then periodic state and Plasma dumps."""
    rng = random.Random(f"{plan.seed}:raylet:{host_index}")
    rk = plan.ranks[host_index * GPUS_PER_NODE % plan.world]
    node_ranks = [r for r in plan.ranks if r.host == rk.host]
    raylet_pid = rng.randint(2000, 9000)
    nid = hexs(rng, 56)
    out = BlockWriter(session / "raylet.out")
    ts = START - timedelta(seconds=30)

    def line(text: str, level: str = "I", tid: int = 0) -> None:
        out.line(f"[{iso(ts)} {level} {raylet_pid} {raylet_pid + tid}] (raylet) {text}")

    line(f"main.cc:283: Setting cluster ID to: {hexs(rng, 56)}")
    line(f"main.cc:711: Setting node ID node_id={nid}")
    line("store_runner.cc:50: Allowing the Plasma store to use up to 214.748GB of memory.")
    line(f"node_manager.cc:293: Initializing NodeManager node_id={nid}")
    line(
        f"node_manager.cc:355: Raylet of id, {nid} started. Raylet consists of node_manager and object_manager. "
        f"node_manager address: {rk.ip}:0 object_manager address: {rk.ip}:{rng.randint(30000, 60000)} hostname: "
        f"{rk.host}"
    )
    for r in node_ranks:
        ts += timedelta(milliseconds=rng.randint(2, 40))
        line(f"worker_pool.cc:564: Started worker process with pid {r.pid} worker_id={r.worker_id}")
    end = plan.watchdog_time + timedelta(seconds=3)
    period = max(1.0, (end - ts).total_seconds() / max(1, budget // 9000))  # a dump block is ~2.7 KiB
    target = max(4096, budget)
    while out.size < target:
        ts = min(ts + timedelta(seconds=period * rng.uniform(0.2, 0.45)), end)
        values = _raylet_values(rng, nid, rk.ip)
        line("node_manager.cc:492: [state-dump] NodeManager:")
        for text in STATE_DUMP.format(**values).splitlines():
            out.line(text)
        for _ in range(rng.randint(0, 3)):
            tmpl = rng.choices(RAYLET_TEMPLATES, RAYLET_WEIGHTS)[0]
            line(tmpl.format(**_raylet_values(rng, nid, rk.ip)), tid=rng.randint(0, 60))
        ts = min(ts + timedelta(seconds=period * rng.uniform(0.2, 0.45)), end)
        line("store.cc:573: Plasma store debug dump: ", tid=10)
        for text in PLASMA_DUMP.format(**values).splitlines():
            out.line(text)
    out.line(
        f"[{iso(end)} W {raylet_pid} {raylet_pid}] (raylet) node_manager.cc:1431: A worker died or was killed "
        f"while executing a task by an unexpected system error. Worker PID: {rk.pid} Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    out.close(end)
    size = out.size
    if head:
        gcs = BlockWriter(session / "gcs_server.out")
        gts = START - timedelta(seconds=31)
        gcs.line(
            f"[{iso(gts)} I {raylet_pid - 1} {raylet_pid - 1}] (gcs_server) gcs_server_main.cc:98: Ray cluster "
            "metadata ray_version=2.43.0 ray_commit=ecdcdc6a6e63dcd9b2b9b5a2cb3b4b6e3a0d1f2e"
        )
        for r in plan.ranks:
            gts += timedelta(milliseconds=rng.randint(5, 60))
            gcs.line(
                f"[{iso(gts)} I {raylet_pid - 1} {raylet_pid - 1}] (gcs_server) gcs_actor_manager.cc:1012: "
                f"Actor created, actor id = {hexs(rng, 32)}, name = WorkerDict_0:{r.rank}, pid = {r.pid}, "
                f"ip = {r.ip}"
            )
        gcs.close(end)
        size += gcs.size
    return size


def write_driver(plan: Plan, root: Path, budget: int) -> int:
    """The tee'd driver output: every WorkerDict's stream re-printed with its Ray prefix, round robin."""
    rng = random.Random(f"{plan.seed}:driver")
    out = BlockWriter(root / "driver.log")
    tr = f"\x1b[36m(TaskRunner pid={plan.task_runner_pid})\x1b[0m "
    out.line(
        "ray init kwargs: {'num_cpus': None, 'runtime_env': {'env_vars': {'TOKENIZERS_PARALLELISM': 'true', "
        "'NCCL_DEBUG': 'INFO', 'NCCL_DEBUG_SUBSYS': 'INIT,COLL,TUNING', 'VLLM_LOGGING_LEVEL': 'WARN'}}}"
    )
    out.line(
        f"{iso(START)}\tINFO worker.py:1832 -- Connecting to existing Ray cluster at "
        f"address: {plan.ranks[0].ip}:6379..."
    )
    out.line(f"{tr}TaskRunner hostname: {plan.ranks[0].host}, PID: {plan.task_runner_pid}")
    config = ["{'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,"] + [
        f"                                 '{k}': {v},"
        for k, v in (
            ("ppo_micro_batch_size_per_gpu", 4),
            ("ppo_mini_batch_size", 256),
            ("ppo_max_token_len_per_gpu", 24576),
            ("use_dynamic_bsz", True),
            ("strategy", "'fsdp'"),
        )
    ]
    for line in config:
        out.line(tr + line)
    out.line(f"{tr}[validate_config] All configuration checks passed successfully!")
    out.line(f"{tr}Total training steps: {plan.fail_step + 200}")
    prefixes = [f"\x1b[36m(WorkerDict pid={r.pid}, ip={r.ip})\x1b[0m " for r in plan.ranks]
    sample = plan.ranks[:: max(1, plan.world // 64)]  # the driver shows every rank's init, a sample of the flood
    floods = {r.rank: CollFlood(plan, r, random.Random(f"{plan.seed}:dflood:{r.rank}")) for r in sample}
    fixed = 0
    for c in range(len(plan.comms)):
        for r in plan.ranks:
            fixed += sum(len(x) + 40 for x in nccl_init_block(plan, r, c, rng, c == 0))
    fixed += (len(tr) + len(step_values(1, rng, plan.metrics)) + 1) * plan.steps
    warnings = Quota(plan.size * WARNING_SHARE / 340 / plan.fail_step)
    outage = range(plan.fail_step * 3 // 10, plan.fail_step * 3 // 10 + max(1, plan.fail_step // 20))
    retries = Quota(plan.size * RETRY_SHARE / 420 / len(outage))
    flood_bytes = budget - fixed - plan.size * (WARNING_SHARE + RETRY_SHARE)
    per_step = max(1, int(flood_bytes) // 230 // plan.fail_step)
    for r in plan.ranks:
        for line in nccl_init_block(plan, r, 0, rng, True):
            out.line(prefixes[r.rank] + line)
    for step in range(1, plan.fail_step + 1):
        ts = plan.step_start(step)
        if step in (2, plan.fail_step // 2):
            for r in plan.ranks:
                for line in nccl_init_block(plan, r, 1 if step == 2 else 2, rng, False):
                    out.line(prefixes[r.rank] + line)
        for i in range(per_step):
            r = sample[i % len(sample)]
            if i % 5000 == 0:
                for line in worker_log_lines(r, step, ts, rng)[1:]:
                    out.line(prefixes[r.rank] + line)
            out.line(prefixes[r.rank] + floods[r.rank].line())
        for i in range(warnings.take()):
            w = plan.ranks[(step * 7 + i) % plan.world]
            out.line(prefixes[w.rank] + device_unknown_warning(w, ts + timedelta(seconds=i * 0.01)))
        if step in outage:
            for i in range(retries.take()):
                out.line(tr + reward_retry_line(ts + timedelta(seconds=i * 0.5), rng))
        if step < plan.fail_step:
            for line in worker_log_lines(r, step, ts + timedelta(seconds=60), rng)[:1]:
                out.line(prefixes[r.rank] + line)
            out.line(tr + step_values(step, rng, plan.metrics))
            out.line(
                f"{tr}Training Progress: {step}/{plan.fail_step + 200} [{step * 71 // 60:02d}:{step * 71 % 60:02d}"
                f"<4:01:31, 71.30s/it]"
            )
    oom = plan.ranks[plan.oom_rank]
    out.line(
        prefixes[oom.rank] + f"{iso(plan.oom_time - timedelta(seconds=1.3))} - verl.workers.fsdp_workers - INFO - "
        f"[rank {oom.rank}] step {plan.fail_step}: update_actor micro batch 3/8"
    )
    for line in oom_traceback(plan, oom):
        out.line(prefixes[oom.rank] + line)
    shown = [r for r in plan.ranks if r.rank != plan.oom_rank][:16]
    for r in shown:
        for line in watchdog_lines(plan, r)[:2]:
            out.line(prefixes[r.rank] + line)
    last = plan.ranks[-1] if plan.ranks[-1].rank != plan.oom_rank else plan.ranks[-2]
    repeated = next(x for x in watchdog_lines(plan, last) if "Some NCCL operations" in x).split(" Due to")[0]
    out.line(f"{prefixes[last.rank]}{repeated} [repeated {plan.world - 18}x across cluster]")
    out.line("Error executing job with overrides: ['trainer.nnodes=64', 'trainer.n_gpus_per_node=8']")
    out.line("Traceback (most recent call last):")
    out.line('  File "/opt/verl/verl/trainer/main_ppo.py", line 96, in run_ppo')
    out.line("    ray.get(runner.run.remote(config))")
    out.line(
        f"ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid={plan.task_runner_pid}, "
        f"ip={plan.ranks[0].ip}, actor_id={hexs(rng, 32)}, repr=<main_ppo.TaskRunner object at 0x7f58a88cdcc0>)"
    )
    out.line("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.")
    out.close(plan.watchdog_time + timedelta(seconds=8))
    return out.size


def device_unknown_warning(rk: Rank, ts: datetime) -> str:
    """ProcessGroupNCCL's warning at each barrier() of a process group created without device_id (torch 2.4+)."""
    return (
        f"[rank{rk.rank}]:[W{glog(ts)} ProcessGroupNCCL.cpp:5068] [PG ID 0 PG GUID 0(default_pg) Rank {rk.rank}]  "
        f"using GPU {rk.dev} as device used by this process is currently unknown. This can potentially cause a hang "
        "if this rank to GPU mapping is incorrect. You can specify device_id in init_process_group() to force use "
        "of a particular device."
    )


def reward_retry_line(ts: datetime, rng: random.Random) -> str:
    """A reward function's request to a sandbox server that is down, logged at each retry."""
    return (
        f"{iso(ts)} - verl.utils.reward_score.sandbox_fusion - WARNING - sandbox request failed, retrying: "
        "requests.exceptions.ConnectionError: HTTPConnectionPool(host='10.20.1.7', port=8080): Max retries exceeded "
        "with url: /run_code (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at "
        f"0x7f{rng.getrandbits(40):010x}>: Failed to establish a new connection: [Errno 111] Connection refused'))"
    )


def pylog(ts: datetime) -> str:
    """torchelastic's logging prefix: `W1130 05:18:53.321000`."""
    return f"{ts.month}{ts.day:02d} {ts.strftime('%H:%M:%S')}.{ts.microsecond:06d}"


def write_launcher(plan: Plan, root: Path) -> int:
    """The torchrun agent of the node whose rank exited first, ending in its ChildFailedError summary."""
    first = plan.ranks[plan.first_exit_rank]
    node = [r for r in plan.ranks if r.host == first.host]
    agent = first.pid - 45
    api = "torch/distributed/elastic/multiprocessing/api.py"
    out = BlockWriter(root / "launcher.log")
    t_exit = plan.watchdog_time + timedelta(seconds=61.4)
    out.line(f"W{pylog(START)} {agent} torch/distributed/run.py:851] ")
    out.line(f"W{pylog(START)} {agent} torch/distributed/run.py:851] *****************************************")
    out.line(
        f"W{pylog(START)} {agent} torch/distributed/run.py:851] Setting OMP_NUM_THREADS environment variable for "
        "each process to be 1 in default, to avoid your system being overloaded, please further tune the variable "
        "for optimal performance in your application as needed. "
    )
    out.line(f"W{pylog(START)} {agent} torch/distributed/run.py:851] *****************************************")
    for r in node:
        if r is not first:
            out.line(f"W{pylog(t_exit)} {agent} {api}:1012] Sending process {r.pid} closing signal SIGTERM")
    out.line(
        f"E{pylog(t_exit + timedelta(seconds=0.3))} {agent} {api}:986] failed (exitcode: -6) local_rank: {first.dev} "
        f"(pid: {first.pid}) of binary: /opt/torch/.venv/bin/python"
    )
    out.line("Traceback (most recent call last):")
    out.line('  File "/opt/torch/.venv/bin/torchrun", line 10, in <module>')
    out.line("    sys.exit(main())")
    out.line("             ^^^^^^")
    out.line(
        '  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 317, '
        "in launch_agent"
    )
    out.line("    raise ChildFailedError(")
    out.line("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    out.line("=" * 53)
    out.line("verl/trainer/main_ppo.py FAILED")
    out.line("-" * 53)
    out.line("Failures:")
    others = [r for r in node if r is not first][:3]
    for i, r in enumerate(others, start=1):
        out.line(f"[{i}]:")
        out.line(f"  time      : {iso(t_exit, '_').split(',')[0]}")
        out.line(f"  host      : {r.host}")
        out.line(f"  rank      : {r.rank} (local_rank: {r.dev})")
        out.line(f"  exitcode  : -15 (pid: {r.pid})")
        out.line("  error_file: <N/A>")
        out.line(f"  traceback : Signal 15 (SIGTERM) received by PID {r.pid}")
    out.line("-" * 53)
    out.line("Root Cause (first observed failure):")
    out.line("[0]:")
    out.line(f"  time      : {iso(t_exit, '_').split(',')[0]}")
    out.line(f"  host      : {first.host}")
    out.line(f"  rank      : {first.rank} (local_rank: {first.dev})")
    out.line(f"  exitcode  : -6 (pid: {first.pid})")
    out.line("  error_file: <N/A>")
    out.line(f"  traceback : Signal 6 (SIGABRT) received by PID {first.pid}")
    out.line("=" * 53)
    out.close(t_exit + timedelta(seconds=2))
    return out.size


def _session_dir(root: Path, plan: Plan, host: str) -> Path:
    return root / "ray" / host / "session_2025-10-16_01-10-33_512846_3120" / "logs"


def _job(args: tuple) -> int:
    kind, plan, root, budget, extra = args
    if kind == "driver":
        return write_driver(plan, root, budget)
    if kind == "torchrun":
        return write_torchrun_rank(plan, plan.ranks[extra], root, budget)
    if kind == "worker":
        rk = plan.ranks[extra]
        return write_ray_worker(plan, rk, _session_dir(root, plan, rk.host), budget)
    if kind == "raylet":
        host = plan.ranks[extra * GPUS_PER_NODE % plan.world].host
        return write_raylet(plan, extra, _session_dir(root, plan, host), budget, extra == 0)
    if kind == "launcher":
        return write_launcher(plan, root)
    raise ValueError(kind)


def generate(size: int, out: Path, seed: int, world: int, jobs: int, steps: int = STEPS, metrics: int = 150) -> dict:
    plan = make_plan(size, seed, world, steps, metrics)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    nodes = max(1, world // GPUS_PER_NODE)
    rest = 1 - SHARE_DRIVER - SHARE_TORCHRUN - SHARE_WORKER_OUT
    work = [("driver", plan, out, int(size * SHARE_DRIVER), None), ("launcher", plan, out, 0, None)]
    work += [("torchrun", plan, out, int(size * SHARE_TORCHRUN / world), r) for r in range(world)]
    work += [("worker", plan, out, int(size * SHARE_WORKER_OUT / world), r) for r in range(world)]
    work += [
        ("raylet", plan, out, int(size * rest / nodes) - int(size * SHARE_WORKER_OUT / world / 10) * 8, n)
        for n in range(nodes)
    ]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        written = sum(pool.map(_job, work, chunksize=4))
    oom = plan.ranks[plan.oom_rank]
    truth = {
        "generator": "bench/make_run.py",
        "seed": seed,
        "size_requested": size,
        "bytes": written,
        "ranks": world,
        "steps": plan.steps,
        "metrics_per_step": plan.metrics,
        "root_cause": {
            "class": "cuda_oom",
            "rank": plan.oom_rank,
            "host": oom.host,
            "pid": oom.pid,
            "step": plan.fail_step,
            "ts": plan.oom_time.isoformat(),
        },
        "torchrun_root_cause_rank": plan.first_exit_rank,
    }
    Path(f"{out}.truth.json").write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("size", type=parse_size, help="total size, e.g. 512M, 1G, 2G, 4G")
    parser.add_argument("out", type=Path, help="the run folder to create (outside the repository)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=512, help="world size (8 GPUs per node)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing files")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps before the failing one")
    parser.add_argument("--metrics", type=int, default=len(METRICS), help="keys per step line, at most 150")
    args = parser.parse_args(argv)
    if not 1 <= args.metrics <= len(METRICS) or args.steps < 2:
        parser.error(f"--metrics must be from 1 to {len(METRICS)}, --steps at least 2")
    if args.ranks < 2 or (args.ranks % GPUS_PER_NODE and args.ranks > GPUS_PER_NODE):
        parser.error("--ranks must be at least 2, and a multiple of 8 above 8")
    here = Path(__file__).resolve().parents[1]
    if args.out.resolve().is_relative_to(here):
        parser.error(f"{args.out} is inside the repository; write generated runs elsewhere (e.g. /tmp/bench_runs)")
    free = shutil.disk_usage(args.out.resolve().parent if args.out.resolve().parent.exists() else "/").free
    if free < args.size * 1.2:
        parser.error(f"only {free / 2**30:.1f} GiB free where {args.out} would go; {args.size / 2**30:.1f} GiB needed")
    truth = generate(args.size, args.out, args.seed, args.ranks, args.jobs, args.steps, args.metrics)
    print(json.dumps(truth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
