"""Sizes as logs print them ("18.55 GiB", "512 MiB", "3.5 GB"), in GiB."""

from __future__ import annotations

import re

GIB_PER_UNIT = {
    "B": 1 / 2**30,
    "KiB": 1 / 2**20,
    "MiB": 1 / 2**10,
    "GiB": 1.0,
    "TiB": 2.0**10,
    "KB": 1e3 / 2**30,
    "MB": 1e6 / 2**30,
    "GB": 1e9 / 2**30,
    "TB": 1e12 / 2**30,
}
SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[KMGT]?i?B)\s*$")


def size_gib(text: object) -> float | None:
    """`text` ("18.55 GiB") in GiB; None when it is not a size."""
    m = SIZE.match(text) if isinstance(text, str) else None
    if m is None or m["unit"] not in GIB_PER_UNIT:
        return None
    return float(m["number"]) * GIB_PER_UNIT[m["unit"]]


def fmt_gib(gib: float) -> str:
    return f"{gib:.2f} GiB"
