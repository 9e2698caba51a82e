"""Checkpoint loading: key sets summarised by the renaming that maps them, shapes by what differs.

- Keys: the missing and unexpected key sets, the layout each is written in (Hugging Face, Megatron-core,
  Megatron legacy, PEFT, FSDP, vLLM fused) and the prefix or infix that turns one into the other.
- Shapes: which dimensions differ, and by what factor: another model size, a tensor-parallel shard,
  another vocabulary, another layout.

The key lists and shapes are read from the evidence lines: a rule extracts one value per name, and these
lines hold many.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from forensics.analyses.explain.context import Reading
from forensics.analyses.explain.text import promote
from forensics.model import Finding

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


def explain_key_mismatch(finding: Finding, reading: Reading) -> None:
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


def explain_shape_mismatch(finding: Finding, reading: Reading) -> None:
    diffs: list[ShapeDiff] = []
    for e in finding.evidence:
        for m in (*SIZE_MISMATCH.finditer(e.text), *LOAD_WEIGHT.finditer(e.text)):
            key = m.groupdict().get("key") or str(finding.fields.get("key", "a weight"))
            d = shape_diff(key, _dims(m["ckpt"]), _dims(m["model"]))
            if d:
                diffs.append(d)
    if not diffs:
        shown = finding.fields.get("ckpt_shape")
        said = (
            f"The log shows the checkpoint's shape of {finding.fields.get('key', 'a weight')} ({shown}) but not the "
            "model's (the line is cut)."
            if shown
            else "The loader only asserted that the shapes differ; the log does not print them."
        )
        finding.explanation = (
            f"{said} A checkpoint saved for another model configuration (hidden size, vocabulary, heads) or another "
            "tensor-parallel size gives this."
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
    finding.remediation = promote(finding.remediation, "tensor-parallel" if kind == "tp_shard" else "model config")
