"""The bundled example: a real 2xH200 run where rank 1 ran out of memory and rank 0 then timed out.

torchrun's own summary names rank 0 as the first failure; forensics must name rank 1's OOM.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from forensics.cli import main
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "oom_then_timeout"


def test_example_names_the_oom_on_rank_1_not_torchruns_rank_0(tmp_path):
    html = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLE), "-o", str(html), "--json", "-", "-q"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    root = doc["verdict"]["root_cause"]
    # the capture injects the OOM at step 12 on rank 1 (scripts/capture/train.py); rank 0's "step:11" line comes
    # after it in driver.log only because both ranks share the tee. The OOM's time is read from the stamped line
    # above it in rank 1's own log, so that log is the first evidence.
    assert (root["class"], root["rule"], root["rank"], root["step"]) == ("cuda_oom", "cuda-oom", 1, 12)
    first = {k: root["evidence"][0][k] for k in ("file", "line")}
    assert first == {"file": "torchrun_logs/none_2ia4957z/attempt_0/1/stderr.log", "line": 6}
    assert {"file": "driver.log", "line": 189} in [{k: e[k] for k in ("file", "line")} for e in root["evidence"]]
    assert root["evidence"][0]["text"].startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.55 GiB"
    )
    assert "names rank 0" in root["explanation"]
    symptoms = {s["class"]: s["ranks"] for s in doc["verdict"]["symptoms"]}
    assert symptoms["nccl_timeout"] == [0]
    torchrun = [f for f in doc["findings"] if f["rule"] == "nccl-watchdog-timeout"]
    assert torchrun and all(f["rank"] == 0 for f in torchrun)
    page = html.read_text(encoding="utf-8")
    assert "Root cause: CUDA out of memory on rank 1" in page
    assert "driver.log:189" in page
    assert 'id="plot-metric-actor-pg-loss"' in page and 'id="plot-metric-gpu-memory-used-mib"' in page
    # the OOM's own numbers and the memory it is about lead the plots
    assert page.index('id="plot-metric-perf-max-memory-allocated-gb" data-metric') < page.index('id="plot-timeline"')


def test_report_is_not_written_inside_the_run_folder():
    result = CliRunner().invoke(main, ["analyze", str(EXAMPLE), "-o", str(EXAMPLE / "r.html"), "-q"])
    assert result.exit_code == 2
    assert "inside the run folder" in result.output
    assert not (EXAMPLE / "r.html").exists()


def test_fail_on_gates_ci(tmp_path):
    args = ["analyze", str(EXAMPLE), "--no-html", "-q", "--fail-on"]
    assert CliRunner().invoke(main, [*args, "critical"]).exit_code == 1
    assert (
        CliRunner()
        .invoke(main, ["analyze", str(REPO / "tests/fixtures/runs/healthy"), "--no-html", "-q", "--fail-on", "warning"])
        .exit_code
        == 0
    )
