"""forensics: what failed first in a multi-GPU LLM RL run, on which rank, why, and what to change."""

__version__ = "0.1.0"
