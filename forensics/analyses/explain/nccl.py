"""NCCL and collectives: NCCL's last error read for the network path, and who ran which collective."""

from __future__ import annotations

import re

from forensics.analyses.explain.context import Reading
from forensics.analyses.explain.text import promote
from forensics.model import Finding

NETWORK_TROUBLE = re.compile(
    r"No route to host|Connection refused|connection abort|Connection reset|Connection closed|Network is unreachable|"
    r"timed out|Broken pipe|exceeded (?:error )?retry count|Address family not supported|Cannot assign requested"
)


def explain_nccl_error(finding: Finding, reading: Reading) -> None:
    """Quote NCCL's "Last error" and say when it points at the network path between hosts."""
    last = finding.fields.get("last_error") or finding.fields.get("warn")  # the WARN line is NCCL's error
    if not isinstance(last, str):
        return
    finding.explanation = f"NCCL's last error: {last.strip()}."
    if "no socket interface found" in last:
        finding.explanation += (
            " NCCL found no network interface to use: NCCL_SOCKET_IFNAME names one that does not exist on this host "
            "(compare with `ip addr`), or every interface was excluded."
        )
        finding.remediation = promote(finding.remediation, "NCCL_SOCKET_IFNAME")
    elif NETWORK_TROUBLE.search(last):
        finding.explanation += (
            " A socket connection between ranks failed: usually NCCL picked an interface the peers cannot reach "
            "(docker0, a virtual or IPv6 link-local address) or a firewall blocks it."
        )
        finding.remediation = promote(finding.remediation, "NCCL_SOCKET_IFNAME")


FINGERPRINT = re.compile(
    r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\((?:SequenceNumber=(?P<seq>\d+),? ?)?"
    r"OpType=(?P<op>\w+)(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dtype>\w+))?"
)
LAGGING = re.compile(r"\[(?P<ranks>[\d, ]+)\] (?:are the lagging ranks|joined but didn't finish)")


def _ranks(listed: object) -> list[int]:
    """The ranks of a field that lists them (`7`, `3, 5`, or a list already read), in order."""
    parts = listed if isinstance(listed, list) else str(listed or "").split(",")
    return sorted({int(r) for r in parts if str(r).strip().isdigit()})


def explain_collective_mismatch(finding: Finding, texts: list[str]) -> bool:
    """Who ran what: each rank's own fingerprint (the first one in its report; the peer's as it saw it can be
    garbled), or the lagging ranks of a desync report. `texts` are the lines of every rank's report. True when
    the reports tell the ranks' calls apart (then the finding's rank is theirs to decide)."""
    calls: dict[int, str] = {}
    seq = None
    for text in texts:
        m = FINGERPRINT.search(text)
        if m:
            shape = f" [{m['shape']}]" if m["shape"] is not None else ""
            calls.setdefault(int(m["rank"]), f"{m['op']}{shape}{' ' + m['dtype'] if m['dtype'] else ''}")
            seq = seq or m["seq"]
    if len(set(calls.values())) > 1:
        groups: dict[str, list[int]] = {}
        for rank, call in sorted(calls.items()):
            groups.setdefault(call, []).append(rank)
        at = f" at collective {seq}" if seq else ""
        finding.explanation = f"The ranks disagree{at}: " + "; ".join(f"rank(s) {r} run {c}" for c, r in groups.items())
        odd = [r for r in groups.values() if len(r) == 1]
        if len(groups) == 2 and len(odd) == 1 and len(calls) > 2:
            finding.rank = odd[0][0]
            finding.explanation += f". Rank {finding.rank} is the odd one out."
        else:
            finding.rank = None
            finding.explanation += ". The report cannot tell which side deviated; look at both call sites."
        return True
    lagging = sorted({int(r) for text in texts for m in LAGGING.finditer(text) for r in m["ranks"].split(",")})
    lagging = lagging or _ranks(finding.fields.get("lagging_ranks"))  # read off the report's next lines
    if lagging:
        finding.rank = lagging[0] if len(lagging) == 1 else None
        finding.fields["lagging_ranks"] = lagging
        finding.explanation = f"PyTorch's desync report names rank(s) {lagging} as the ones the others waited for."
        return True
    explain_transfer_mismatch(finding)
    return False


def explain_transfer_mismatch(finding: Finding) -> None:
    """NCCL's transports see a mismatch as the two ends of one transfer disagreeing on its size."""
    local, remote = finding.fields.get("local_size"), finding.fields.get("remote_size")
    peer = finding.fields.get("peer")
    if local is not None and remote is not None and any("gloo/" in e.text for e in finding.evidence):
        finding.explanation = (
            f"Gloo's receiving end of one transfer got {remote} bytes where it had posted a buffer of {local}: the "
            "ranks called collectives of different sizes (or of different types) at this point."
        )
    elif local is not None and remote is not None:
        who = f" (peer {peer})" if peer else ""
        finding.explanation = (
            f"The two ends of one NCCL transfer disagree on its size: this rank posted {local} bytes, the other "
            f"end{who} {remote}. The ranks called collectives of different sizes or types at this point, or run "
            "with different NCCL settings (NCCL_PROTO, NCCL_ALGO, versions); rarely the transport itself "
            "corrupted the message (try NCCL_IB_DISABLE=1 to tell)."
        )
    elif finding.fields.get("around_rank") is not None:
        finding.explanation = (
            f"NCCL saw ranks call different collectives (or the same one with different counts or types) at and "
            f"around rank {finding.fields['around_rank']}; NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=COLL logs each "
            "rank's calls, so the first one that differs can be found."
        )
    elif finding.fields.get("operation"):
        finding.explanation = (
            f"{finding.fields['operation']} got tensors of different shapes from the processes: each rank must "
            "pass the same shape (pad variable-length batches to a common length first)."
        )


def explain_barrier_timeout(finding: Finding, reading: Reading) -> None:
    """A monitored barrier names the rank it waited for: that rank, not the one printing, is where to look."""
    faulty = finding.fields.get("faulty_rank")
    lagging = _ranks(finding.fields.get("lagging_ranks"))
    if faulty is not None:
        finding.rank = int(faulty)
        finding.explanation = (
            f"The monitored barrier waited in vain for rank {finding.rank}: the other ranks were ready. Rank "
            f"{finding.rank}'s own log says why it did not arrive (it hung, crashed or was killed)."
        )
    elif lagging:
        finding.rank = lagging[0] if len(lagging) == 1 else None
        finding.fields["lagging_ranks"] = lagging
        finding.explanation = (
            f"Rank(s) {lagging} did not reach the monitored barrier in time while the others waited: their own "
            "logs say why (a hang, a crash, a kill)."
        )
