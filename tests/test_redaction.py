"""Secrets are redacted in every output (HTML, JSON, Markdown, terminal), wherever they sit in the run.

The tokens below are made up in the shape of the real ones (AWS's are its documented examples).
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from forensics.cli import main
from forensics.pipeline import analyze
from forensics.redact import redact
from forensics.report.figures import figures
from forensics.report.html import render_html
from forensics.report.json_report import dumps, to_json_dict
from forensics.report.markdown import render_markdown
from tests.conftest import REPO

HF = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
OPENAI = "sk-proj-Q2x9TbZ7kLmN3pR8sVwY1aCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGHij"
ANTHROPIC = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-AbCdEfGhIjKlMnOpQrSt_uvwxyzAA"
WANDB_OLD = "4f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6"
WANDB_NEW = "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"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
GITHUB_PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
BEARER = "ya29.a0AfH6SMBx3Kq9ZpLmN0vR7tYw2eXc4dF6gH8jK1lM3nB5vC7xZ"
PASSWORD = "S3cr3t-Passw0rd!"
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDhJ7yX2m9VwYkQyJZl5y1Gk0v8m2J3n5k1L0m9Qw3v8AAAAJhX3X1RV919\n"
    "-----END OPENSSH PRIVATE KEY-----"
)

# (real-looking line, the secret it holds, what must still be readable)
CASES = [
    (f"export HF_TOKEN={HF}", HF, "export HF_TOKEN="),
    (f"(TaskRunner pid=2211) huggingface-cli login --token {HF} --add-to-git-credential", HF, "--add-to-git"),
    (f"OPENAI_API_KEY={OPENAI} python reward_server.py", OPENAI, "python reward_server.py"),
    (f"reward_model.api_key: {ANTHROPIC}", ANTHROPIC, "reward_model.api_key"),
    (f"WANDB_API_KEY={WANDB_OLD}", WANDB_OLD, "WANDB_API_KEY="),
    (f'export WANDB_API_KEY="{WANDB_NEW}"', WANDB_NEW, "export WANDB_API_KEY="),
    (f"+ wandb login {WANDB_OLD}", WANDB_OLD, "wandb login"),
    (f'wandb.login(key="{WANDB_OLD}")', WANDB_OLD, "wandb.login(key="),
    (f"  password {WANDB_OLD}", WANDB_OLD, "password"),
    (f"AWS_ACCESS_KEY_ID={AWS_ID} AWS_SECRET_ACCESS_KEY={AWS_SECRET} aws s3 cp ckpt/ s3://b/", AWS_ID, "aws s3 cp"),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws_secret_access_key = "),
    (f"git clone https://{GITHUB}@github.com/volcengine/verl.git", GITHUB, "github.com/volcengine/verl.git"),
    (f"GH_TOKEN={GITHUB_PAT} gh release download", GITHUB_PAT, "gh release download"),
    (f'curl -H "Authorization: Bearer {JWT}" http://10.0.0.7:8000/v1/models', JWT, "http://10.0.0.7:8000/v1/models"),
    (f"headers={{'Authorization': 'Bearer {BEARER}'}}", BEARER, "Authorization"),
    (f"redis.exceptions.ConnectionError: redis://:{PASSWORD}@10.0.0.5:6379/0", PASSWORD, "@10.0.0.5:6379/0"),
    (f"MLFLOW_TRACKING_URI=https://trainer:{PASSWORD}@mlflow.internal:5000", PASSWORD, "@mlflow.internal:5000"),
    (f"sqlalchemy.url = postgresql://runs:{PASSWORD}@db:5432/runs", PASSWORD, "postgresql://runs:"),
    (f"python train.py --db-password {PASSWORD} --epochs 3", PASSWORD, "--epochs 3"),
    (f'{{"client_secret": "{PASSWORD}", "project": "rl"}}', PASSWORD, '"project": "rl"'),
    (f"DB_PASSWORD={PASSWORD}", PASSWORD, "DB_PASSWORD="),
    ("password: 20250314", "20250314", "password: "),  # a number is a count after "token" only
    (f"https://bucket.s3.amazonaws.com/ckpt.pt?X-Amz-Signature={'ab12' * 16}&X-Amz-Expires=3600", "ab12" * 16, "3600"),
    (PRIVATE_KEY, "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ", ""),
    ("-----BEGIN RSA PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----", ""),
]

# lines that look a little like secrets and must come out unchanged
UNCHANGED = [
    "step:12 - actor/pg_loss:-0.0036 - response_length/max_tokens:2048 - perf/total_num_tokens:123456789",
    "actor_rollout_ref.model.tokenizer_path: /models/Qwen2.5-7B-Instruct",
    "pad_token: <|endoftext|>",
    "eos_token: <|im_end|>",
    "verl version 0.4.1 (commit 9b2f1c0e4d3a5b6c7d8e9f0a1b2c3d4e5f6a7b8c)",
    "node-0:4000:4100 [0] NCCL INFO comm 0x55d5c0a1b2c0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0",
    "Dashboard at http://10.0.0.1:8265/api/jobs/ and ray://head-node:10001",
    "Token is valid (permission: write).",
    "use_token_level_loss=True kl_ctrl.kl_coef=0.001 secret_name=my-k8s-secret",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.55 GiB. GPU 1 has a total capacity",
    "task-0123456789abcdefghijklmnopqrstuvwxyz finished; disk-abcdefghijklmnopqrstuvwxyz0123 mounted",
    "worker_id=0b1f2e3d4c5b6a79 node_id=5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b",
    # real serving logs: SGLang's scheduler line (a count of tokens) and vLLM's benchmark table heading
    "[2025-03-14 02:16:14 TP0] Decode batch. #running-req: 509, #token: 180776, token usage: 0.43, "
    "gen throughput (token/s): 7897.87, largest-len: 0, #queue-req: 0, ",
    "---------------Inter-token Latency----------------",
]


@pytest.mark.parametrize(("line", "secret", "kept"), CASES, ids=[c[0][:40] for c in CASES])
def test_each_kind_of_secret_is_redacted_and_the_rest_of_the_line_kept(line, secret, kept):
    out = redact(line)
    assert secret not in out
    assert "[REDACTED" in out
    assert kept in out
    assert redact(out) == out  # idempotent: a report redacted twice reads the same


@pytest.mark.parametrize("line", UNCHANGED)
def test_lines_without_secrets_are_left_alone(line):
    assert redact(line) == line


SECRET_TOKENS = [HF, OPENAI, WANDB_OLD, AWS_ID, GITHUB, JWT, PASSWORD]


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """The bundled example, with secrets in its OOM lines, a metric name, file names and a URL."""
    run = tmp_path_factory.mktemp("secret") / "oom_then_timeout"
    shutil.copytree(REPO / "examples" / "oom_then_timeout", run)
    leaky = (
        f"HF_TOKEN={HF} WANDB_API_KEY={WANDB_OLD} Authorization: Bearer {JWT} redis://:{PASSWORD}@10.0.0.5:6379 "
        f"{AWS_ID} torch.OutOfMemoryError"
    )
    for log in [run / "driver.log", *run.glob("torchrun_logs/*/attempt_0/1/stderr.log")]:
        text = log.read_text(encoding="utf-8")
        oom = next(line for line in text.splitlines() if "torch.OutOfMemoryError" in line)
        log.write_text(text.replace(oom, oom.replace("torch.OutOfMemoryError", leaky), 1))
        log.rename(log.with_name(f"{log.stem}_{GITHUB}.log"))
    (run / "tail.log").write_text(f"step:11 - {OPENAI}:0.5\n")  # a metric named like a key, at a logged step
    return run


def _outputs(run, tmp_path, *flags: str) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    args = ["analyze", str(run), "-o", str(out / "r.html"), "--json", str(out / "r.json"), "--md", str(out / "r.md")]
    result = CliRunner().invoke(main, [*args, *flags])
    assert result.exit_code == 0, result.output
    return {
        "terminal": result.output,
        **{name: (out / f"r.{name}").read_text(encoding="utf-8") for name in ("html", "json", "md")},
    }


def test_no_secret_reaches_any_output(planted_run, tmp_path):
    outputs = _outputs(planted_run, tmp_path)
    for name, text in outputs.items():
        for secret in SECRET_TOKENS:
            assert secret not in text, (name, secret)
    doc = json.loads(outputs["json"])
    evidence = doc["verdict"]["root_cause"]["evidence"][0]
    assert evidence["file"].endswith("_[REDACTED github token].log")
    assert evidence["text"].startswith(
        "HF_TOKEN=[REDACTED hf token] WANDB_API_KEY=[REDACTED wandb key] Authorization: Bearer [REDACTED jwt] "
        "redis://:[REDACTED]@10.0.0.5:6379 [REDACTED aws key id] torch.OutOfMemoryError"
    )
    assert "[REDACTED api key]" in doc["metrics"]
    assert "driver_[REDACTED github token].log" in outputs["html"]
    assert "HF_TOKEN=[REDACTED hf token]" in outputs["md"]
    assert "HF_TOKEN=[REDACTED hf token]" in " ".join(outputs["terminal"].split())


def test_plot_data_is_redacted_too(planted_run):
    """The timeline's hover text names evidence files; the figure JSON in the page is redacted like the page."""
    a = analyze([planted_run])
    hover = [str(t) for _, fig in figures(a) for trace in fig.data for t in (trace.text or ())]
    assert any(GITHUB in t for t in hover)  # the figure as built holds the secret...
    page = render_html(a)
    assert GITHUB not in page  # ...the page does not
    figure_data = page.split('id="figure-data">', 1)[1].split("</script>", 1)[0]
    assert "_[REDACTED github token].log" in figure_data


def test_config_values_and_keys_are_redacted(planted_run):
    a = analyze([planted_run])
    a.config = {"trainer.logger_api_key": WANDB_NEW, f"env.{AWS_ID}": "set", "data.url": f"s3://x:{PASSWORD}@b/d"}
    a.environment = {"HF_TOKEN": HF}
    outputs = [render_html(a), dumps(a), render_markdown(to_json_dict(a))]
    for text in outputs:
        for secret in (WANDB_NEW, AWS_ID, PASSWORD, HF):
            assert secret not in text
    assert to_json_dict(a)["environment"] == {"HF_TOKEN": "[REDACTED hf token]"}


def test_no_redact_shows_the_secrets(planted_run, tmp_path):
    outputs = _outputs(planted_run, tmp_path, "--no-redact")
    doc = json.loads(outputs["json"])
    assert all(secret in doc["verdict"]["root_cause"]["evidence"][0]["text"] for secret in (WANDB_OLD, PASSWORD))
    assert HF in outputs["terminal"].replace("\n", "")
    assert OPENAI in doc["metrics"]
    assert GITHUB in outputs["html"]
