"""Fingerprints: the same bug in different runs gets the same short hash, a new bug a new one.

A fingerprint hashes the root cause's rule id and its first evidence line after normalisation: what
changes from run to run (times, numbers, hex ids, paths, ranks, hosts and IPs, the Ray/torchrun
prefixes of who printed the line) is replaced by a placeholder, and what names the bug (exception
types, messages, operation names, exit codes, errnos, Xid and signal numbers) is kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from forensics.line_prefixes import ANSI, RAY_PREFIX, RAY_SYSTEM_PREFIX, TORCHRUN_PREFIX
from forensics.model import Analysis
from forensics.redact import redact

SIGNATURE_CAP = 400
HASH_CHARS = 12

_ANSI_REMNANT = re.compile(r"\[\d{1,3}(?:;\d{1,3})*m")  # colour codes whose ESC byte was lost in a copy
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]")
_NCCL_ORIGIN = re.compile(r"^[^:\s]+:\d+:\d+ (?:\[\d+\] )?(?=.*NCCL)")
_TIMESTAMPS = [
    # 2026-11-30 05:12:58,559 · 2026-11-30T05:12:58.123456+00:00 · 2024/01/31 10:00:00
    re.compile(r"\d{4}[-/]\d\d[-/]\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"),
    # glog / c10: E0816 01:45:40.183009389 (the level letter is kept)
    re.compile(r"(?<=\b[IWEF])\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?"),
    # vLLM: ERROR 10-25 00:26:24
    re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"),
    # Mon Nov 30 05:12:58 2026
    re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?: \d{4})?"),
    re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"),
]
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9a-fA-F]{1,4}:){2,7}[0-9a-fA-F]{1,4}(?![\w:])|\[::1?\](?::\d+)?")
_PATH = re.compile(r"(?<![\w.~/-])(?:~|\.{1,2})?(?:/[\w.@+~-]+)+/(?=[\w.@+~-])")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b|\b[0-9a-fA-F]{24,}\b")
_PCI = re.compile(r"\(PCI:[0-9a-fA-F:.]+\)")
# Numbers that name the failure stay: exit codes, errno, signals, Xid.
_KEPT_CODE = (
    r"(?i:exit\s?code|error\s?code|return\s?code|errno|signal)[\s:=\[(]{0,5}-?\d+"
    r"|Xid(?: \(PCI:<pci>\))?:? *\d+"
)
_NUMBER = re.compile(rf"(?P<keep>\b(?:{_KEPT_CODE}))|(?P<num>[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_SPACES = re.compile(r"\s+")


def _strip_origin(line: str) -> str:
    """Drop who printed the line (Ray actor prefix, torchrun rank prefix, NCCL host:pid:tid)."""
    line = _ANSI_REMNANT.sub("", ANSI.sub("", line)).strip()
    for prefix in (RAY_PREFIX, RAY_SYSTEM_PREFIX, TORCHRUN_PREFIX):
        line = prefix.sub("", line, count=1)
    line = _NCCL_ORIGIN.sub("<host>:<n>:<n> ", line, count=1)
    return _REPEATED.sub("", line)


def _number(match: re.Match[str]) -> str:
    return match["keep"] or "<n>"


def normalise(line: str, hosts: Iterable[str] = ()) -> str:
    """The line with everything that differs between runs of the same bug replaced by placeholders."""
    text = _strip_origin(redact(line))
    for host in sorted({h for h in hosts if h and len(h) > 1}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<host>", text)
    for ts in _TIMESTAMPS:
        text = ts.sub("<ts>", text)
    text = _PCI.sub("(PCI:<pci>)", text)
    text = _IPV4.sub("<ip>", text)
    text = _IPV6.sub("<ip>", text)
    text = _PATH.sub("<path>/", text)
    text = _UUID.sub("<hex>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub(_number, text)
    return _SPACES.sub(" ", text).strip()[:SIGNATURE_CAP]


def fingerprint(rule: str, evidence: str, hosts: Iterable[str] = ()) -> tuple[str, str]:
    """(hash, signature) for a root cause: the signature is the normalised line the hash is over."""
    signature = normalise(evidence, hosts)
    digest = hashlib.sha1(f"{rule}\n{signature}".encode(), usedforsecurity=False).hexdigest()[:HASH_CHARS]
    return digest, signature


def run_hosts(a: Analysis) -> list[str]:
    """Every host named in a run's events and findings."""
    seen = set(a.events.get_column("host").drop_nulls().unique().to_list())
    return sorted(seen | {f.host for f in a.findings if f.host})


def root_fingerprint(a: Analysis) -> tuple[str, str] | tuple[None, None]:
    """The fingerprint of a run's root cause (rule and first evidence line), or (None, None) for a healthy run."""
    root = a.verdict.root_cause
    if root is None:
        return None, None
    evidence = root.evidence[0].text if root.evidence else root.title
    return fingerprint(root.rule, evidence, run_hosts(a))
