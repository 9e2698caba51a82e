#!/usr/bin/env python3
"""Capture REAL Ray session logs from small verl-shaped jobs with injected faults.

    python scripts/capture/ray/capture.py [scenario ...] [--out ~/forensics-captures/ray]

Needs: ray[default] (captured with 2.60.0), psutil, hydra-core, tqdm; e.g. a venv:
    python -m venv /root/venvs/ray-capture
    /root/venvs/ray-capture/bin/pip install "ray[default]==2.60.0" psutil hydra-core tqdm

Scenarios (default: all, in this order):
  ray_healthy          20 steps, exit 0
  ray_worker_sigkill   WorkerDict rank 1 SIGKILLs itself inside update_actor at step 6
  ray_memory_monitor   WorkerDict rank 1 grows its memory at step 4 until Ray's memory
                       monitor kills it (threshold computed from psutil, allocation capped)
  ray_config_error     verl's validate_config assertion in the TaskRunner
  ray_node_died        two `ray start` nodes on this machine; the second node's raylet
                       is SIGKILLed (by PID) after step 5
  ray_node_hang        same two nodes; after step 5 every process of the second node is
                       SIGSTOPped (a node that hangs / drops off the network)
  ray_hang_interrupt   WorkerDict rank 1 blocks forever in update_actor at step 6; after
                       --hang-s seconds (default 600) without progress the driver's process
                       group gets SIGINT, as Ctrl-C in its terminal sends (KeyboardInterrupt)
  ray_worker_import_error   every WorkerDict imports the rollout backend (vllm), which is not
                       installed: RayTaskError(ModuleNotFoundError) in init_model
  ray_worker_config_error   the WorkerDicts' batch-size normalisation assertion (verl's
                       fsdp_workers): ppo_micro_batch_size_per_gpu=3 does not divide 2
  ray_task_retried     the reward task of step 3 fails twice (retry_exceptions) and succeeds
                       on its third attempt; the run finishes, exit 0
  ray_unschedulable    the WorkerDicts ask for a GPU on a CPU-only cluster: the placement group
                       never becomes ready; the user interrupts (SIGINT) after 10 minutes
  ray_auth_token       `ray start --head` with token auth; a second node and then the driver
                       use another token (a stale RAY_AUTH_TOKEN): both are refused

For each scenario, under <out>/<scenario>/:
  driver.log                         stdout+stderr of the driver (python main_ppo.py ...)
  ray_session/session_<...>/logs/    copy of the Ray session's logs/ (single-node scenarios)
  ray_session_node1/..., ray_session_node2/...   (ray_node_died/_hang: one copy per node temp dir)
  ray_start_head.log, ray_start_node2.log        (ray_node_died/_hang: output of `ray start`)
  outputs/<date>/<time>/             Hydra's run dir (as verl leaves it in its cwd)
  capture_meta.json                  what was run, env overrides, exit code, timings

Every Ray process started here carries FORENSICS_CAPTURE_TAG=<scenario> in its
environment; cleanup kills only processes with that tag (never `ray stop`, never by name).
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.join(HERE, "main_ppo.py")
RAY_BIN = os.path.join(os.path.dirname(sys.executable), "ray")  # the ray CLI of this interpreter
TMP_ROOT = "/tmp/rc"  # short: unix socket paths live under the session dir

SCENARIOS = [
    "ray_healthy",
    "ray_worker_sigkill",
    "ray_memory_monitor",
    "ray_config_error",
    "ray_node_died",
    "ray_node_hang",
    "ray_hang_interrupt",
    "ray_worker_import_error",
    "ray_worker_config_error",
    "ray_task_retried",
    "ray_unschedulable",
    "ray_auth_token",
]
SHORT = {
    "ray_healthy": "h",
    "ray_worker_sigkill": "sk",
    "ray_memory_monitor": "oom",
    "ray_config_error": "cfg",
    "ray_node_died": "n",
    "ray_node_hang": "n",
    "ray_hang_interrupt": "hi",
    "ray_worker_import_error": "imp",
    "ray_worker_config_error": "wcfg",
    "ray_task_retried": "rt",
    "ray_unschedulable": "us",
    "ray_auth_token": "at",
}
HANG_S = 600
TWO_NODES = {"n": ("n", "n2"), "at": ("at", "at2")}  # the temp dirs of the scenarios that start two nodes
GIB = 1024**3


def log(msg):
    print(f"[capture {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- process hygiene
def tagged_procs(tag, temp_dirs=()):
    """Processes started by us for scenario <tag>: FORENSICS_CAPTURE_TAG=<tag> in the environment,
    or (Ray's setproctitle can blank /proc/PID/environ and cmdline) a command line or an open file
    under one of this scenario's Ray temp dirs."""
    needle = f"FORENSICS_CAPTURE_TAG={tag}".encode()
    dirs = tuple(d.rstrip("/") + "/" for d in temp_dirs)
    me = os.getpid()
    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if needle in env:
                out.append(p)
                continue
            if dirs:
                cmd = " ".join(p.cmdline())
                if any(d in cmd for d in dirs) or any(f.path.startswith(dirs) for f in p.open_files()):
                    out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def kill_tagged(tag, temp_dirs=(), grace=10.0):
    procs = tagged_procs(tag, temp_dirs)
    if not procs:
        return []
    desc = []
    for p in procs:
        try:
            desc.append(f"{p.pid}:{p.name()}")
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return desc


# ---------------------------------------------------------------- log copying
def copy_session_logs(temp_dir, dest_root):
    """Copy <temp_dir>/session_latest (resolved)/logs -> <dest_root>/session_<...>/logs."""
    latest = os.path.join(temp_dir, "session_latest")
    if not os.path.exists(latest):
        sessions = (
            sorted(d for d in os.listdir(temp_dir) if d.startswith("session_2")) if os.path.isdir(temp_dir) else []
        )
        if not sessions:
            return None
        session = os.path.join(temp_dir, sessions[-1])
    else:
        session = os.path.realpath(latest)
    src = os.path.join(session, "logs")
    dst = os.path.join(dest_root, os.path.basename(session), "logs")
    # symlinks=True: keep links as links; ignore sockets/fifos that cannot be copied
    shutil.copytree(src, dst, symlinks=True, ignore_dangling_symlinks=True, dirs_exist_ok=True)
    return os.path.relpath(dst, os.path.dirname(dest_root))


def wait_for_line(path, needle, proc, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return False
        try:
            with open(path, errors="replace") as f:
                if needle in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    return False


def base_env(tag):
    env = dict(os.environ)
    env["FORENSICS_CAPTURE_TAG"] = tag
    env.pop("RAY_ADDRESS", None)
    env.pop("FORENSICS_FAULT", None)
    return env


def driver_cmd(overrides):
    return [sys.executable, MAIN, *overrides]


# ---------------------------------------------------------------- scenarios
def run_single_node(
    scenario, outdir, meta, steps=20, fault=None, extra_env=None, extra_overrides=(), timeout=300, interrupt_after=None
):
    """One local cluster started by the driver's ray.init; `interrupt_after` seconds: SIGINT the driver then
    (a user pressing Ctrl-C on a job that makes no progress), else kill it at `timeout`."""
    temp_dir = os.path.join(TMP_ROOT, SHORT[scenario])
    shutil.rmtree(temp_dir, ignore_errors=True)
    env = base_env(scenario)
    env_over = {}
    if fault:
        env_over["FORENSICS_FAULT"] = fault
    env_over.update(extra_env or {})
    env.update(env_over)
    overrides = [
        f"trainer.total_training_steps={steps}",
        "ray_kwargs.ray_init.num_cpus=2",
        "+ray_kwargs.ray_init.address=local",
        f"+ray_kwargs.ray_init._temp_dir={temp_dir}",
        *extra_overrides,
    ]
    cmd = driver_cmd(overrides)
    meta.update(cmd=cmd, env_overrides=env_over, temp_dir=temp_dir)
    log(f"{scenario}: {' '.join(cmd[1:])}  env={env_over}")
    t0 = time.time()
    with open(os.path.join(outdir, "driver.log"), "wb") as f:
        # a shell's background job ignores SIGINT, and its children inherit that: give the driver Ctrl-C back
        sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if interrupt_after is not None else None
        proc = subprocess.Popen(cmd, cwd=outdir, env=env, stdout=f, stderr=subprocess.STDOUT, preexec_fn=sigint)
        if interrupt_after is not None:
            try:
                proc.wait(timeout=interrupt_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                meta["interrupted_after_s"] = interrupt_after
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
    meta["driver_exit_code"] = rc
    meta["driver_wall_s"] = round(time.time() - t0, 1)
    time.sleep(1)
    meta["leftover_killed"] = kill_tagged(scenario, [temp_dir])
    meta["session_logs"] = copy_session_logs(temp_dir, os.path.join(outdir, "ray_session"))
    return rc


def scenario_hang_interrupt(scenario, outdir, meta, hang_step=6):
    """A worker deadlocks at `hang_step`; after HANG_S seconds the user presses Ctrl-C in the driver's terminal."""
    temp_dir = os.path.join(TMP_ROOT, SHORT[scenario])
    shutil.rmtree(temp_dir, ignore_errors=True)
    env = base_env(scenario)
    env_over = {"FORENSICS_FAULT": f"hang@{hang_step}:1"}
    env.update(env_over)
    overrides = [
        "trainer.total_training_steps=20",
        "ray_kwargs.ray_init.num_cpus=2",
        "+ray_kwargs.ray_init.address=local",
        f"+ray_kwargs.ray_init._temp_dir={temp_dir}",
    ]
    cmd = driver_cmd(overrides)
    meta.update(cmd=cmd, env_overrides=env_over, temp_dir=temp_dir, hang_s=HANG_S)
    log(f"{scenario}: {' '.join(cmd[1:])}  env={env_over}")
    t0 = time.time()
    dlog = os.path.join(outdir, "driver.log")
    with open(dlog, "wb") as f:
        # its own process group, as a shell gives a foreground job: Ctrl-C signals the whole group. SIGINT is
        # set back to its default: a capture started in the background (`nohup ... &`) inherits it ignored,
        # and Python then never raises KeyboardInterrupt.
        proc = subprocess.Popen(
            cmd,
            cwd=outdir,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        if wait_for_line(dlog, f"step:{hang_step - 1} - ", proc, timeout=240):
            time.sleep(HANG_S)
            meta["interrupted_at_s"] = round(time.time() - t0, 1)
            log(f"{scenario}: SIGINT to the driver's process group {proc.pid}")
            os.killpg(proc.pid, signal.SIGINT)
        else:
            meta["trigger"] = "step line not seen"
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
    meta["driver_exit_code"] = rc
    meta["driver_wall_s"] = round(time.time() - t0, 1)
    time.sleep(1)
    meta["leftover_killed"] = kill_tagged(scenario, [temp_dir])
    meta["session_logs"] = copy_session_logs(temp_dir, os.path.join(outdir, "ray_session"))
    return rc


def scenario_memory_monitor(scenario, outdir, meta):
    # Ray's ThresholdMemoryMonitor compares (total - MemAvailable) against threshold*total.
    vm = psutil.virtual_memory()
    used = vm.total - vm.available
    ray_overhead = 1.5 * GIB  # rough upper estimate of what a fresh local cluster + 3 actors adds
    headroom = 1.5 * GIB  # the worker must grow about this much beyond the cluster's baseline
    threshold = round((used + ray_overhead + headroom) / vm.total, 3)
    cap_mb = 4096
    # safety: never let the machine go near its total; the worker also stops if available < 8 GiB
    assert used + ray_overhead + cap_mb * 1024**2 < 0.6 * vm.total, "machine too busy for the OOM scenario"
    assert threshold < 0.5, threshold
    meta["memory_before"] = {"total": vm.total, "available": vm.available, "used_total_minus_available": used}
    extra_env = {
        "RAY_memory_usage_threshold": str(threshold),
        "RAY_memory_monitor_refresh_ms": "100",
        # the raylet prints its "N Workers (tasks / actors) killed due to memory pressure (OOM)" summary
        # every event_stats_print_interval_ms (default 60 s); Ray's OOM docs use 1000 to show it
        "RAY_event_stats_print_interval_ms": "1000",
        "FORENSICS_OOM_CAP_MB": str(cap_mb),
        "FORENSICS_OOM_MIN_AVAIL_MB": "8192",
    }
    return run_single_node(scenario, outdir, meta, steps=20, fault="oom@4:1", extra_env=extra_env)


def node2_processes(scenario):
    """The second node's processes: its raylet, the raylet's descendants (workers, agents)
    and its log monitor; all carry our tag."""
    tagged = tagged_procs(scenario)
    raylets = [p for p in tagged if p.name() == "raylet" and "127.0.0.2" in " ".join(p.cmdline())]
    assert len(raylets) == 1, raylets
    procs = {raylets[0].pid: raylets[0]}
    for c in raylets[0].children(recursive=True):
        procs[c.pid] = c
    for p in tagged:
        try:
            if "/tmp/rc/n2" in " ".join(p.cmdline()):
                procs[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    return raylets[0], list(procs.values())


def gcs_out_path(head_tmp):
    return os.path.join(os.path.realpath(os.path.join(head_tmp, "session_latest")), "logs", "gcs_server.out")


def scenario_node_died(scenario, outdir, meta, mode="kill", trigger_step=5):
    """mode="kill": SIGKILL the second node's raylet (only that PID).
    mode="freeze": SIGSTOP every process of the second node (raylet, its workers and agents), i.e. a
    node that hangs / drops off the network; the processes are SIGKILLed at cleanup."""
    head_tmp = os.path.join(TMP_ROOT, "n")
    node2_tmp = os.path.join(TMP_ROOT, "n2")
    for d in (head_tmp, node2_tmp):
        shutil.rmtree(d, ignore_errors=True)
    port = free_port()
    env = base_env(scenario)
    # Ray 2.60 `ray start --head` turns token auth on (token in ~/.ray/auth_token); the joining node
    # and the driver must then be told to use it, or the join fails with InvalidAuthToken.
    env_over = {"FORENSICS_WORKER_NODE_RESOURCE": "node2", "RAY_AUTH_MODE": "token"}
    env.update(env_over)
    head_cmd = [RAY_BIN, "start", "--head", "--temp-dir", head_tmp, "--num-cpus", "1", "--port", str(port)]
    node2_cmd = [
        RAY_BIN,
        "start",
        "--address",
        f"127.0.0.1:{port}",
        "--num-cpus",
        "2",
        "--resources",
        json.dumps({"node2": 2}),
        "--node-ip-address",
        "127.0.0.2",
        "--temp-dir",
        node2_tmp,
    ]
    meta.update(mode=mode, head_cmd=head_cmd, node2_cmd=node2_cmd, env_overrides=env_over)
    rc = None
    frozen = []
    try:
        log(f"{scenario}: {' '.join(head_cmd)}")
        with open(os.path.join(outdir, "ray_start_head.log"), "wb") as f:
            r = subprocess.run(head_cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=120)
        meta["ray_start_head_rc"] = r.returncode
        if r.returncode != 0:
            return "ray start --head failed"
        log(f"{scenario}: {' '.join(node2_cmd)}")
        with open(os.path.join(outdir, "ray_start_node2.log"), "wb") as f:
            r = subprocess.run(node2_cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=120)
        meta["ray_start_node2_rc"] = r.returncode
        if r.returncode != 0:
            return "ray start (node2) failed"

        overrides = ["trainer.total_training_steps=20", f"+ray_kwargs.ray_init.address=127.0.0.1:{port}"]
        cmd = driver_cmd(overrides)
        meta["cmd"] = cmd
        log(f"{scenario}: {' '.join(cmd[1:])}")
        t0 = time.time()
        dlog = os.path.join(outdir, "driver.log")
        with open(dlog, "wb") as f:
            proc = subprocess.Popen(cmd, cwd=outdir, env=env, stdout=f, stderr=subprocess.STDOUT)
            if wait_for_line(dlog, f"step:{trigger_step} - ", proc, timeout=240):
                raylet, procs = node2_processes(scenario)
                if mode == "kill":
                    raylet.send_signal(signal.SIGKILL)
                    meta["killed"] = [{"pid": raylet.pid, "name": raylet.name(), "signal": "SIGKILL"}]
                    log(f"{scenario}: SIGKILL raylet pid {raylet.pid} of node2")
                else:
                    for p in procs:
                        p.send_signal(signal.SIGSTOP)
                    frozen = procs
                    meta["frozen"] = [{"pid": p.pid, "name": p.name(), "signal": "SIGSTOP"} for p in procs]
                    log(f"{scenario}: SIGSTOP node2 pids {[p.pid for p in procs]}")
                meta["fault_at_s"] = round(time.time() - t0, 1)
            else:
                meta["trigger"] = "step line not seen"
            try:
                rc = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
        meta["driver_exit_code"] = rc
        meta["driver_wall_s"] = round(time.time() - t0, 1)
        # the cluster outlives the driver (as with a real `ray start` cluster): wait until the GCS
        # has declared node2 dead, so gcs_server.out holds the node-death record
        gcs_out = gcs_out_path(head_tmp)
        t1 = time.time()
        while time.time() - t1 < 120:
            with open(gcs_out, errors="replace") as g:
                if "missing too many heartbeats" in g.read():
                    break
            time.sleep(1)
        meta["gcs_node_death_seen_after_driver_exit_s"] = round(time.time() - t1, 1)
        time.sleep(3)
    finally:
        for p in frozen:  # stopped processes cannot act on SIGTERM
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        meta["leftover_killed"] = kill_tagged(scenario, [head_tmp, node2_tmp], grace=15)
        meta["session_logs_node1"] = copy_session_logs(head_tmp, os.path.join(outdir, "ray_session_node1"))
        meta["session_logs_node2"] = copy_session_logs(node2_tmp, os.path.join(outdir, "ray_session_node2"))
    return rc


def scenario_auth_token(scenario, outdir, meta):
    """A token-auth cluster (`ray start --head`, RAY_AUTH_TOKEN), joined by a node and a driver whose
    environment holds another token. Tokens go through RAY_AUTH_TOKEN only (~/.ray is left alone)."""
    head_tmp, node2_tmp = (os.path.join(TMP_ROOT, d) for d in TWO_NODES["at"])
    for d in (head_tmp, node2_tmp):
        shutil.rmtree(d, ignore_errors=True)
    port = free_port()
    head_env = base_env(scenario)
    head_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.urandom(16).hex())
    stale_env = base_env(scenario)
    stale_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=os.urandom(16).hex())
    head_cmd = [RAY_BIN, "start", "--head", "--temp-dir", head_tmp, "--num-cpus", "2", "--port", str(port)]
    node2_cmd = [
        RAY_BIN,
        "start",
        "--address",
        f"127.0.0.1:{port}",
        "--num-cpus",
        "1",
        "--node-ip-address",
        "127.0.0.2",
        "--temp-dir",
        node2_tmp,
    ]
    meta.update(head_cmd=head_cmd, node2_cmd=node2_cmd, env_overrides={"RAY_AUTH_MODE": "token"})
    try:
        with open(os.path.join(outdir, "ray_start_head.log"), "wb") as f:
            r = subprocess.run(head_cmd, env=head_env, stdout=f, stderr=subprocess.STDOUT, timeout=120)
        meta["ray_start_head_rc"] = r.returncode
        if r.returncode != 0:
            return "ray start --head failed"
        with open(os.path.join(outdir, "ray_start_node2.log"), "wb") as f:
            try:
                r = subprocess.run(node2_cmd, env=stale_env, stdout=f, stderr=subprocess.STDOUT, timeout=180)
                meta["ray_start_node2_rc"] = r.returncode
            except subprocess.TimeoutExpired:
                meta["ray_start_node2_rc"] = "timeout"
        cmd = driver_cmd(["trainer.total_training_steps=20", f"+ray_kwargs.ray_init.address=127.0.0.1:{port}"])
        meta["cmd"] = cmd
        t0 = time.time()
        with open(os.path.join(outdir, "driver.log"), "wb") as f:
            proc = subprocess.Popen(cmd, cwd=outdir, env=stale_env, stdout=f, stderr=subprocess.STDOUT)
            try:
                rc = proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
        meta["driver_exit_code"] = rc
        meta["driver_wall_s"] = round(time.time() - t0, 1)
        time.sleep(3)
    finally:
        meta["leftover_killed"] = kill_tagged(scenario, [head_tmp, node2_tmp], grace=15)
        meta["session_logs_node1"] = copy_session_logs(head_tmp, os.path.join(outdir, "ray_session_node1"))
        meta["session_logs_node2"] = copy_session_logs(node2_tmp, os.path.join(outdir, "ray_session_node2"))
    return rc


def run_scenario(scenario, out_root):
    import ray

    outdir = os.path.join(out_root, scenario)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    meta = {
        "scenario": scenario,
        "ray_version": ray.__version__,
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hostname": socket.gethostname(),
    }
    try:
        if scenario == "ray_healthy":
            run_single_node(scenario, outdir, meta, steps=20)
        elif scenario == "ray_worker_sigkill":
            run_single_node(scenario, outdir, meta, steps=20, fault="sigkill@6:1")
        elif scenario == "ray_memory_monitor":
            scenario_memory_monitor(scenario, outdir, meta)
        elif scenario == "ray_config_error":
            # verl validate_config: real_train_batch_size (6) must be divisible by minimal possible batch size (4)
            run_single_node(
                scenario,
                outdir,
                meta,
                steps=20,
                extra_overrides=["data.train_batch_size=6", "trainer.n_gpus_per_node=4"],
            )
        elif scenario == "ray_node_died":
            scenario_node_died(scenario, outdir, meta, mode="kill")
        elif scenario == "ray_node_hang":
            scenario_node_died(scenario, outdir, meta, mode="freeze")
        elif scenario == "ray_hang_interrupt":
            scenario_hang_interrupt(scenario, outdir, meta)
        elif scenario == "ray_worker_import_error":
            run_single_node(scenario, outdir, meta, steps=20, fault="import@0")
        elif scenario == "ray_worker_config_error":
            # verl's worker normalisation: ppo_mini_batch_size 4 * n 1 // 2 workers = 2, not divisible by 3
            overrides = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"]
            run_single_node(scenario, outdir, meta, steps=20, extra_overrides=overrides)
        elif scenario == "ray_task_retried":
            run_single_node(scenario, outdir, meta, steps=8, fault="flaky@3")
        elif scenario == "ray_unschedulable":
            overrides = ["+trainer.worker_gpus=1"]
            run_single_node(scenario, outdir, meta, extra_overrides=overrides, timeout=60, interrupt_after=600)
        elif scenario == "ray_auth_token":
            scenario_auth_token(scenario, outdir, meta)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    finally:
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        dirs = [os.path.join(TMP_ROOT, d) for d in TWO_NODES.get(SHORT[scenario], (SHORT[scenario],))]
        meta["still_running_after_cleanup"] = [p.pid for p in tagged_procs(scenario, dirs)]
        with open(os.path.join(outdir, "capture_meta.json"), "w") as f:
            json.dump(meta, f, indent=1, default=str)
        log(f"{scenario}: exit={meta.get('driver_exit_code')} leftovers={meta['leftover_killed']}")


def main():
    global HANG_S
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="*", default=SCENARIOS)
    ap.add_argument("--out", default=os.path.expanduser("~/forensics-captures/ray"))
    ap.add_argument("--hang-s", type=float, default=HANG_S, help="ray_hang_interrupt: seconds before Ctrl-C")
    args = ap.parse_args()
    HANG_S = args.hang_s
    os.makedirs(TMP_ROOT, exist_ok=True)
    for s in args.scenarios:
        run_scenario(s, args.out)


if __name__ == "__main__":
    main()
