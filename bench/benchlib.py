"""What every bench shares: which checkout's code it measures, and how it reports a figure.

A bench measures the code of ``BENCH_CODE`` (another checkout, or `git archive` of a named commit) when
that is set, else this checkout's. The bench script itself is always this checkout's, so the same
measurement runs over the old code and the new: bench/compare.py runs each bench both ways in one
sitting and prints the ratios (`make bench`).

Each figure is printed as one ``RESULT {json}`` line beside the bench's human-readable output:

    result("heartbeat.cpu_ms_with_samples", 4.1, "ms", better="lower", over="in-process, 1,000-node state")
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("BENCH_CODE") or HERE).resolve()


def use_code() -> Path:
    """Import the measured checkout's packages first, and run from inside it: the project is installed
    editable into the virtual environment, whose finder otherwise hands out this checkout's packages
    even with another one first on sys.path."""
    sys.path.insert(0, str(CODE))
    os.chdir(CODE)
    return CODE


def result(name: str, value: float | None, unit: str, *, better: str = "lower", over: str = "") -> None:
    """Print one figure for bench/compare.py; ``value`` None says the measured code cannot do it."""
    if better not in ("lower", "higher"):
        raise ValueError("better is 'lower' or 'higher'")
    line = {"name": name, "value": value, "unit": unit, "better": better, "over": over}
    print("RESULT " + json.dumps(line), flush=True)


def results(text: str) -> list[dict]:
    """The RESULT lines of a bench's output, in order."""
    found = []
    for line in text.splitlines():
        if line.startswith("RESULT "):
            try:
                found.append(json.loads(line[len("RESULT ") :]))
            except json.JSONDecodeError:
                continue
    return found
