"""The labelled corpora: the repository's (shape, split rule, floors) and the seed excerpts beside the checkout."""

from __future__ import annotations

import csv
import hashlib
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from forensics.evaluation import below_floors, evaluate, read_corpus, read_floors
from forensics.rules.model import TAXONOMY
from tests.conftest import CORPUS

REPO_CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SPLIT_SALT = "forensics-corpus-split-v1:"


def _rows() -> list[dict[str, str]]:
    with (REPO_CORPUS / "manifest.csv").open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _thread(url: str) -> str:
    m = re.search(r"github\.com/[^/]+/([^/]+)/(?:issues|pull|discussions)/(\d+)", url)
    assert m, url
    return f"*/{m[1].lower()}#{m[2]}"


def test_corpus_shape_as_the_issue_asks():
    rows = _rows()
    assert len(rows) >= 500
    assert len({r["id"] for r in rows}) == len(rows)
    assert all((REPO_CORPUS / r["file"]).is_file() for r in rows)
    classes = Counter(r["primary_class"] for r in rows)
    assert set(classes) <= {*TAXONOMY, "healthy"}
    assert classes["healthy"] >= 60
    thin = {c for c in TAXONOMY if classes[c] < 10} - {"straggler"}  # real straggler pastes are rare
    assert thin == set(), classes
    projects = {re.split(r"[ (/]", r["project"].strip())[0].lower() for r in rows}
    assert len(projects) >= 30
    assert {r["evidence"] for r in rows} <= {"log", "prose"}


def test_split_is_the_thread_hash_and_a_quarter_is_sealed():
    rows = _rows()
    for r in rows:
        digest = hashlib.sha256((SPLIT_SALT + _thread(r["source_url"])).encode()).hexdigest()
        assert r["split"] == ("sealed" if int(digest[:8], 16) % 4 == 0 else "open"), r["id"]
        assert r["file"] == f"cases/{r['split']}/{r['id']}.log"
    share = sum(r["split"] == "sealed" for r in rows) / len(rows)
    assert 0.2 <= share <= 0.3


@pytest.mark.parametrize("split", ["open", "sealed"])
def test_the_bundled_knowledge_holds_the_committed_floors(split):
    scores = evaluate(read_corpus(REPO_CORPUS, split), jobs=2, split=split)
    assert below_floors(scores, read_floors(REPO_CORPUS / "floors.yaml", split)) == []


def test_floors_file_names_both_splits():
    floors = yaml.safe_load((REPO_CORPUS / "floors.yaml").read_text())
    assert set(floors) >= {"open", "sealed"} and all("top1" in floors[s] for s in ("open", "sealed"))


# --- the 30 seed excerpts in ../shared (reserved threads: never copied into the repository) ----------------


@pytest.fixture(scope="module")
def seed():
    if not CORPUS.is_dir():
        pytest.skip("the public-issues corpus (../shared) is not beside this checkout")
    return evaluate(read_corpus(CORPUS), jobs=2)


@pytest.fixture
def by_id(seed):
    return {o.id: o for o in seed.outcomes}


def test_seed_top1_and_no_false_alarm(seed):
    assert len(seed.outcomes) >= 30
    assert seed.top1 >= 0.85
    assert seed.healthy_alarmed == 0


@pytest.mark.parametrize(
    ("case", "cls", "line"),
    [
        ("074", "cuda_oom", 10),  # the torch.OutOfMemoryError line with the numbers
        ("002", "cuda_oom", 23),  # the innermost RayTaskError(OutOfMemoryError), from the worker's task
        ("009", "host_oom", 1),  # Ray's memory monitor kill
        ("065", "kv_cache_insufficient", 7),  # vLLM: max seq len larger than the KV cache
        ("026", "weight_key_mismatch", 10),  # KeyError on a PEFT base_layer name in vLLM's load_weights
        ("028", "shape_mismatch", 1),  # the first size mismatch line
        ("072", "nccl_error", 9),  # NCCL WARN Cuda failure 1 'invalid argument'
        ("037", "env_version_mismatch", 5),  # ModuleNotFoundError, not the later 'not supported' surface error
        ("041", "config_error", 1),  # Hydra: Could not override
        ("053", "disk_or_io", 1),  # raylet: /tmp/ray over 95% full, before the worker died (Errno 28 at 8)
    ],
)
def test_seed_case_class_and_evidence_line(by_id, case, cls, line):
    outcome = by_id[case]
    assert outcome.got == cls
    assert outcome.evidence.split("  ", 1)[0].endswith(f":{line}"), outcome


def test_seed_consequence_classes_are_named_through_their_cause(by_id):
    # the worker death in 053 is a consequence of the full disk; the evaluation table keeps it off the top
    assert by_id["053"].rule == "ray-disk-full"
    # 012: two ranks time out at one SeqNum in different collectives (BROADCAST vs ALLREDUCE)
    assert by_id["012"].got == "collective_mismatch"
