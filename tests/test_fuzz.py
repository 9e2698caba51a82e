"""A fixed-budget run of scripts/fuzz.py: 150 mutated real run folders, each with a 10 s watchdog.

The long run (10,000+ inputs) is `python scripts/fuzz.py --count 10000 --seed 1`; its numbers are in the
pull request that added the fuzzer. Failing inputs are kept under tests/artifacts/fuzz/ for replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from scripts.fuzz import MUTATORS, SEED_RUNS
from tests.conftest import REPO

COUNT = 150
SEED = 20261130


def test_mutated_runs_never_crash_hang_leak_or_write(tmp_path):
    keep = REPO / "tests" / "artifacts" / "fuzz"
    budget = ["--count", str(COUNT), "--seed", str(SEED), "--workers", "2", "--timeout", "10", "--html-every", "50"]
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fuzz.py"), *budget, "--keep", str(keep)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    summary = json.loads(out.stdout)
    failures = "\n\n".join(
        f"input {f['input']} {f['mutations']} (replay: scripts/fuzz.py --replay {f['input']} --seed {SEED}):\n"
        + "\n".join(f["problems"])
        for f in summary["failures"]
    )
    assert not summary["failures"], failures
    assert out.returncode == 0, out.stderr
    assert summary["inputs"] == COUNT
    # the budget exercised every mutation and every seed run at least once
    assert set(MUTATORS) <= set(summary["mutations"])
    assert {f"seed:{p.name}" for p in SEED_RUNS} <= set(summary["mutations"])
