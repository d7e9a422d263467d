"""Slurm's --array text, ``0-999%50``, as the indices of a job array and its limit on tasks running at once.

Pure (no Django): the sbatch translator, the API's serializer and the array service all read it here. As
sbatch takes it: a comma-separated list of ``N``, ``N-M`` and ``N-M:S`` (in brackets or not), then
optionally ``%L``, the most tasks of the array running at once. Indices run from 0 to ``max_size - 1``
(Slurm's MaxArraySize), so an array never has more than ``max_size`` tasks. A repeated index is one
task, as in Slurm's bitmap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

_PIECE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_LIMIT = re.compile(r"[0-9]+")


class ArraySpecError(ValueError):
    """The text is not an array sbatch would take; the message says what to change."""


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # sorted, distinct
    max_running: int | None  # %L; None: no limit
    text: str  # normalised: "0-999:2%50"

    @property
    def count(self) -> int:
        return len(self.indices)

    @cached_property
    def step(self) -> int:
        """Slurm's SLURM_ARRAY_TASK_STEP: the one gap between indices when they are evenly spaced, else 1."""
        gaps = {b - a for a, b in pairwise(self.indices)}
        return gaps.pop() if len(gaps) == 1 else 1

    def env(self, *, array_id: int, index: int) -> dict[str, str]:
        """The variables one task runs with (Slurm's SLURM_ARRAY_*, under Yardmaster's names)."""
        return {
            "YARD_ARRAY_JOB_ID": str(array_id),
            "YARD_ARRAY_TASK_ID": str(index),
            "YARD_ARRAY_TASK_COUNT": str(self.count),
            "YARD_ARRAY_TASK_MIN": str(self.indices[0]),
            "YARD_ARRAY_TASK_MAX": str(self.indices[-1]),
            "YARD_ARRAY_TASK_STEP": str(self.step),
        }


def parse_array(text: str, *, max_size: int) -> ArraySpec:
    """``text`` as sbatch's --array takes it; raises ArraySpecError saying what to change."""
    if not isinstance(text, str) or not text.strip():
        raise ArraySpecError("Give the array's indices, e.g. 0-999, 1,3,5-7 or 0-99:2, and optionally %N: at most N run at once")
    raw = text.strip()
    if len(raw) > 1000:
        raise ArraySpecError("At most 1000 characters: give ranges (0-999) rather than every index")
    body, percent, limit_text = raw.partition("%")
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]  # "[0-4]%2", as scripts write it and sbatch takes it
    max_running: int | None = None
    if percent:
        if not _LIMIT.fullmatch(limit_text):
            raise ArraySpecError(f"%{limit_text}: after % give how many tasks may run at once, a whole number, e.g. 0-999%50")
        max_running = int(limit_text)
        if max_running < 1:
            raise ArraySpecError("%0 would run no task: give at least %1, or leave the % out for no limit")
    indices: set[int] = set()
    pieces: list[str] = []
    for piece in body.split(","):
        match = _PIECE.fullmatch(piece.strip())
        if match is None:
            raise ArraySpecError(
                f"{piece.strip() or '(empty)'!r} is not an index or a range: give N, N-M or N-M:STEP, "
                "separated by commas (e.g. 0-15 or 1,3,5-7)"
            )
        first, last_text, step_text = match.groups()
        start = int(first)
        end = int(last_text) if last_text is not None else start
        step = int(step_text) if step_text is not None else 1
        if end < start:
            raise ArraySpecError(f"{piece.strip()}: a range runs upwards: give {end}-{start}")
        if step < 1:
            raise ArraySpecError(f"{piece.strip()}: the step after : is at least 1")
        if end >= max_size:
            raise ArraySpecError(
                f"{piece.strip()}: indices here run from 0 to {max_size - 1} (the cluster's maximum array size, "
                f"YARD_MAX_ARRAY_SIZE, is {max_size}): split the array, or use a step"
            )
        indices.update(range(start, end + 1, step))
        if last_text is None:
            pieces.append(str(start))
        else:
            pieces.append(f"{start}-{end}" + (f":{step}" if step != 1 else ""))
    ordered = tuple(sorted(indices))
    normal = ",".join(pieces) + (f"%{max_running}" if max_running is not None else "")
    return ArraySpec(indices=ordered, max_running=max_running, text=normal)
