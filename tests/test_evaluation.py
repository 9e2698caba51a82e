"""`forensics eval`: scores, confusion, rank accuracy, JSON and floors on a small corpus written here."""

from __future__ import annotations

import csv
import json

from click.testing import CliRunner

from forensics.cli import main
from forensics.evaluation import evaluate, read_corpus
from tests.hostile import OOM_LINE

CASES = {
    # id: (label, faulty rank, lines)
    "1": ("cuda_oom", "1", [f"[rank1]: {OOM_LINE}"]),
    "2": ("healthy", "", ["step:1 - actor/pg_loss:0.1 - critic/score/mean:0.2", "step:2 - actor/pg_loss:0.1"]),
    "3": ("nccl_timeout", "", ["[rank0]: TypeError: 'NoneType' object is not callable"]),
    "4": ("ray_actor_or_node_died", "", [
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        "\tclass_name: WorkerDict",
        "\tactor_id: 3ca6c7e6f2d87e2d4b3d3e2a01000000",
        "\tpid: 4242",
        "\tname: abc_WorkerDict_0:0",
        "\tnamespace: 1d3f",
        "\tip: 10.0.0.2",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file.",
    ]),
}  # fmt: skip


def _corpus(tmp_path, cases=CASES):
    folder = tmp_path / "incidents"
    (folder / "cases").mkdir(parents=True)
    with (folder / "manifest.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "file", "primary_class", "faulty_rank", "split"])
        for case_id, (label, rank, lines) in cases.items():
            (folder / "cases" / f"{case_id}.log").write_text("\n".join(lines) + "\n")
            writer.writerow([case_id, f"cases/{case_id}.log", label, rank, "sealed" if case_id == "4" else "open"])
    return folder


def test_scores_per_class_confusion_and_rank(tmp_path):
    scores = evaluate(read_corpus(_corpus(tmp_path)), jobs=1)
    got = {o.id: (o.got, o.ok) for o in scores.outcomes}
    assert got == {
        "1": ("cuda_oom", True),
        "2": ("healthy", True),
        "3": ("unknown_crash", False),
        "4": ("ray_actor_died", True),
    }
    assert scores.top1 == 0.75
    assert scores.rank_accuracy == (1, 1)
    assert scores.per_class["nccl_timeout"] == {"n": 1, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert scores.per_class["ray_actor_or_node_died"]["f1"] == 1.0
    assert scores.confusion["nccl_timeout"] == {"unknown_crash": 1}
    assert scores.macro_f1 == 0.75
    (miss,) = scores.misses
    assert miss.evidence.startswith("3.log:1  ") and "TypeError" in miss.evidence


def test_a_wrongly_named_cause_counts_against_the_named_verdicts_and_unknown_does_not(tmp_path):
    wrong = {**CASES, "5": ("config_error", "", [f"[rank0]: {OOM_LINE}"])}  # an OOM line labelled otherwise
    scores = evaluate(read_corpus(_corpus(tmp_path, wrong)), jobs=1)
    assert {o.id for o in scores.outcomes if o.names_a_cause} == {"1", "4", "5"}  # 3: unknown_crash, 2: healthy
    assert scores.named_cause() == (2, 3)
    high, low = scores.named_cause(confident=True), scores.named_cause(confident=False)
    assert (high[0] + low[0], high[1] + low[1]) == (2, 3)
    oom = next(o for o in scores.outcomes if o.id == "5")
    assert oom.got == "cuda_oom" and oom.confidence is not None and oom.confidence >= 0.8
    doc = scores.to_json()
    assert doc["named_cause"]["all"] == {"right": 2, "named": 3}
    assert doc["outcomes"][0]["confidence"] == oom.confidence or doc["outcomes"][0]["id"] != "5"


def test_cli_json_split_and_floors(tmp_path):
    folder = _corpus(tmp_path)
    floors = tmp_path / "floors.yaml"
    floors.write_text("open: {top1: 0.9}\nsealed: {top1: 0.5}\n")
    runner = CliRunner()
    result = runner.invoke(main, ["eval", str(folder), "--split", "open", "--json", "-", "--floors", str(floors)])
    assert result.exit_code == 1  # 2 of 3 open cases right: below the 0.9 floor
    doc = json.loads(result.stdout)
    assert doc["schema"] == "forensics.eval/v1" and doc["split"] == "open" and doc["cases"] == 3
    assert "below the floors: top-1 0.667 < 0.900" in result.stderr
    result = runner.invoke(main, ["eval", str(folder), "--split", "sealed", "--floors", str(floors)])
    assert result.exit_code == 0, result.output
    assert "1 cases (split sealed): top-1 1.000" in result.output


def test_cli_refuses_a_folder_without_manifest(tmp_path):
    result = CliRunner().invoke(main, ["eval", str(tmp_path)])
    assert result.exit_code == 2 and "manifest.csv" in result.output
