"""The contract: every JSON forensics writes (analyze, check, batch, diff, eval) fits its schema in `schemas/`.

The inputs are the real captures under tests/fixtures (every run, trace and diff fixture), the bundled
example, the public corpus's open cases, and the trust cases (an empty folder, a folder of documentation).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from forensics.cli import main
from tests.conftest import REPO
from tests.schemas import BY_NAME, _schemas, validate

FIXTURES = REPO / "tests" / "fixtures"
RUN_FOLDERS = sorted(p for p in (FIXTURES / "runs").iterdir() if p.is_dir())
TRACE_FOLDERS = sorted(p for p in (FIXTURES / "traces").iterdir() if p.is_dir())
EXAMPLE = REPO / "examples" / "oom_then_timeout"


def _json_of(*args: str) -> dict:
    result = CliRunner().invoke(main, [*args, "--json", "-"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_the_schema_files_are_valid_json_schema_and_name_themselves():
    schemas, _ = _schemas()
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert schema["title"] == name and schema["properties"]["schema"] == {"const": name}
    assert sorted(p.name for p in (REPO / "schemas").glob("*.json")) == sorted(BY_NAME.values())


@pytest.mark.parametrize("run", [*RUN_FOLDERS, *TRACE_FOLDERS, EXAMPLE], ids=lambda p: p.name)
def test_analyze_and_check_json_fit_the_schema(run: Path):
    report = validate(_json_of("analyze", str(run), "--no-html", "-q"))
    check = validate(_json_of("check", str(run)))
    assert check["checks"] == report["checks"], "the same check objects in both documents"
    assert all(c["value"] != "–" for c in check["checks"]), "null, not a dash, for what could not be measured"


def test_inconclusive_documents_fit_the_schema(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    for run in (tmp_path / "empty", docs):
        report = validate(_json_of("analyze", str(run), "--no-html", "-q"))
        assert report["verdict"]["status"] == "inconclusive"
        assert validate(_json_of("check", str(run)))["status"] == "inconclusive"
    diff = validate(_json_of("diff", str(tmp_path / "empty"), str(EXAMPLE), "--no-html", "-q"))
    assert diff["verdict"].endswith("no verdict for A (empty)"), "an empty run is not 'healthy' in a diff either"


def test_a_verdict_that_breaks_the_rules_of_the_schema_is_caught():
    """The schema is not a formality: a healthy verdict with a root cause, or an inconclusive one without its
    reason, does not validate."""
    doc = validate(_json_of("analyze", str(EXAMPLE), "--no-html", "-q"))
    healthy_with_cause = json.loads(json.dumps(doc))
    healthy_with_cause["verdict"]["status"] = "healthy"
    inconclusive_without_reason = json.loads(json.dumps(doc))
    inconclusive_without_reason["verdict"]["status"] = "inconclusive"
    dash = json.loads(json.dumps(doc))
    dash["checks"][0]["value"] = 3
    for broken in (healthy_with_cause, inconclusive_without_reason, dash):
        with pytest.raises(AssertionError, match=r"forensics\.report/v1"):
            validate(broken)


@pytest.mark.parametrize("pair", [("leak_oom", "ray_healthy"), ("ray_memory_monitor", "ray_healthy")])
def test_diff_json_fits_the_schema(pair: tuple[str, str]):
    a, b = (FIXTURES / "diff" / name for name in pair)
    validate(_json_of("diff", str(a), str(b), "--no-html", "-q"))


@pytest.fixture(scope="module")
def fleet_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """Every fixture run and the example as one batch: the JSON, the folder it wrote, the terminal summary."""
    out = tmp_path_factory.mktemp("batch") / "out"
    paths = [str(p) for p in [*RUN_FOLDERS, EXAMPLE]]
    result = CliRunner().invoke(main, ["batch", *paths, "--out", str(out), "--jobs", "2", "--json", "-"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout), result.stderr


def test_batch_json_and_every_run_report_fit_the_schema(fleet_batch):
    out, doc, _ = fleet_batch
    validate(doc)
    assert doc["runs"] == len(doc["rows"]) == len(RUN_FOLDERS) + 1 and not doc["interrupted"]
    hang = next(row for row in doc["rows"] if row["run"].endswith("ray_hang_interrupt"))
    assert (hang["status"], hang["reason"], hang["class"]) == ("inconclusive", "interrupted", None)
    for row in doc["rows"]:
        assert row["status"] != "error", row
        validate(json.loads((out / row["report_json"]).read_text(encoding="utf-8")))


def test_the_batch_summary_says_how_many_more(fleet_batch):
    _, doc, summary = fleet_batch
    groups = {row["fingerprint"] for row in doc["rows"] if row["fingerprint"]}
    assert len(groups) > 5
    assert f"+{len(groups) - 5} more fingerprints (" in summary, summary


def test_eval_json_fits_the_schema(tmp_path: Path):
    """A few open cases of the bundled corpus (healthy, failures, a prose-only label) scored as a corpus."""
    corpus = REPO / "corpus"
    with (corpus / "manifest.csv").open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["split"] == "open"]
    chosen = [r for r in rows if r["id"] in ("0001", "0406", "0370", "0435", "0096")]
    (tmp_path / "cases" / "open").mkdir(parents=True)
    for row in chosen:
        shutil.copy(corpus / row["file"], tmp_path / row["file"])
    with (tmp_path / "manifest.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(chosen)
    result = CliRunner().invoke(main, ["eval", str(tmp_path), "--json", "-", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    doc = validate(json.loads(result.stdout))
    assert doc["cases"] == len(chosen) == 5
