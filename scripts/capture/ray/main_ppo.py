"""A small job shaped like verl's PPO/GRPO trainer, used to capture REAL Ray logs.

Run by capture.py (one process per scenario); its stdout+stderr become driver.log.
It imitates the control flow and the console output of verl (verl/trainer/main_ppo.py,
verl/trainer/ppo/ray_trainer.py, verl/single_controller/ray/base.py) on CPU only:
  driver (Hydra main) -> ray.init -> TaskRunner actor (num_cpus=0.1)
  -> placement group + N WorkerDict actors named "<6 random chars>WorkerDict_0:<rank>"
  -> per step: generate_sequences / compute_log_prob / update_actor via ray.get
  -> verl's console logger line "step:N - key:value - ..." (pprint.pformat values).
No model is loaded; metric values are made up (seeded random numbers), except
perf/cpu_memory_used_gb (real psutil value) and the timings (real wall time).

Faults are injected from the environment variable FORENSICS_FAULT, which Ray
workers inherit from the raylet (it is set before the cluster starts):
  sigkill@<step>[:rank]   WorkerDict <rank> SIGKILLs itself inside update_actor
  oom@<step>[:rank]       WorkerDict <rank> allocates memory inside update_actor
                          (256 MiB chunks, capped by FORENSICS_OOM_CAP_MB, and it
                          stops early if available memory drops below
                          FORENSICS_OOM_MIN_AVAIL_MB) until Ray's memory monitor kills it
  hang@<step>[:rank]      WorkerDict <rank> blocks forever inside update_actor (a deadlock:
                          nothing dies, nothing is logged; capture.py interrupts the driver)
  import@0                every WorkerDict imports the rollout backend (vllm, as verl's
                          vllm_rollout does) in init_model; it is not installed here
  flaky@<step>            the reward task of that step (a Ray task with retries, like a
                          call to a remote judge) fails twice with a connection error,
                          then succeeds; the run finishes
Config errors are injected through Hydra overrides (see capture.py): the TaskRunner's
validate_config, or the WorkerDict's batch-size normalisation (as verl's fsdp_workers does it).
"""

import os
import pprint as _pprint_mod
import random
import socket
import string
import threading
import time
from pprint import pprint

import hydra
import ray
from omegaconf import OmegaConf

# verl/trainer/constants_ppo.py
PPO_RAY_RUNTIME_ENV = {
    "env_vars": {
        "TOKENIZERS_PARALLELISM": "true",
        "NCCL_DEBUG": "WARN",
        "VLLM_LOGGING_LEVEL": "WARN",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    },
}


def get_ppo_ray_runtime_env():
    return PPO_RAY_RUNTIME_ENV


def _fault():
    """Parse FORENSICS_FAULT -> (kind, step, rank) or None."""
    spec = os.environ.get("FORENSICS_FAULT", "")
    if not spec:
        return None
    kind, _, rest = spec.partition("@")
    step, _, rank = rest.partition(":")
    return kind, int(step), int(rank or 1)


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config):
    run_ppo(config)


def run_ppo(config) -> None:
    if not ray.is_initialized():
        default_runtime_env = get_ppo_ray_runtime_env()
        ray_init_kwargs = config.ray_kwargs.get("ray_init", {})
        runtime_env_kwargs = ray_init_kwargs.get("runtime_env", {})
        runtime_env = OmegaConf.merge(default_runtime_env, runtime_env_kwargs)
        ray_init_kwargs = OmegaConf.create({**ray_init_kwargs, "runtime_env": runtime_env})
        print(f"ray init kwargs: {ray_init_kwargs}")
        ray.init(**OmegaConf.to_container(ray_init_kwargs))

    runner = ray.remote(num_cpus=0.1)(TaskRunner).remote()
    ray.get(runner.run.remote(config))

    timeline_json_file = config.ray_kwargs.get("timeline_json_file", None)
    if timeline_json_file:
        ray.timeline(filename=timeline_json_file)


# ---------------------------------------------------------------- verl.utils.config
def validate_config(config, use_reference_policy, use_critic):
    n_gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    minimal_bsz = n_gpus
    real_train_batch_size = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    assert real_train_batch_size % minimal_bsz == 0, (
        f"real_train_batch_size ({real_train_batch_size}) must be divisible by minimal possible batch size "
        f"({minimal_bsz})"
    )
    print("[validate_config] All configuration checks passed successfully!")


# ---------------------------------------------------------------- single_controller
def get_random_string(length: int) -> str:
    letters_digits = string.ascii_letters + string.digits
    return "".join(random.choice(letters_digits) for _ in range(length))


def create_colocated_worker_cls():
    """Like verl's create_colocated_worker_cls: the class is really named WorkerDict,
    qualname create_colocated_worker_cls.<locals>.WorkerDict."""

    class WorkerDict:
        def __init__(self, config):
            self.config = config
            self.rank = int(os.environ.get("RANK", "0"))
            self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
            self.rng = random.Random(1234 + self.rank)
            self.step = 0
            self._normalize_config_bsz()

        # -- verl fsdp_workers.ActorRolloutRefWorker.__init__: mini/micro batch normalisation
        def _normalize_config_bsz(self):
            actor = self.config.actor_rollout_ref.actor
            sp = actor.ulysses_sequence_parallel_size
            mini = actor.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n
            mini //= self.world_size // sp
            assert mini > 0, f"ppo_mini_batch_size {mini} should be larger than 0 after normalization"
            micro = actor.ppo_micro_batch_size_per_gpu
            if micro is not None:
                assert mini % micro == 0, (
                    f"normalized ppo_mini_batch_size {mini} should be divisible by ppo_micro_batch_size_per_gpu {micro}"
                )
                assert mini // micro > 0

        # -- verl fsdp_workers.ActorRolloutRefWorker.init_model, prefixed by role
        def actor_rollout_init_model(self):
            cfg = self.config
            if self.rank == 0:
                print("Qwen2ForCausalLM contains 494.03M parameters")
            print(f"Actor use_remove_padding={cfg.actor_rollout_ref.model.use_remove_padding}")
            if self.rank == 0:
                print(f"Total steps: {cfg.trainer.total_training_steps}, num_warmup_steps: 0")
            fault = _fault()
            if fault is not None and fault[0] == "import":
                self._build_rollout()
            time.sleep(0.5)
            return True

        # -- verl fsdp_workers._build_rollout: the rollout backend is imported when the rollout is built
        def _build_rollout(self):
            if self.config.actor_rollout_ref.rollout.name == "vllm":
                from vllm import LLM  # noqa: F401 - not installed on this machine

        def actor_rollout_generate_sequences(self, n_prompts, max_response_length):
            t0 = time.time()
            time.sleep(0.25)
            lengths = [self.rng.randint(max_response_length // 8, max_response_length) for _ in range(n_prompts)]
            scores = [float(self.rng.random() < 0.3 + 0.02 * self.step) for _ in range(n_prompts)]
            return {"response_length": lengths, "score": scores, "timing": time.time() - t0}

        def actor_rollout_compute_log_prob(self, n_tokens):
            time.sleep(0.05)
            return {"actor/entropy": 0.9 * (0.97**self.step) + 0.02 * self.rng.random()}

        def actor_rollout_update_actor(self, step, n_tokens):
            self.step = step
            fault = _fault()
            if fault is not None and fault[1] == step and fault[2] == self.rank:
                kind = fault[0]
                if kind == "sigkill":
                    os.kill(os.getpid(), 9)
                elif kind == "oom":
                    self._grow_memory()
                elif kind == "hang":
                    threading.Event().wait()  # never set: the worker waits as in a deadlocked collective
            time.sleep(0.2)
            import psutil

            rss_gb = psutil.Process().memory_info().rss / 1024**3
            return {
                "actor/pg_loss": self.rng.gauss(0.0, 0.01),
                "actor/pg_clipfrac": abs(self.rng.gauss(0.002, 0.001)),
                "actor/ppo_kl": self.rng.gauss(0.0, 1e-4),
                "actor/pg_clipfrac_lower": 0.0,
                "actor/grad_norm": abs(self.rng.gauss(0.25, 0.05)),
                "perf/mfu/actor": 0.0,
                "perf/max_memory_allocated_gb": rss_gb,
                "perf/max_memory_reserved_gb": rss_gb * 1.2,
                "perf/cpu_memory_used_gb": psutil.virtual_memory().used / 1024**3,
                "actor/lr": self.config.actor_rollout_ref.actor.optim.lr,
            }

        def _grow_memory(self):
            import psutil

            cap_mb = int(os.environ.get("FORENSICS_OOM_CAP_MB", "3072"))
            min_avail_mb = int(os.environ.get("FORENSICS_OOM_MIN_AVAIL_MB", "8192"))
            chunk = 256 * 1024 * 1024
            held = []
            while len(held) * 256 < cap_mb:
                if psutil.virtual_memory().available < min_avail_mb * 1024 * 1024:
                    break
                held.append(bytearray(b"\x01") * chunk)  # filled, so the pages are really touched
                time.sleep(0.2)
            # not killed: give the memory back and carry on (the capture then reports failure)
            del held

    return WorkerDict


class RayWorkerGroup:
    """Tiny version of verl.single_controller.ray.base.RayWorkerGroup."""

    def __init__(self, config, world_size, worker_resources):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name_prefix = get_random_string(length=6)
        bundles = [dict(worker_resources) for _ in range(world_size)]
        pg = placement_group(bundles=bundles, strategy="STRICT_PACK", name=f"{self.name_prefix}verl_group_0:")
        ray.get(pg.ready())
        worker_cls = ray.remote(create_colocated_worker_cls())
        self._workers = []
        self._worker_names = []
        master_addr, master_port = ray.util.get_node_ip_address(), "29500"
        for local_rank in range(world_size):
            env_vars = {
                "WORLD_SIZE": str(world_size),
                "RANK": str(local_rank),
                "WG_PREFIX": self.name_prefix,
                "WG_BACKEND": "ray",
                "RAY_LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": master_port,
            }
            name = f"{self.name_prefix}WorkerDict_0:{local_rank}"
            options = {
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=local_rank
                ),
                "runtime_env": {"env_vars": env_vars},
                "name": name,
                "max_restarts": 0,
                "max_concurrency": 1,
            }
            custom = {k: v for k, v in worker_resources.items() if k not in ("CPU", "GPU")}
            if custom:
                options["resources"] = custom
            options["num_cpus"] = worker_resources.get("CPU", 0)
            if "GPU" in worker_resources:
                options["num_gpus"] = worker_resources["GPU"]
            worker = worker_cls.options(**options).remote(config)
            self._workers.append(worker)
            self._worker_names.append(name)
        for method_name in (
            "actor_rollout_init_model",
            "actor_rollout_generate_sequences",
            "actor_rollout_compute_log_prob",
            "actor_rollout_update_actor",
        ):
            setattr(self, method_name.removeprefix("actor_rollout_"), self.func_generator(method_name))

    @property
    def world_size(self):
        return len(self._workers)

    def execute_all_async(self, method_name, *args, **kwargs):
        return [getattr(w, method_name).remote(*args, **kwargs) for w in self._workers]

    def func_generator(self, method_name, blocking=True):
        class Functor:
            def __call__(this, *args, **kwargs):
                output = self.execute_all_async(method_name, *args, **kwargs)
                if blocking:
                    output = ray.get(output)
                return output

        return Functor()


# ---------------------------------------------------------------- metric printing
def concat_dict_to_str(dict: dict, step):
    # verl/utils/logger/aggregate_logger.py
    import numbers

    output = [f"step:{step}"]
    for k, v in dict.items():
        if isinstance(v, numbers.Number):
            output.append(f"{k}:{_pprint_mod.pformat(v)}")
    output_str = " - ".join(output)
    return output_str


class LocalLogger:
    def log(self, data, step):
        print(concat_dict_to_str(data, step=step), flush=True)


def _mean(xs):
    return sum(xs) / len(xs)


# ---------------------------------------------------------------- ray_trainer
class RayPPOTrainer:
    def __init__(self, config, worker_resources):
        self.config = config
        self.worker_resources = worker_resources
        self.n_train = config.trainer.total_training_steps
        print(f"Size of train dataloader: {self.n_train}, Size of val dataloader: 1")
        self.total_training_steps = config.trainer.total_training_steps
        print(f"Total training steps: {self.total_training_steps}")
        self.rng = random.Random(7)

    def init_workers(self):
        world_size = self.config.trainer.n_gpus_per_node * self.config.trainer.nnodes
        self.actor_rollout_wg = RayWorkerGroup(self.config, world_size, self.worker_resources)
        self.actor_rollout_wg.init_model()

    def _load_checkpoint(self):
        checkpoint_folder = os.path.abspath(self.config.trainer.default_local_dir)
        tracker_file = os.path.join(checkpoint_folder, "latest_checkpointed_iteration.txt")
        print(f"Checkpoint tracker file does not exist: {tracker_file}")
        print("Training from scratch")
        return 0

    def _compute_reward(self, scores):
        """verl's reward call; with the flaky fault, a Ray task that a remote judge fails twice."""
        fault = _fault()
        if fault is None or fault[0] != "flaky" or fault[1] != self.global_steps:
            return scores
        attempts = os.path.abspath(f"reward_attempts_step{self.global_steps}")
        return ray.get(compute_score_remote.options(max_retries=2, retry_exceptions=True).remote(scores, attempts))

    def _validate(self):
        outs = self.actor_rollout_wg.generate_sequences(4, self.config.data.max_response_length)
        scores = [s for o in outs for s in o["score"]]
        lengths = [n for o in outs for n in o["response_length"]]
        return {
            "val-aux/openai/gsm8k/reward/mean@1": _mean(scores),
            "val-core/openai/gsm8k/acc/mean@1": _mean(scores),
            "val-aux/num_turns/min": 2,
            "val-aux/num_turns/max": 2,
            "val-aux/num_turns/mean": 2.0,
            "val-aux/response_length/mean": _mean(lengths),
        }

    def fit(self):
        from tqdm import tqdm

        logger = LocalLogger()
        self.global_steps = 0
        self._load_checkpoint()
        if self.config.trainer.get("val_before_train", True):
            val_metrics = self._validate()
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)

        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        last_val_metrics = None
        cfg = self.config
        bsz = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        per_rank = max(1, bsz // self.actor_rollout_wg.world_size)
        max_resp = cfg.data.max_response_length
        for _ in range(self.total_training_steps):
            metrics, timing = {}, {}
            t_step = time.time()
            t = time.time()
            gen = self.actor_rollout_wg.generate_sequences(per_rank, max_resp)
            timing["gen"] = time.time() - t
            resp = [n for o in gen for n in o["response_length"]]
            scores = [s for o in gen for s in o["score"]]
            prompt = [self.rng.randint(90, 260) for _ in resp]
            seqlens = [sum(o["response_length"]) + sum(prompt[: len(o["response_length"])]) for o in gen]
            t = time.time()
            scores = self._compute_reward(scores)
            timing["reward"] = time.time() - t + 0.001 + 0.0005 * self.rng.random()
            t = time.time()
            ent = self.actor_rollout_wg.compute_log_prob(sum(seqlens))
            timing["old_log_prob"] = time.time() - t
            timing["adv"] = 0.002 + 0.001 * self.rng.random()
            t = time.time()
            upd = self.actor_rollout_wg.update_actor(self.global_steps, sum(seqlens))
            timing["update_actor"] = time.time() - t
            timing["step"] = time.time() - t_step

            metrics["global_seqlen/min"] = min(seqlens)
            metrics["global_seqlen/max"] = max(seqlens)
            metrics["global_seqlen/minmax_diff"] = max(seqlens) - min(seqlens)
            metrics["global_seqlen/balanced_min"] = min(seqlens)
            metrics["global_seqlen/balanced_max"] = max(seqlens)
            metrics["global_seqlen/mean"] = _mean(seqlens)
            metrics["actor/entropy"] = _mean([e["actor/entropy"] for e in ent])
            for k in upd[0]:
                vals = [u[k] for u in upd]
                metrics[k] = max(vals) if "max" in k else (min(vals) if "min" in k else _mean(vals))
            metrics["training/global_step"] = self.global_steps
            metrics["training/epoch"] = 0
            metrics["critic/score/mean"] = _mean(scores)
            metrics["critic/score/max"] = max(scores)
            metrics["critic/score/min"] = min(scores)
            metrics["critic/rewards/mean"] = _mean(scores)
            metrics["critic/rewards/max"] = max(scores)
            metrics["critic/rewards/min"] = min(scores)
            adv = [self.rng.gauss(0, 0.5) for _ in scores]
            metrics["critic/advantages/mean"] = _mean(adv)
            metrics["critic/advantages/max"] = max(adv)
            metrics["critic/advantages/min"] = min(adv)
            metrics["response_length/mean"] = _mean(resp)
            metrics["response_length/max"] = max(resp)
            metrics["response_length/min"] = min(resp)
            metrics["response_length/clip_ratio"] = _mean([float(n == max_resp) for n in resp])
            metrics["prompt_length/mean"] = _mean(prompt)
            metrics["prompt_length/max"] = max(prompt)
            metrics["prompt_length/min"] = min(prompt)
            metrics["prompt_length/clip_ratio"] = 0.0
            metrics["timing_s/generate_sequences"] = max(o["timing"] for o in gen)
            for name in ("gen", "reward", "old_log_prob", "adv", "update_actor", "step"):
                metrics[f"timing_s/{name}"] = timing[name]
            n_tokens = sum(seqlens)
            metrics["timing_per_token_ms/gen"] = timing["gen"] * 1000 / sum(resp)
            metrics["timing_per_token_ms/update_actor"] = timing["update_actor"] * 1000 / n_tokens
            metrics["perf/total_num_tokens"] = n_tokens
            metrics["perf/time_per_step"] = timing["step"]
            metrics["perf/throughput"] = n_tokens / (timing["step"] * self.actor_rollout_wg.world_size)

            logger.log(data=metrics, step=self.global_steps)
            is_last_step = self.global_steps >= self.total_training_steps
            if is_last_step:
                pprint(f"Final validation metrics: {last_val_metrics}")
                progress_bar.close()
                return
            progress_bar.update(1)
            self.global_steps += 1


@ray.remote(num_cpus=0.1)
def compute_score_remote(scores, attempts_file):
    """A reward function that asks a remote judge; the judge refuses the first two connections."""
    with open(attempts_file, "a") as f:
        f.write("x")
    with open(attempts_file) as f:
        attempt = len(f.read())
    if attempt <= 2:
        raise ConnectionError(
            "HTTPConnectionPool(host='127.0.0.1', port=8000): Max retries exceeded with url: /judge "
            "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))"
        )
    return scores


class TaskRunner:
    def __init__(self):
        self.role_worker_mapping = {}
        self.mapping = {}

    def run(self, config):
        print(f"TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)

        validate_config(config=config, use_reference_policy=False, use_critic=False)

        worker_resources = {"CPU": 0.5}
        gpus = config.trainer.get("worker_gpus", 0)
        if gpus:  # each WorkerDict bundle asks for GPUs (a CPU-only cluster cannot place them)
            worker_resources["GPU"] = gpus
        node_resource = os.environ.get("FORENSICS_WORKER_NODE_RESOURCE")
        if node_resource:  # two-node scenario: put the WorkerDicts on the second node
            worker_resources = {"CPU": 1, node_resource: 1}
        trainer = RayPPOTrainer(config=config, worker_resources=worker_resources)
        trainer.init_workers()
        trainer.fit()


if __name__ == "__main__":
    main()
