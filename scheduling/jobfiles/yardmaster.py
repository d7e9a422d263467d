"""Yardmaster job files (YAML or JSON): the API's own fields (JobSubmitIn), nothing else."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from scheduling.jobfiles.common import JOB_FIELDS, Errors, Translation


def translate_yardmaster(data: Mapping[str, Any]) -> Translation:
    """The API's own fields; an unknown key is refused (a typo must not fall back to a default silently)."""
    out = Translation(source="yardmaster")
    errors = Errors()
    if data.get("kind", "Job") != "Job":
        errors.add("kind", f"A Yardmaster job file has kind: Job (or none), not {str(data.get('kind'))[:40]!r}")
    for key, value in data.items():
        if key in ("apiVersion", "kind"):
            continue
        if key not in JOB_FIELDS:
            close = difflib.get_close_matches(str(key).replace("-", "_"), JOB_FIELDS, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; the fields are {', '.join(JOB_FIELDS)}"
            errors.add(str(key)[:60], f"Unknown field{hint}")
            continue
        out.set(key, value, key)
    errors.raise_any()
    return out
