"""Slurm's compressed host lists (``node[01-04]``, ``a1,b[2-3]``): what a batch script reads in
SLURM_JOB_NODELIST and expands with ``scontrol show hostnames``.

The order is kept (the gang's rank order: the first name is rank 0's node, where MASTER_ADDR
points), so only neighbours in that order with one prefix, one digit width and consecutive numbers
share a bracket; expanding the result gives back the names, in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_RANGED = re.compile(r"^(?P<pre>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<post>.*)$")


def compress(names: Iterable[str]) -> str:
    """Names -> Slurm's compressed form, order kept: ["n01", "n02", "n04"] -> "n[01-02,04]"."""
    groups: list[tuple[str, int, list[tuple[int, int]]]] = []  # (prefix, width, [(low, high)]); width -1: no number
    for name in names:
        match = _NUMBERED.match(name)
        if match is None or "[" in name or "," in name:
            groups.append((name, -1, []))
            continue
        prefix, digits = match.group(1), match.group(2)
        width, number = len(digits), int(digits)
        if groups and groups[-1][0] == prefix and groups[-1][1] == width:
            ranges = groups[-1][2]
            if ranges[-1][1] + 1 == number:
                ranges[-1] = (ranges[-1][0], number)
            else:
                ranges.append((number, number))
            continue
        groups.append((prefix, width, [(number, number)]))
    out: list[str] = []
    for prefix, width, ranges in groups:
        if width < 0:
            out.append(prefix)
            continue
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            out.append(f"{prefix}{ranges[0][0]:0{width}d}")
            continue
        parts = [f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in ranges]
        out.append(f"{prefix}[{','.join(parts)}]")
    return ",".join(out)


def expand(text: str) -> list[str]:
    """Slurm's compressed form -> the names, in order: "a1,b[2-3]" -> ["a1", "b2", "b3"]."""
    items: list[str] = []
    depth, current = 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    items.append(current)
    return [name for item in items if item for name in _expand_one(item)]


def _expand_one(item: str) -> Sequence[str]:
    match = _RANGED.match(item)
    if match is None:
        return [item]
    names: list[str] = []
    for part in match.group("ranges").split(","):
        low, _, high = part.partition("-")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names.extend(_expand_one(f"{match.group('pre')}{number:0{width}d}{match.group('post')}"))
    return names
