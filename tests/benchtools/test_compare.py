"""make bench's comparison: the same bench script over a named commit's code and this checkout's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import compare
from bench.benchlib import results

ROOT = Path(__file__).resolve().parents[2]


def test_a_ratio_above_one_is_an_improvement_whichever_way_the_figure_points() -> None:
    assert compare.ratio(10.0, 5.0, "lower") == "2.00x"  # half the time
    assert compare.ratio(50.0, 100.0, "higher") == "2.00x"  # twice the jobs/s
    assert compare.ratio(10.0, 20.0, "lower") == "0.50x"
    assert compare.ratio(None, 3.0, "lower") == "n/a"  # the base cannot do it


def test_a_figure_the_base_lacks_in_any_round_has_no_median() -> None:
    assert compare.median([3.0, 1.0, 2.0]) == 2.0
    assert compare.median([3.0, None]) is None
    assert compare.median(None) is None


def test_result_lines_are_read_back_among_other_output() -> None:
    text = 'hello\nRESULT {"name": "a", "value": 1.5, "unit": "ms", "better": "lower", "over": "x"}\nRESULT {broken\n'
    assert results(text) == [{"name": "a", "value": 1.5, "unit": "ms", "better": "lower", "over": "x"}]


def test_a_bench_runs_over_the_named_commits_code_not_this_checkouts(tmp_path: Path) -> None:
    """The archived tree is what BENCH_CODE names and what the bench imports: a module that exists only
    in the archive is found, and this checkout's copy of a module is not the one used."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    into = tmp_path / "base"
    into.mkdir()
    assert compare.archive("HEAD", into) == commit
    (into / "scheduling" / "only_in_base.py").write_text("WHERE = 'base'\n")
    probe = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.benchlib import use_code, result\n"
        "use_code()\n"
        "import scheduling, scheduling.only_in_base as m\n"
        f"result('where', 1.0 if m.WHERE == 'base' and scheduling.__file__.startswith({str(into)!r}) else 0.0, 'x')\n"
    )
    env = {"BENCH_CODE": str(into), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert results(done.stdout)[0]["value"] == 1.0
