"""GPU and CUDA errors: what an Xid code means, and what kind of kernel failure a CUDA error is."""

from __future__ import annotations

from forensics.analyses.explain.context import Reading
from forensics.model import Finding

# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (names as dcgm-exporter prints them)
XID_MEANING = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    144: "NVLINK SAW Error",
    145: "NVLINK RLW Error",
    149: "NVLINK NETIR Error",
    154: "GPU Recovery Action Changed",
}


def explain_xid(finding: Finding, reading: Reading) -> None:
    code = finding.fields.get("xid")
    if code is not None and str(code).isdigit():
        meaning = XID_MEANING.get(int(code))
        if meaning:
            finding.fields["xid_meaning"] = meaning
            finding.explanation = f"Xid {code}: {meaning}."


def explain_cuda_error(finding: Finding, reading: Reading) -> None:
    """What kind of kernel failure: an out-of-range index (data) or a bad memory access (kernel)."""
    if finding.explanation:  # an Xid told it already
        return
    assertion = finding.fields.get("assertion")
    error = str(finding.fields.get("cuda_error", ""))
    if assertion or "device-side assert" in error:
        shown = f" (`{assertion}`)" if assertion else ""
        finding.explanation = (
            f"A GPU kernel's bounds check failed{shown}: an index was out of range - most often a token id at or "
            "above the embedding's vocabulary size (tokenizer and model config disagree, special tokens added "
            "without resizing the embedding) or a label outside the classes."
        )
    elif "illegal memory access" in error or "illegal instruction" in error or "misaligned" in error:
        finding.explanation = (
            "A kernel touched memory it does not own: a bug in a custom or fused kernel (attention backend, "
            "speculative decoding, a quantised GEMM) or corrupted state; every later CUDA call in the process fails."
        )
