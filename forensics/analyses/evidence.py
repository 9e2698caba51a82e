"""Read what the evidence lines say, not only which rule they fired.

A rule gives a class; the numbers and names in its lines give the story. This module turns them into the
finding's `explanation` (and a few `fields`), and reorders the remediation so that the step that fits the
case comes first:

- CUDA OOM: requested vs free memory, PyTorch's allocated and reserved-but-unused memory, this and other
  processes' memory: true exhaustion, fragmentation, or memory held outside PyTorch; earlier peaks from the
  series say how close the run already was.
- Checkpoint keys: missing and unexpected key sets summarised by the renaming that maps one onto the other.
- Shapes: which dimensions differ, and by what factor.
- Ray: a RayTaskError chain read down to the innermost task, with its pid and host.
- Xid codes: their meaning.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

import polars as pl

from forensics.model import Finding

GIB = {"B": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 2**10, "KB": 1e3 / 2**30,
       "MB": 1e6 / 2**30, "GB": 1e9 / 2**30, "TB": 1e12 / 2**30}  # fmt: skip
SIZE = r"([\d.]+) ?([KMGT]?i?B)\b"

# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (names as dcgm-exporter prints them)
XID_MEANING = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    144: "NVLINK SAW Error",
    145: "NVLINK RLW Error",
    149: "NVLINK NETIR Error",
    154: "GPU Recovery Action Changed",
}


def _gib(number: str, unit: str) -> float:
    return float(number) * GIB.get(unit, 1.0)


def _fmt(gib: float) -> str:
    return f"{gib:.2f} GiB"


def _promote(remediation: list[str], keyword: str) -> list[str]:
    """The remediation with the items that mention `keyword` moved to the front, order otherwise kept."""
    first = [r for r in remediation if keyword in r]
    return first + [r for r in remediation if keyword not in r]


# --- CUDA out of memory ---------------------------------------------------------------------------------


@dataclass
class OomBudget:
    """The numbers of one CUDA OOM message, in GiB (None where the message does not say)."""

    tried: float
    capacity: float | None = None
    free: float | None = None
    allocated: float | None = None  # by PyTorch tensors
    unused_reserved: float | None = None  # reserved by PyTorch's cache but not allocated
    this_process: float | None = None  # the process's total use, PyTorch or not
    this_process_inferred: bool = False
    others: float = 0.0  # other processes on the same GPU
    gpu: int | None = None


CONTEXT_OVERHEAD_GIB = 2.0
OOM_TRIED = re.compile(r"Tried to allocate " + SIZE)
OOM_TOTAL = re.compile(r"GPU (\d+) has a total capac\w+ of " + SIZE + r" of which " + SIZE + r" is free")
OOM_OLD = re.compile(
    r"\(GPU (\d+); " + SIZE + r" total capacity; " + SIZE + r" already allocated; " + SIZE + r" free; "
    r"(?:" + SIZE + r" allowed; )?" + SIZE + r" reserved in total by PyTorch\)"
)
OOM_SELF = re.compile(r"this process has " + SIZE + r" memory in use")
OOM_OTHER = re.compile(r"Process (\d+) has " + SIZE + r" memory in use")
OOM_ALLOCATED = re.compile(r"Of the allocated memory " + SIZE + r" is allocated by PyTorch")
OOM_UNUSED = re.compile(SIZE + r" is reserved by PyTorch but unallocated")


def parse_oom(text: str) -> OomBudget | None:
    """The numbers of a CUDA OOM message (current, 2.1-2.3 and pre-2.0 wordings)."""
    m = OOM_TRIED.search(text)
    if not m:
        return None
    budget = OomBudget(tried=_gib(m[1], m[2]))
    old = OOM_OLD.search(text)
    if old:
        budget.gpu = int(old[1])
        budget.capacity, budget.allocated, budget.free = (
            _gib(old[2], old[3]),
            _gib(old[4], old[5]),
            _gib(old[6], old[7]),
        )
        budget.unused_reserved = max(0.0, _gib(old[10], old[11]) - budget.allocated)
        return budget
    m = OOM_TOTAL.search(text)
    if m:
        budget.gpu, budget.capacity, budget.free = int(m[1]), _gib(m[2], m[3]), _gib(m[4], m[5])
    m = OOM_ALLOCATED.search(text)
    if m:
        budget.allocated = _gib(m[1], m[2])
    m = OOM_UNUSED.search(text)
    if m:
        budget.unused_reserved = _gib(m[1], m[2])
    m = OOM_SELF.search(text)
    others = [_gib(o[2], o[3]) for o in OOM_OTHER.finditer(text)]
    if m:
        budget.this_process = _gib(m[1], m[2])
    elif others and budget.allocated is not None:
        # In a container NVML shows this process under its host pid, as "Process N"; the one entry that
        # holds at least PyTorch's reserved memory is most likely this process.
        reserved = budget.allocated + (budget.unused_reserved or 0.0)
        own = max(others)
        if own >= reserved * 0.98:
            others.remove(own)
            budget.this_process, budget.this_process_inferred = own, True
    budget.others = sum(others)
    return budget


def oom_case(b: OomBudget) -> str:
    """exhaustion | fragmentation | other_process | outside_pytorch | refused_while_free.

    The lever that alone would have made the request fit; `refused_while_free` when the GPU had the memory
    when the message was written (a per-process limit, or another process allocating at the same time).
    """
    if b.free is None:
        return "exhaustion"
    shortfall = b.tried - b.free
    if shortfall <= 0:
        return "refused_while_free"
    reserved = (b.allocated or 0.0) + (b.unused_reserved or 0.0)
    outside = b.this_process - reserved if b.this_process is not None else 0.0
    outside -= max(CONTEXT_OVERHEAD_GIB, 0.03 * (b.capacity or 0.0))  # CUDA context, cuBLAS, NCCL: always there
    levers = {
        "fragmentation": b.unused_reserved or 0.0,
        "other_process": b.others,
        "outside_pytorch": outside,
    }
    covering = {k: v for k, v in levers.items() if v >= max(shortfall, 0.25)}
    return max(covering, key=lambda k: covering[k]) if covering else "exhaustion"


EXHAUSTION = "True exhaustion: the tensors of this step do not fit; make the step smaller."
OOM_PROMOTE = {
    "exhaustion": "ppo_micro_batch_size_per_gpu",
    "fragmentation": "expandable_segments",
    "other_process": "gpu_memory_utilization",
    "outside_pytorch": "gpu_memory_utilization",
    "refused_while_free": "gpu_memory_utilization",
}


def _oom_text(b: OomBudget, case: str) -> str:
    gpu = f"GPU {b.gpu}" if b.gpu is not None else "the GPU"
    parts = [f"Asked for {_fmt(b.tried)}"]
    if b.free is not None and b.capacity is not None:
        parts[0] += f" with {_fmt(b.free)} free of {_fmt(b.capacity)} on {gpu}"
    facts = []
    if b.allocated is not None:
        facts.append(f"PyTorch tensors held {_fmt(b.allocated)}")
    if b.unused_reserved is not None:
        facts.append(f"its cache a further {_fmt(b.unused_reserved)} reserved but unused")
    if b.this_process is not None and b.allocated is not None:
        outside = b.this_process - b.allocated - (b.unused_reserved or 0.0)
        who = "this process (seen by the driver under its host pid)" if b.this_process_inferred else "this process"
        facts.append(f"{who} used {_fmt(b.this_process)} in all, {_fmt(max(outside, 0.0))} of it outside PyTorch")
    if b.others:
        facts.append(f"other processes on the GPU held {_fmt(b.others)}")
    text = parts[0] + (": " + "; ".join(facts) if facts else "") + ". "
    if b.capacity and b.tried >= 0.1 * b.capacity:
        text += f"One request of {100 * b.tried / b.capacity:.0f}% of the GPU means a large micro-batch or sequence. "
    return (
        text
        + {
            "exhaustion": EXHAUSTION,
            "fragmentation": (
                "Fragmentation: the cache holds enough free memory, but not in one piece; "
                "expandable segments let it be reused."
            ),
            "other_process": (
                "Memory held by another process on the same GPU (a colocated rollout engine or a leftover process): "
                "give training more of the GPU."
            ),
            "outside_pytorch": (
                "Memory held outside PyTorch's allocator in this process (the colocated rollout engine's weights "
                "and KV cache when it is not put to sleep, NCCL buffers, CUDA context): free it before the update."
            ),
            "refused_while_free": (
                "The GPU had that much free memory when the message was written, so the allocation was refused by a "
                "per-process limit (set_per_process_memory_fraction) or lost to another process allocating at the "
                "same moment (a colocated rollout engine waking up)."
            ),
        }[case]
    )


def _step_peaks(series: pl.DataFrame) -> pl.DataFrame:
    """verl's perf/max_memory_allocated_gb per step (max over ranks and sources), in step order."""
    if series.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "value": pl.Float64})
    return (
        series.filter(
            pl.col("metric").str.ends_with("max_memory_allocated_gb")
            & pl.col("value").is_finite()
            & pl.col("step").is_not_null()
        )
        .group_by("step")
        .agg(pl.col("value").max())
        .sort("step")
    )


def memory_trend(peaks: pl.DataFrame) -> str | None:
    """growing: the per-step peak rises step after step (a leak); None when it does not."""
    if peaks.height < 4:
        return None
    values = peaks["value"].to_list()
    top = max(values)
    rises = sum(1 for a, b in itertools.pairwise(values) if b > a + 0.01 * top)
    if rises >= 0.7 * (len(values) - 1) and values[-1] - values[0] >= max(1.0, 0.2 * top):
        return "growing"
    return None


def _peak_text(peaks: pl.DataFrame, budget: OomBudget) -> tuple[str, str | None]:
    """How the earlier steps used memory: a steady rise (leak), a sudden jump (spike), or how close they came."""
    if peaks.is_empty():
        return "", None
    first, last = peaks.row(0, named=True), peaks.row(-1, named=True)
    top = peaks.sort("value", descending=True).row(0, named=True)
    trend = memory_trend(peaks)
    if trend == "growing":
        per_step = (last["value"] - first["value"]) / max(1, last["step"] - first["step"])
        return (
            f" The peak allocated memory (perf/max_memory_allocated_gb) grew step after step, from "
            f"{first['value']:.2f} GB at step {first['step']} to {last['value']:.2f} GB at step {last['step']} "
            f"(+{per_step:.2f} GB per step): memory leaks - something keeps tensors alive from one step to the next.",
            "leak",
        )
    if budget.allocated and top["value"] < 0.5 * budget.allocated:
        return (
            f" Earlier steps peaked at {top['value']:.2f} GB (step {top['step']}); the failing step needed far more: "
            "a spike - an unusually long sequence or a larger micro-batch - not a slow growth.",
            "spike",
        )
    text = f" Before failing, the peak allocated memory over {peaks.height} logged step(s) was {top['value']:.2f} GB"
    text += f" at step {top['step']}"
    if budget.capacity:
        text += f" ({100 * top['value'] / budget.capacity:.0f}% of {budget.capacity:.2f} GiB)"
    return text + ".", None


def explain_cuda_oom(finding: Finding, series: pl.DataFrame, quote_history: bool = True) -> None:
    """The OOM budget, its case, and (unless a detector already tells it) how earlier steps used memory."""
    budget = next((b for b in (parse_oom(e.text) for e in finding.evidence) if b), None)
    if budget is None:
        if any("cumem_allocator" in e.text for e in finding.evidence):
            finding.fields["oom_case"] = "rollout_wake_up"
            finding.explanation = (
                "vLLM's sleep-mode allocator (cumem) could not map the rollout engine's memory back when it woke "
                "up: the trainer's weights, gradients or optimizer state still occupy the GPU at that moment."
            )
            finding.remediation = _promote(finding.remediation, "gpu_memory_utilization")
        return
    case = oom_case(budget)
    finding.fields["oom_case"] = case
    history, trend = _peak_text(_step_peaks(series), budget)
    text = _oom_text(budget, case)
    if trend == "leak" and case == "exhaustion":
        text = text.replace(EXHAUSTION, "True exhaustion, built up over the run rather than by this step.")
    finding.explanation = text + (history if quote_history else "")
    finding.remediation = _promote(finding.remediation, OOM_PROMOTE[case])
    if trend:
        finding.fields["memory_trend"] = trend
    if trend == "leak":
        finding.remediation = _promote(finding.remediation, "grows from step to step")


# --- checkpoint key sets --------------------------------------------------------------------------------

QUOTED_KEY = re.compile(r'"([\w.]+)"')
LAYER_INDEX = re.compile(r"\.\d+\.")
VLLM_FUSED = re.compile(r"\.qkv_proj\.|\.gate_up_proj\.")
NAMING = (  # (name, pattern): the layout a key set is written in
    ("PEFT/LoRA wrapped", re.compile(r"\.base_layer\.|\.lora_[AB]\.|^base_model\.model\.")),
    ("FSDP-wrapped", re.compile(r"_fsdp_wrapped_module\.")),
    (
        "Megatron-core",
        re.compile(r"decoder\.layers\.\d+\.|embedding\.word_embeddings|\boutput_layer\.|linear_qkv|linear_fc[12]"),
    ),
    ("Megatron legacy", re.compile(r"query_key_value|dense_h_to_4h|dense_4h_to_h|input_norm\.|language_model\.")),
    ("vLLM fused", VLLM_FUSED),
    (
        "Hugging Face",
        re.compile(r"(?:^|\.)layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)|embed_tokens|lm_head"),
    ),
)
CONVERSION = {  # (model naming, checkpoint naming) -> what to do
    ("Megatron-core", "Hugging Face"): "convert it with verl's scripts/converter_hf_to_mcore.py",
    ("Hugging Face", "Megatron-core"): (
        "merge it to Hugging Face format with python -m verl.model_merger merge --backend megatron"
    ),
    ("Megatron legacy", "Megatron-core"): (
        "load it with the Megatron-core model (--use-mcore-models) or convert it between the core and legacy layouts"
    ),
    ("Megatron-core", "Megatron legacy"): (
        "load it with the legacy model or convert it between the legacy and core layouts"
    ),
    ("vLLM fused", "PEFT/LoRA wrapped"): (
        "merge the LoRA adapter into the base weights, or strip `.base_layer` from the names, before they reach vLLM"
    ),
    ("Hugging Face", "PEFT/LoRA wrapped"): (
        "merge the LoRA adapter (peft merge_and_unload) or strip `base_model.model.` and `.base_layer`"
    ),
}


def naming_of(keys: list[str]) -> str | None:
    """The layout most of `keys` are written in, or None."""
    votes = Counter(name for key in keys for name, pattern in NAMING if pattern.search(key))
    return votes.most_common(1)[0][0] if votes else None


def key_pattern(keys: list[str], limit: int = 5) -> str:
    """A short picture of a key set: layer indices folded to N, common head and tail factored out."""
    shapes = list(dict.fromkeys(LAYER_INDEX.sub(".N.", k) for k in keys))
    if len(shapes) == 1:
        return shapes[0]
    head = _common_prefix(shapes)
    head = head[: head.rfind(".") + 1]
    tail = _common_prefix([s[len(head) :][::-1] for s in shapes])[::-1]
    tail = tail[tail.find(".") :] if "." in tail else ""
    middles = [s[len(head) : len(s) - len(tail)] for s in shapes]
    shown = ", ".join(middles[:limit]) + (", ..." if len(middles) > limit else "")
    return f"{head}{{{shown}}}{tail}"


def _common_prefix(items: list[str]) -> str:
    if not items:
        return ""
    lo, hi = min(items), max(items)
    i = 0
    while i < len(lo) and lo[i] == hi[i]:
        i += 1
    return lo[:i]


def renaming(missing: list[str], unexpected: list[str]) -> str | None:
    """The prefix or infix that turns the model's (missing) keys into the checkpoint's (unexpected) ones."""
    prefixes: Counter[str] = Counter()
    unexpected_set = set(unexpected)
    for m in missing:
        for u in unexpected_set:
            if u != m and u.endswith(m):
                prefixes[f"the checkpoint adds the prefix '{u[: len(u) - len(m)]}'"] += 1
            elif u != m and m.endswith(u):
                prefixes[f"the model adds the prefix '{m[: len(m) - len(u)]}'"] += 1
        for marker in (".base_layer", "_fsdp_wrapped_module.", "_orig_mod."):
            if any(u.replace(marker, "") == m for u in unexpected_set if marker in u):
                prefixes[f"the checkpoint inserts '{marker}'"] += 1
    if not prefixes:
        return None
    what, n = prefixes.most_common(1)[0]
    return f"{what} ({n} of {len(missing)} missing keys match an unexpected key that way)"


def explain_key_mismatch(finding: Finding) -> None:
    missing: list[str] = []
    unexpected: list[str] = []
    for e in finding.evidence:
        if "Missing key(s)" in e.text:
            missing += QUOTED_KEY.findall(e.text)
        elif "Unexpected key(s)" in e.text:
            unexpected += QUOTED_KEY.findall(e.text)
    looked_up = finding.fields.get("key") if isinstance(finding.fields.get("key"), str) else None
    if looked_up and not unexpected:
        unexpected = [looked_up]
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"the model expects {len(missing)}+ key(s) the checkpoint lacks, like {key_pattern(missing)}")
    if unexpected:
        what = "a name the model does not have" if looked_up else "key(s) the model does not have"
        parts.append(f"the loader was given {what}: {key_pattern(unexpected)}")
    text = "; ".join(parts)
    text = text[:1].upper() + text[1:] + "."
    rename = renaming(missing, unexpected) if missing and unexpected else None
    if rename:
        text += f" The renaming that maps them: {rename}."
    model_naming, ckpt_naming = naming_of(missing), naming_of(unexpected)
    if ckpt_naming == "PEFT/LoRA wrapped" and looked_up:
        model_naming = "vLLM fused" if VLLM_FUSED.search(looked_up) else "Hugging Face"
    if looked_up and ckpt_naming == "PEFT/LoRA wrapped":
        plain = re.sub(r"\.base_layer|^base_model\.model\.", "", looked_up)
        text += f" Without the PEFT wrapper the name would be '{plain}'."
    if model_naming and ckpt_naming and model_naming != ckpt_naming:
        text += f" The model uses {model_naming} names, the checkpoint {ckpt_naming} names"
        how = CONVERSION.get((model_naming, ckpt_naming))
        text += f": {how}." if how else "."
    elif model_naming and not unexpected:
        text += (
            f" The expected names are in {model_naming} layout; a checkpoint saved in another layout (Megatron-core "
            "decoder.layers.N.self_attention.linear_qkv vs legacy layers.N.self_attention.query_key_value vs "
            "Hugging Face model.layers.N.self_attn.q_proj) has none of them."
        )
    finding.explanation = text
    finding.fields["key_naming"] = {"model": model_naming, "checkpoint": ckpt_naming}


# --- tensor shapes --------------------------------------------------------------------------------------

SIZE_MISMATCH = re.compile(
    r"size mismatch for (?P<key>[\w.]+): copying a param with shape torch\.Size\(\[(?P<ckpt>[\d, ]*)\]\) from "
    r"checkpoint, the shape in current model is torch\.Size\(\[(?P<model>[\d, ]*)\]\)"
)
LOAD_WEIGHT = re.compile(
    r"Attempted to load weight \(torch\.Size\(\[(?P<ckpt>[\d, ]*)\]\)\) "
    r"into parameter \(torch\.Size\(\[(?P<model>[\d, ]*)\]\)\)"
)
VOCAB_KEY = re.compile(r"embed|lm_head|word_embeddings|output_layer|wte\b")
NORM_KEY = re.compile(r"norm|ln_\w*\.|\.ln\d*\.")
BIAS_KEY = re.compile(r"\.bias$")


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


@dataclass(frozen=True)
class ShapeDiff:
    """How one checkpoint tensor differs from the model's."""

    kind: str  # model_size | tp_shard | vocabulary | layout
    text: str
    factor: int | None = None


def shape_diff(key: str, ckpt: tuple[int, ...], model: tuple[int, ...]) -> ShapeDiff | None:
    """What one shape difference suggests on its own."""
    if len(ckpt) != len(model):
        return ShapeDiff(
            "layout", f"{key} has {len(ckpt)} dimension(s) in the checkpoint and {len(model)} in the model"
        )
    diff = [(i, c, m) for i, (c, m) in enumerate(zip(ckpt, model, strict=True)) if c != m]
    if not diff or any(min(c, m) == 0 for _, c, m in diff):
        return None
    factors = {max(c, m) / min(c, m) for _, c, m in diff}
    shown = f"{key}: {list(ckpt)} in the checkpoint vs {list(model)} in the model"
    if len(diff) == 1:
        i, c, m = diff[0]
        factor = max(c, m) / min(c, m)
        if VOCAB_KEY.search(key) and i == 0 and not factor.is_integer():
            return ShapeDiff("vocabulary", shown)
        if NORM_KEY.search(key) or (len(ckpt) == 1 and not BIAS_KEY.search(key)):
            return ShapeDiff("model_size", shown)  # norms are never sharded: the hidden size differs
        if factor.is_integer():
            return ShapeDiff("tp_shard", shown, int(factor))
        return ShapeDiff("layout", shown)
    if len(factors) == 1 and len(diff) == len(ckpt):
        return ShapeDiff("model_size", shown)
    return ShapeDiff("layout", shown)


SHAPE_STORY = {
    "model_size": (
        "the hidden size differs (norm weights and whole matrices scale together): the checkpoint is of another "
        "model size or config - check the model path and its config.json"
    ),
    "tp_shard": (
        "only one dimension differs, by a factor {factor}: a tensor-parallel shard (TP={factor}) loaded against "
        "full weights, or the other way round - merge the shards or load with the tensor-parallel size they were "
        "saved with"
    ),
    "vocabulary": "the vocabulary size differs: another tokenizer, added tokens, or another vocabulary padding",
    "layout": "the tensor layout differs: another architecture or model config",
}


def explain_shape_mismatch(finding: Finding) -> None:
    diffs: list[ShapeDiff] = []
    for e in finding.evidence:
        for m in (*SIZE_MISMATCH.finditer(e.text), *LOAD_WEIGHT.finditer(e.text)):
            key = m.groupdict().get("key") or str(finding.fields.get("key", "a weight"))
            d = shape_diff(key, _dims(m["ckpt"]), _dims(m["model"]))
            if d:
                diffs.append(d)
    if not diffs:
        finding.explanation = (
            "The loader only asserted that the shapes differ; the log does not print them. A checkpoint saved for "
            "another model configuration (hidden size, vocabulary, heads) or another tensor-parallel size gives this."
        )
        return
    kinds = Counter(d.kind for d in diffs)
    factors = {d.factor for d in diffs if d.kind == "tp_shard"}
    kind = next(k for k in ("model_size", "vocabulary", "layout", "tp_shard") if k in kinds)
    if kind == "tp_shard" and len(factors) > 1:
        kind = "layout"
    example = next(d for d in diffs if d.kind == kind) if kind in kinds else diffs[0]
    story = SHAPE_STORY[kind].format(factor=next(iter(factors), "k"))
    finding.explanation = f"{len(diffs)} tensor(s) shown differ; e.g. {example.text}. Reading: {story}."
    finding.fields["shape_case"] = kind
    finding.remediation = _promote(finding.remediation, "tensor-parallel" if kind == "tp_shard" else "model config")


# --- Ray wrappers ---------------------------------------------------------------------------------------

RAY_TASK_ERROR = re.compile(
    r"RayTaskError\((?P<cause>[\w.]+)\): (?:\x1b\[\d+m)?ray::(?P<task>[\w.<>]+)\(\)(?:\x1b\[\d+m)? "
    r"\(pid=(?P<pid>\d+), ip=(?P<ip>[^,)\s]+)"
)


ACTOR_GONE = ("ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError")


def explain_ray_wrapper(finding: Finding) -> None:
    """A RayTaskError chain printed outer first: name the innermost task and show its line first."""
    chain = [(e, m) for e in finding.evidence if (m := RAY_TASK_ERROR.search(e.text))]
    if not chain:
        return
    inner_evidence, inner = chain[-1]
    outer = list(dict.fromkeys(m["task"] for _, m in chain[:-1] if m["task"] != inner["task"]))
    finding.evidence.remove(inner_evidence)
    finding.evidence.insert(0, inner_evidence)
    finding.host = inner["ip"]  # where the error was raised, not where the driver re-raised it
    finding.fields.update(task=inner["task"], task_pid=int(inner["pid"]), task_ip=inner["ip"])
    where = f"{inner['task']} (pid {inner['pid']} on {inner['ip']})"
    cause = inner["cause"].rsplit(".", 1)[-1]
    if cause in ACTOR_GONE:
        text = f"{where} got {cause}: an actor it called had died"
    else:
        text = f"{cause} was raised in {where}"
    text += f" and was re-raised by {', '.join(outer)}." if outer else "."
    finding.explanation = " ".join(x for x in (finding.explanation, text) if x)


ACTOR_EXIT = re.compile(r"Worker exit type: (?P<type>\w+) Worker exit detail: (?P<detail>[^.]*)")


def explain_actor_death(finding: Finding) -> None:
    explain_ray_wrapper(finding)
    for e in finding.evidence:
        m = ACTOR_EXIT.search(e.text)
        if m and "connection error code 2" in m["detail"]:
            finding.explanation = " ".join(
                x
                for x in (
                    finding.explanation,
                    f"Ray saw the worker process vanish ({m['type']}: {m['detail']}) without an exception: it was "
                    "killed (SIGKILL - the kernel OOM killer is the usual sender) or crashed in native code. "
                    "Nothing in these logs says which; the worker's host kernel log (dmesg) and raylet.out will.",
                )
                if x
            )
            return


# --- entry point ----------------------------------------------------------------------------------------


NETWORK_TROUBLE = re.compile(
    r"No route to host|Connection refused|connection abort|Connection reset|Connection closed|Network is unreachable|"
    r"timed out|Broken pipe|exceeded (?:error )?retry count|Address family not supported|Cannot assign requested"
)


def explain_nccl_error(finding: Finding) -> None:
    """Quote NCCL's "Last error" and say when it points at the network path between hosts."""
    last = finding.fields.get("last_error")
    if not isinstance(last, str):
        return
    finding.explanation = f"NCCL's last error: {last.strip()}."
    if "no socket interface found" in last:
        finding.explanation += (
            " NCCL found no network interface to use: NCCL_SOCKET_IFNAME names one that does not exist on this host "
            "(compare with `ip addr`), or every interface was excluded."
        )
        finding.remediation = _promote(finding.remediation, "NCCL_SOCKET_IFNAME")
    elif NETWORK_TROUBLE.search(last):
        finding.explanation += (
            " A socket connection between ranks failed: usually NCCL picked an interface the peers cannot reach "
            "(docker0, a virtual or IPv6 link-local address) or a firewall blocks it."
        )
        finding.remediation = _promote(finding.remediation, "NCCL_SOCKET_IFNAME")


FINGERPRINT = re.compile(
    r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\((?:SequenceNumber=(?P<seq>\d+),? ?)?"
    r"OpType=(?P<op>\w+)(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dtype>\w+))?"
)
LAGGING = re.compile(r"\[(?P<ranks>[\d, ]+)\] (?:are the lagging ranks|joined but didn't finish)")


def explain_collective_mismatch(finding: Finding, texts: list[str]) -> None:
    """Who ran what: each rank's own fingerprint (the first one in its report; the peer's as it saw it can be
    garbled), or the lagging ranks of a desync report. `texts` are the lines of every rank's report."""
    calls: dict[int, str] = {}
    seq = None
    for text in texts:
        m = FINGERPRINT.search(text)
        if m:
            shape = f" [{m['shape']}]" if m["shape"] is not None else ""
            calls.setdefault(int(m["rank"]), f"{m['op']}{shape}{' ' + m['dtype'] if m['dtype'] else ''}")
            seq = seq or m["seq"]
    if len(set(calls.values())) > 1:
        groups: dict[str, list[int]] = {}
        for rank, call in sorted(calls.items()):
            groups.setdefault(call, []).append(rank)
        at = f" at collective {seq}" if seq else ""
        finding.explanation = f"The ranks disagree{at}: " + "; ".join(f"rank(s) {r} run {c}" for c, r in groups.items())
        odd = [r for r in groups.values() if len(r) == 1]
        if len(groups) == 2 and len(odd) == 1 and len(calls) > 2:
            finding.rank = odd[0][0]
            finding.explanation += f". Rank {finding.rank} is the odd one out."
        else:
            finding.rank = None
            finding.explanation += ". The report cannot tell which side deviated; look at both call sites."
        return
    lagging = sorted({int(r) for text in texts for m in LAGGING.finditer(text) for r in m["ranks"].split(",")})
    if lagging:
        finding.rank = lagging[0] if len(lagging) == 1 else None
        finding.fields["lagging_ranks"] = lagging
        finding.explanation = f"PyTorch's desync report names rank(s) {lagging} as the ones the others waited for."


def explain_xid(finding: Finding) -> None:
    code = finding.fields.get("xid")
    if code is not None and str(code).isdigit():
        meaning = XID_MEANING.get(int(code))
        if meaning:
            finding.fields["xid_meaning"] = meaning
            finding.explanation = f"Xid {code}: {meaning}."


def explain_cuda_error(finding: Finding) -> None:
    """What kind of kernel failure: an out-of-range index (data) or a bad memory access (kernel)."""
    assertion = finding.fields.get("assertion")
    error = str(finding.fields.get("cuda_error", ""))
    if assertion or "device-side assert" in error:
        shown = f" (`{assertion}`)" if assertion else ""
        finding.explanation = (
            f"A GPU kernel's bounds check failed{shown}: an index was out of range - most often a token id at or "
            "above the embedding's vocabulary size (tokenizer and model config disagree, special tokens added "
            "without resizing the embedding) or a label outside the classes."
        )
    elif "illegal memory access" in error or "illegal instruction" in error or "misaligned" in error:
        finding.explanation = (
            "A kernel touched memory it does not own: a bug in a custom or fused kernel (attention backend, "
            "speculative decoding, a quantised GEMM) or corrupted state; every later CUDA call in the process fails."
        )


NON_FINITE = re.compile(r"(?P<metric>[\w/@.\-]+):(?:np\.float\d+\()?-?(?:nan|inf)\b")


def explain_instability(finding: Finding) -> None:
    """Which metrics went non-finite first, and at which step."""
    for e in finding.evidence:
        metrics = list(dict.fromkeys(m["metric"] for m in NON_FINITE.finditer(e.text)))
        if metrics:
            step = finding.fields.get("step")
            at = f"At step {step}" if step is not None else "First"
            shown = ", ".join(metrics[:6]) + (", ..." if len(metrics) > 6 else "")
            finding.explanation = f"{at} these became NaN/inf: {shown}."
            return


def explain_process_killed(finding: Finding, series: pl.DataFrame) -> None:
    """A SIGKILL with no OOM line: quote the host memory the run reported, if any."""
    finding.explanation = (
        "SIGKILL comes from outside the process - the kernel OOM killer, a scheduler's memory or time limit, or an "
        "operator - and leaves no traceback; these logs do not say which: read the host's kernel log (dmesg)."
    )
    host = (
        series.filter(pl.col("metric").str.ends_with("cpu_memory_used_gb") & pl.col("value").is_finite())
        if not series.is_empty()
        else series
    )
    if host.is_empty():
        return
    last = host.sort("step", nulls_last=True).row(-1, named=True)
    top = host["value"].max()
    finding.explanation = (
        f"No out-of-memory line in these logs, but host memory in use (perf/cpu_memory_used_gb, node-wide) "
        f"reached {top:.1f} GB (last logged {last['value']:.1f} GB at step {last['step']}): compare it with the "
        "node's RAM; a SIGKILL near the limit is the OOM killer's."
    )


def explain_host_oom(finding: Finding) -> None:
    """Ray's memory monitor numbers: how full the node was, against which threshold, and whom it killed."""
    f = finding.fields
    finding.host = finding.host or f.get("node_ip")
    if f.get("node_used_gb") and f.get("node_total_gb"):
        node = f" {f['node_ip']}" if f.get("node_ip") else ""
        text = f"The node{node} used {f['node_used_gb']} GB of {f['node_total_gb']} GB"
        if f.get("threshold") or f.get("threshold_pct"):
            limit = f["threshold"] if f.get("threshold") else f"{f['threshold_pct']}% of its memory"
            text += f", above Ray's kill threshold of {limit} (RAY_memory_usage_threshold)"
        if f.get("killed_task"):
            text += f"; Ray killed {f['killed_task']} (pid {f.get('killed_pid')}, {f.get('killed_used_gb')} GB)"
        finding.explanation = text + "."


def explain_node_death(finding: Finding) -> None:
    """The node's address; the story of a node death (killed raylet vs missed heartbeats, actors lost) is told
    by the Ray cluster reading, which sees every node's logs."""
    finding.host = finding.host or finding.fields.get("node_ip")


def read_evidence(finding: Finding, series: pl.DataFrame, quote_history: bool = True) -> None:
    """Fill the finding's explanation (and fields, remediation order) from what its lines say.

    `quote_history=False` when a detector finding already tells how the series led to this failure.
    """
    if finding.cls == "cuda_oom":
        explain_cuda_oom(finding, series, quote_history)
        explain_ray_wrapper(finding)
    elif finding.cls == "weight_key_mismatch":
        explain_key_mismatch(finding)
    elif finding.cls == "shape_mismatch":
        explain_shape_mismatch(finding)
    elif finding.cls == "ray_actor_died":
        explain_actor_death(finding)
    elif finding.cls == "gpu_hardware":
        explain_xid(finding)
    elif finding.cls == "cuda_error":
        explain_xid(finding)
        if not finding.explanation:
            explain_cuda_error(finding)
    elif finding.cls == "training_instability":
        explain_instability(finding)
    elif finding.cls == "nccl_error":
        explain_nccl_error(finding)
    elif finding.cls == "process_killed":
        explain_process_killed(finding, series)
    elif finding.cls == "host_oom":
        explain_host_oom(finding)
    elif finding.cls == "ray_node_died":
        explain_node_death(finding)
