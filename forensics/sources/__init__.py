"""Source modules, one per input kind. Adding a kind = adding a module here.

A module exports `EXTRACTORS` (line extractors run by the text scanner over every text log) and/or
`FILE_SOURCES` (readers of whole structured files, chosen by sniffing name and first bytes).
"""

from __future__ import annotations

from types import ModuleType

from forensics.sources import (
    collect_env,
    dcgm,
    flight_recorder,
    hydra_config,
    kineto,
    launchers,
    metrics_csv,
    metrics_jsonl,
    mlflow_store,
    nccl,
    nsys,
    nvidia_smi,
    nvidia_smi_q,
    rank_measurements,
    ray_events,
    ray_session,
    tensorboard,
    torch_distributed,
    torchrun,
    traceback,
    trainer_lines,
    verl,
    versions,
    wandb_offline,
)
from forensics.sources.base import FileSource, LineExtractor

MODULES: list[ModuleType] = [verl, traceback, torchrun, launchers, torch_distributed, nccl, nvidia_smi, flight_recorder]
MODULES += [hydra_config, collect_env, nvidia_smi_q, dcgm, versions]
MODULES += [ray_session, ray_events]  # Ray's own logs: session folders and events/*.log
MODULES += [nsys, kineto]
MODULES += [trainer_lines, metrics_jsonl, metrics_csv, tensorboard, mlflow_store, wandb_offline]  # beside verl's
MODULES += [rank_measurements]  # last: it reads only lines no other reader took


def line_extractors() -> list[LineExtractor]:
    return [e for module in MODULES for e in getattr(module, "EXTRACTORS", [])]


def file_sources() -> list[FileSource]:
    return [s for module in MODULES for s in getattr(module, "FILE_SOURCES", [])]
