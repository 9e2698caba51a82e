"""Secret redaction for everything forensics shows: tokens, keys, passwords in URLs, private keys.

Reports are attached to tickets that many people open, and training scripts print their environment,
their config and their command line. Every string of a report goes through `redact` (see
`redact_tree`), so a secret in a log line, a file name, a metric name or a config value is replaced by
a marker that says what it was. Tokens with a recognisable shape are found anywhere; other secrets
only next to a name that says so (`password=`, `--api-key`, `Authorization: Bearer`), so that git
hashes, UUIDs and `max_tokens: 4096` stay readable.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# a cheap test that keeps the full set of patterns off the strings that cannot hold a secret (most of them)
_MAYBE_SECRET = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_|sk-|gh[pousr]_|github_pat_|glpat-|xox[abposr]-|A[KS]IA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA"
    r"|AIza|eyJ|wandb_v1_)"
    r"|(?i:wandb|secret|passw|pwd|token|key|bearer|basic|authoriz|://|PRIVATE KEY|x-amz-|[?&]sig=)"
)

# names in model configs that end like a secret's but hold a vocabulary token, not a credential
_VOCABULARY_TOKENS = ("pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token")
_NOT_A_VALUE = ("null", "none", "true", "false", "[redacted", "${", "<|", "********")

_S = r"(?<![A-Za-z0-9])"  # a token starts after any non-alphanumeric, `_` included (file names: run_hf_…)
_E = r"(?![A-Za-z0-9])"

_SHAPED: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.S,
        ),
        "[REDACTED private key]",
    ),
    (re.compile(_S + r"hf_[A-Za-z0-9]{20,}"), "[REDACTED hf token]"),
    (re.compile(_S + r"sk-(?:proj-|ant-(?:api\d\d-)?|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"), "[REDACTED api key]"),
    (
        re.compile(_S + r"(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"),
        "[REDACTED github token]",
    ),
    (re.compile(_S + r"glpat-[A-Za-z0-9_\-]{20,}"), "[REDACTED gitlab token]"),
    (re.compile(_S + r"xox[abposr]-[A-Za-z0-9\-]{10,}"), "[REDACTED slack token]"),
    (re.compile(_S + r"AIza[0-9A-Za-z_\-]{35}"), "[REDACTED google api key]"),
    (re.compile(_S + r"wandb_v1_[A-Za-z0-9_]{40,}"), "[REDACTED wandb key]"),
    (re.compile(_S + r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}" + _E), "[REDACTED aws key id]"),
    (re.compile(_S + r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), "[REDACTED jwt]"),
]

_NAMED: list[tuple[re.Pattern[str], str]] = [
    # AWS secret keys and W&B keys (40 hex, or local-<40 hex> on W&B Server) after the name that says so
    (re.compile(r"(?i)(aws_?secret_?(?:access_?)?key[\"']?\s*[=:]\s*[\"']?)[A-Za-z0-9/+]{40}"), r"\1[REDACTED]"),
    (
        re.compile(
            r"(?i)((?:wandb_api_key|api[_-]?key|wandb\s+login(?:\s+--[\w-]+)*|wandb\.login\(\s*key|\bkey)"
            r"[\"']?\s*[=:]?\s*[\"']?)(?:local-)?[0-9a-f]{40}\b"
        ),
        r"\1[REDACTED wandb key]",
    ),
    # netrc (where `wandb login` stores its key): `password <secret>` at the start of a line
    (re.compile(r"(?im)^(\s*password\s+)\S+"), r"\1[REDACTED]"),
    (
        re.compile(
            r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token|apikey)\s+)[A-Za-z0-9._~+/\-]{8,}=*"
        ),
        r"\1[REDACTED]",
    ),
    (re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/\-]{16,}=*"), r"\1[REDACTED]"),
    # user:password@ in any URL (also an empty user, as in redis://:password@host)
    (re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s/]+@"), r"\1[REDACTED]@"),
    # signed URLs and tokens in query strings
    (
        re.compile(
            r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|sig|signature|access_token|token"
            r"|api_key|apikey|key)=)[^&\s\"'#]+"
        ),
        r"\1[REDACTED]",
    ),
]

# `name = value`, `name: value` or `--name value`, where the name ends with a word that means a secret; the
# name's start is found by looking back from the word, which keeps the search linear on long runs of letters
_ASSIGNED = re.compile(
    r"(?i)(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key)"
    r"(?P<sep>[\"']?\s*[=:]\s*[\"']?| )(?P<value>[^\s\"',;]{6,})"
)
_FLAG = re.compile(r"--?[A-Za-z0-9]")  # a command-line flag, not a divider of dashes (`-----Inter-token Latency`)
_COUNT = re.compile(r"[0-9][0-9,]*")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _name_before(text: str, end: int) -> str:
    start = end
    while start > 0 and text[start - 1] in _NAME_CHARS:
        start -= 1
    return text[start:end]


def _assigned(m: re.Match[str]) -> str:
    name = _name_before(m.string, m.start()) + m.string[m.start() : m.start("sep")]
    value = m["value"]
    if name.lower().endswith(_VOCABULARY_TOKENS) or value.lower().startswith(_NOT_A_VALUE):
        return m.group(0)
    if m["sep"] == " " and not _FLAG.match(name):
        return m.group(0)  # a bare space separates a secret only from a command-line flag (--token VALUE)
    if m.group(0)[: m.start("sep") - m.start()].lower() == "token" and _COUNT.fullmatch(value):
        return m.group(0)  # a count of tokens (SGLang's `#token: 180776`), not one
    return m.group(0)[: m.start("value") - m.start()] + "[REDACTED]"


def _literals_of(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """A plain alternation of the lower-cased strings one of which is in every text `pattern` matches (see
    prefilter.py): searched in the lower-cased text, it is several times cheaper than the pattern."""
    from forensics.prefilter import required_literals  # here: the scanner's module is not needed at import

    literals = required_literals(pattern.pattern)
    assert literals is not None and literals.icase
    return re.compile("|".join(map(re.escape, sorted(literals.strings))))


_MAYBE_SECRET_LITERALS = _literals_of(_MAYBE_SECRET)


def redact(text: str) -> str:
    """`text` with every recognised secret replaced by a marker saying what it was."""
    if not _MAYBE_SECRET_LITERALS.search(text.lower()) or not _MAYBE_SECRET.search(text):
        return text
    for pattern, replacement in _SHAPED:
        text = pattern.sub(replacement, text)
    for pattern, replacement in _NAMED:
        text = pattern.sub(replacement, text)
    return _ASSIGNED.sub(_assigned, text)


@functools.lru_cache(maxsize=4096)
def _redact_key(key: str) -> str:
    return redact(key)  # the same few keys (path, kind, …) come back in every record


def redact_tree(value: Any) -> Any:
    """A copy of a JSON-like value with every string redacted, dictionary keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    if isinstance(value, dict):
        return {_redact_key(k) if isinstance(k, str) else k: redact_tree(v) for k, v in value.items()}
    return value
