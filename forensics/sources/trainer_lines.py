"""Step lines of the trainers found beside verl: Megatron-LM, Hugging Face Trainer / TRL, DeepSpeed,
PyTorch Lightning's progress bar, OpenMMLab's mmengine, and the `step N | loss X` prints of hand-written loops.

- Megatron-LM: ` iteration      122/  250000 | consumed samples: 124928 | ... | lm loss: 2.504220E+00 | ...`
- Hugging Face Trainer and TRL print each log as a dict: `{'loss': 1.6531, 'grad_norm': nan,
  'learning_rate': 1.39e-05, 'epoch': 0.38}`; it names no step, so the n-th dict of a file is step n
  (its `step` or `global_step` key when it has one), and an evaluation dict (`eval_*` keys, no loss) belongs
  to the step before it. The final `{'train_runtime': ...}` is not a step. slime prints the same dict with
  prefixed keys after its step: `step 28: {'train/loss': 0.145, ..., 'train/grad_norm': 2.2e9, 'train/step': 28}`.
- mmengine (xtuner, mmdetection): `Epoch(train) [2][ 50/788]  lr: 2.0e-03  eta: 4:14:00  ...  loss: 1.5043`
  (the epoch's 50th of 788 iterations: step 838) or `Iter(train) [1010/2046] ...`; `eta` is not a metric.
- DeepSpeed: `[Rank 0] step=40, skipped=2, lr=[5e-05], mom=[[0.9, 0.999]]` (learning rate and skipped steps).
- Lightning (tqdm): `Epoch 0:   0%|  | 1/351750 [00:03<372:08:48,  3.81s/it, loss=11, reduced_train_loss=11.00,
  global_step=0.000]`, redrawn with carriage returns; the step is `global_step` when shown, else the batch.
- Plain prints: `iter 1631: loss 4.0863, time 561.94ms` (nanoGPT), `step 1790, loss = 1.53 (...)`,
  `iter 3436 step 53: loss 2.9911, iter time: 400.10ms`, `step 12 | loss 2.3456 | lr 0.0003`; taken only
  when a loss is among the values. verl's own `step:N - key:value` lines are left to sources/verl.py.
"""

from __future__ import annotations

import ast
import math
import re

from forensics.sources.base import LineExtractor, LineRecord, Sink

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
MEGATRON = re.compile(r"iteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|(?P<rest>.*)")
MEGATRON_PAIR = re.compile(rf"^\s*(?P<key>[A-Za-z][\w ()./-]*?)\s*:\s*(?P<value>{NUMBER}|nan|inf|-inf)\s*$", re.I)
HF_DICT = re.compile(r"\{'[^{}]*\}")
STEP_BEFORE_DICT = re.compile(r"\b(?:step|iteration|iter)\s*[:=]?\s*(?P<step>\d+)\s*[:,|-]?\s*$", re.I)
STEP_KEYS = ("step", "global_step")
DEEPSPEED = re.compile(rf"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>{NUMBER})")
LIGHTNING = re.compile(
    r"Epoch (?P<epoch>\d+):\s+\d+%\|[^|]*\|\s*(?P<batch>\d+)/(?P<total>\d+) \[[^\]]*?, (?P<post>[^\]]*)\]"
)
LIGHTNING_PAIR = re.compile(rf"(?P<key>[A-Za-z_][\w/.-]*)=(?P<value>{NUMBER}|nan|inf)(?=,|$)")
MMENGINE = re.compile(
    r"\b(?P<mode>Epoch|Iter)\(train\)\s*(?:\[\s*(?P<epoch>\d+)\])?\s*\[\s*(?P<i>\d+)/(?P<n>\d+)\]\s+(?P<rest>.*)"
)
MMENGINE_PAIR = re.compile(rf"(?:^|\s)(?P<key>[A-Za-z_][\w/.-]*):\s+(?P<value>{NUMBER}|nan|inf|-inf)(?![\w.:])")
MMENGINE_SKIPPED = {"eta", "epoch", "iter"}
VERL_STEP = re.compile(r"(?:^|\s)step:\d+ - ")
PLAIN_STEP = re.compile(r"(?:^|[\s\[(|:,])(?:step|Step|STEP)\s*[:=]?\s*(?P<step>\d+)\b(?!\s*/)")
PLAIN_ITER = re.compile(r"(?:^|[\s\[(|:,])(?:iter|iteration|Iter|Iteration)\s*[:=]?\s*(?P<step>\d+)\b")
PLAIN_PAIR = re.compile(
    rf"(?P<key>[A-Za-z_][A-Za-z0-9_/.-]*(?: [A-Za-z_][A-Za-z0-9_/.-]*)?)\s*(?:[:=]\s*|\s+)(?P<value>{NUMBER}|nan|inf)"
    r"(?P<unit>ms|s)?(?![\w.])"
)
STEP_WORDS = {"step", "iter", "iteration", "epoch"}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _emit(rec: LineRecord, sink: Sink, source: str, step: int, metrics: dict[str, float]) -> None:
    if not metrics:
        return
    rec.kind = "trainer_step"
    rec.source = source
    rec.notable = False
    rec.fields["step"] = step
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if bad:
        rec.fields["non_finite"] = bad[:20]
    sink.step_marks.append((rec.hit.file, rec.hit.line, step))
    for metric, value in metrics.items():
        sink.sample(metric, value, source=source, step=step, rank=rec.hit.ctx.rank, ts=rec.hit.ctx.ts)


def _megatron(rec: LineRecord, sink: Sink) -> None:
    m = MEGATRON.search(rec.hit.ctx.body)
    if not m:
        return
    metrics = {}
    for part in m["rest"].split("|"):
        pair = MEGATRON_PAIR.match(part)
        if pair:
            metrics[pair["key"].strip()] = float(pair["value"])
    _emit(rec, sink, "megatron", int(m["step"]), metrics)


def _mmengine(rec: LineRecord, sink: Sink) -> None:
    """OpenMMLab's logger (mmengine: xtuner, mmdetection): `Epoch(train) [E][i/N]  lr: …  loss: …` or
    `Iter(train) [i/N] …`; an epoch's i-th iteration is step (E-1)·N + i."""
    m = MMENGINE.search(rec.hit.ctx.body)
    if not m:
        return
    within = int(m["i"])
    step = (int(m["epoch"]) - 1) * int(m["n"]) + within if m["mode"] == "Epoch" and m["epoch"] else within
    metrics = {
        p["key"]: float(p["value"]) for p in MMENGINE_PAIR.finditer(m["rest"]) if p["key"] not in MMENGINE_SKIPPED
    }
    _emit(rec, sink, "mmengine", step, metrics)


def _hf_dict(rec: LineRecord, sink: Sink) -> None:
    m = HF_DICT.search(rec.hit.ctx.body)
    if not m:
        return
    text = re.sub(r"(?<=: )(nan|inf|-inf)(?=[,}])", r"'\1'", m[0])  # Python prints float('nan') as nan
    try:
        record = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return
    if not isinstance(record, dict) or "train_runtime" in record:
        return
    metrics = {}
    for key, value in record.items():
        number = _number(value) if isinstance(value, str) else value
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            metrics[str(key)] = float(number)
    given = _given_step(metrics, rec.hit.ctx.body[: m.start()])
    evaluation = "loss" not in metrics and any(k.startswith("eval_") for k in metrics)  # at the step before it
    counter = sink.counters.get(("hf_dict", rec.hit.file), 0) + (0 if evaluation else 1)
    sink.counters[("hf_dict", rec.hit.file)] = counter = max(counter, 1)
    _emit(rec, sink, "hf_trainer", int(given) if given is not None else counter, metrics)


def _given_step(metrics: dict[str, float], before: str) -> float | None:
    """The step a log dict names: its `step`/`global_step` key (also under a prefix, `train/step`), which is
    taken out of the metrics, else a `step N:` printed before the dict (slime, hand-written loops)."""
    keys = [k for k in metrics if k.rsplit("/", 1)[-1] in STEP_KEYS]
    given = [metrics.pop(k) for k in keys]
    if given and given[0]:
        return given[0]
    m = STEP_BEFORE_DICT.search(before)
    return float(m["step"]) if m else None


def _deepspeed(rec: LineRecord, sink: Sink) -> None:
    m = DEEPSPEED.search(rec.hit.ctx.body)
    if m:
        _emit(rec, sink, "deepspeed", int(m["step"]), {"lr": float(m["lr"]), "skipped steps": float(m["skipped"])})


def _lightning(rec: LineRecord, sink: Sink) -> None:
    last = None
    for segment in rec.hit.ctx.body.split("\r"):  # tqdm redraws the bar on one line
        m = LIGHTNING.search(segment)
        if m:
            last = m
    if last is None:
        return
    metrics = {p["key"]: float(p["value"]) for p in LIGHTNING_PAIR.finditer(last["post"])}
    metrics.pop("v_num", None)
    given = metrics.pop("global_step", None)
    step = int(given) if given is not None else int(last["epoch"]) * int(last["total"]) + int(last["batch"])
    _emit(rec, sink, "lightning", step, metrics)


def parse_plain(body: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of a hand-written loop's print, or None (no step, no loss, or another trainer's line)."""
    if VERL_STEP.search(body) or MEGATRON.search(body) or "{'" in body:
        return None
    m = PLAIN_STEP.search(body) or PLAIN_ITER.search(body)
    if not m:
        return None
    rest = body[m.end() :]
    metrics: dict[str, float] = {}
    for pair in PLAIN_PAIR.finditer(rest):
        key = pair["key"].strip()
        if key.lower() in STEP_WORDS:
            continue
        value = float(pair["value"])
        metrics[f"{key}_{pair['unit']}" if pair["unit"] else key] = value
    if not any("loss" in k.lower() for k in metrics):
        return None
    return int(m["step"]), metrics


def _plain(rec: LineRecord, sink: Sink) -> None:
    parsed = parse_plain(rec.hit.ctx.body)
    if parsed is not None:
        _emit(rec, sink, "plain_step", *parsed)


EXTRACTORS = [
    LineExtractor("megatron_iteration", "megatron", r"iteration\s+\d+\s*/\s*\d+\s*\|", _megatron),
    LineExtractor(
        "hf_log_dict",
        "hf_trainer",
        r"\{'(?:(?:train|eval|actor|critic)/)?"
        r"(?:loss|eval_loss|grad_norm|learning_rate|reward|train_loss|eval_reward)': ",
        _hf_dict,
    ),
    LineExtractor("mmengine_train", "mmengine", r"(?:Epoch|Iter)\(train\)\s*\[\s*\d+[\]/]", _mmengine),
    LineExtractor("deepspeed_step", "deepspeed", r"\] step=\d+, skipped=\d+, lr=\[", _deepspeed),
    LineExtractor("lightning_progress", "lightning", r"Epoch \d+: +\d+%\|", _lightning),
    # verl's step lines are verl's (parse_plain reads none of them): those its bulk reader reads are not read here
    LineExtractor("plain_step", "plain_step", r"(?i:step|iter)[^\n]*loss", _plain, yields_to=("verl_step",)),
]
