"""Secret redaction for everything forensics shows: tokens, keys, passwords in URLs, private keys."""

from __future__ import annotations

import re

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----.*?(?:-----END (?:[A-Z]+ )?PRIVATE KEY-----|$)", re.S),
        "[REDACTED private key]",
    ),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), "[REDACTED hf token]"),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b"), "[REDACTED api key]"),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}\b"), "[REDACTED github token]"),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "[REDACTED aws key id]"),
    (re.compile(r"(?i)(aws_secret_access_key\s*[=:]\s*)['\"]?[A-Za-z0-9/+]{40}['\"]?"), r"\1[REDACTED]"),
    (re.compile(r"(?i)(WANDB_API_KEY\s*[=:]\s*)['\"]?[0-9a-f]{40}['\"]?"), r"\1[REDACTED]"),
    (re.compile(r"(?i)\b(wandb[_ ]?(?:api[_ ]?)?key['\"]?\s*[=:]\s*)['\"]?[0-9a-f]{40}['\"]?"), r"\1[REDACTED]"),
    (re.compile(r"(?i)(authorization:\s*bearer\s+|\bbearer\s+)[A-Za-z0-9._~+/=\-]{16,}"), r"\1[REDACTED]"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)[^@\s/]+@"), r"\1[REDACTED]@"),
    (
        re.compile(r"(?i)\b((?:api[_-]?key|secret|password|passwd|token)['\"]?\s*[=:]\s*['\"]?)[^\s'\",;]{8,}"),
        r"\1[REDACTED]",
    ),
]


def redact(text: str) -> str:
    """`text` with every recognised secret replaced by a marker saying what it was."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
