"""`python -m torch.utils.collect_env` (and `python -m vllm.collect_env`) dumps: the software stack.

The dump is `Key: value` lines (`PyTorch version: 2.5.1+cu124`, `Nvidia driver version: 550.54.15`),
a `GPU models and configuration:` block of `GPU i: <model>` lines, and `[pip3] name==version` /
`[conda] name version build channel` package lines. What it names goes into the run's environment.
"""

from __future__ import annotations

import re
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink
from forensics.textio import open_binary

MAX_BYTES = 4 * 1024 * 1024
MAX_LINE_CHARS = 4096
KEY_VALUE = re.compile(r"^(?P<key>[A-Za-z][\w ./()-]*?):\s*(?P<value>.*?)\s*$")
GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<model>.+?)(?: \(UUID: [^)]*\))?\s*$")
PIP_LINE = re.compile(r"^\[(?:pip3?|uv)\] (?P<name>[\w.-]+)==(?P<version>\S+)")
CONDA_LINE = re.compile(r"^\[conda\] (?P<name>[\w.-]+)\s+(?P<version>\d\S*)")
UNKNOWN = {"", "N/A", "Could not collect", "None"}
KEYS = {
    "PyTorch version": "torch_version",
    "CUDA used to build PyTorch": "torch_cuda_version",
    "CUDA runtime version": "cuda_runtime_version",
    "Nvidia driver version": "driver_version",
    "Python version": "python_version",
    "OS": "os",
    "Is CUDA available": "cuda_available",
    "vLLM Version": "vllm_version",
}
PACKAGES = {
    "torch": "torch_version",
    "vllm": "vllm_version",
    "sglang": "sglang_version",
    "nvidia-nccl-cu11": "nccl_pip_version",
    "nvidia-nccl-cu12": "nccl_pip_version",
    "nvidia-nccl-cu13": "nccl_pip_version",
    "transformers": "transformers_version",
    "flash-attn": "flash_attn_version",
    "flash_attn": "flash_attn_version",
    "ray": "ray_version",
    "verl": "verl_version",
    "triton": "triton_version",
    "megatron-core": "megatron_core_version",
}


def _sniff(name: str, head: bytes) -> bool:
    return b"PyTorch version:" in head and (b"Is debug build:" in head or b"CUDA used to build PyTorch:" in head)


def parse_collect_env(text: str) -> dict[str, object]:
    """Environment facts from a collect_env dump."""
    env: dict[str, object] = {}
    gpus: dict[int, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if len(line) > MAX_LINE_CHARS:
            continue  # no fact is that long; KEY_VALUE's `.*?\s*$` is quadratic in a line's runs of spaces
        m = GPU_LINE.match(line) or GPU_LINE.match(line.removeprefix("GPU models and configuration:").strip())
        if m:
            gpus.setdefault(int(m["index"]), m["model"])
            continue
        m = PIP_LINE.match(line) or CONDA_LINE.match(line)
        if m:
            key = PACKAGES.get(m["name"].lower())
            if key:
                env.setdefault(key, m["version"])
            continue
        m = KEY_VALUE.match(line)
        if m and m["key"] in KEYS and m["value"] not in UNKNOWN:
            env[KEYS[m["key"]]] = m["value"]
        elif m and m["key"] == "GPU models and configuration" and m["value"] not in UNKNOWN and not gpus:
            gpus[0] = m["value"]  # one GPU: the model on the same line, without `GPU 0:`
    if isinstance(env.get("python_version"), str):
        env["python_version"] = str(env["python_version"]).split(" ", 1)[0]
    if gpus:
        env["gpu_names"] = sorted(set(gpus.values()))
        env["gpu_count"] = len(gpus)
    return env


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    with open_binary(path) as fh:
        data = fh.read(MAX_BYTES)
    text = data.decode("utf-8", "replace")
    result.lines = text.count("\n") + 1
    result.environment = parse_collect_env(text)
    if not result.environment:
        result.warnings.append(f"{rel}: looked like a collect_env dump but named no versions")
    return result


FILE_SOURCES = [FileSource("collect_env", _sniff, _read)]
