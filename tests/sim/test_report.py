"""Metrics, markdown tables and plots of a (short) replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.sim.cli import main
from scheduling.sim.metrics import delays, percentile

SAMPLE = Path(__file__).parent.parent / "data" / "philly_sep2017_sample2k.csv"


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 95) == 95.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 50) == 7.0


def test_delays_summarise_mean_median_p95() -> None:
    d = delays([0.0, 10.0, 20.0, 30.0])
    assert (d.count, d.mean, d.median, d.p95) == (4, 15.0, 15.0, 30.0)


def test_cli_prints_one_row_per_policy_and_writes_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--trace",
        str(SAMPLE),
        "--limit",
        "300",
        "--nodes",
        "16",
        "--busy-from",
        "0",
        "--jobs",
        "1",
        "--policies",
        "fifo,easy-blind",
        "--time-limits",
        "oracle",
        "--gang-heavy-nodes",
        "0",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| fifo |" in out and "| easy-blind (oracle) |" in out
    assert "| easy-blind (oracle) |" in (tmp_path / "results.md").read_text()
    # Another trace than the bundled month is named by its file, never "philly".
    assert f"## {SAMPLE.stem}, 16 nodes" in out and "## philly," not in out
    assert {p.name for p in tmp_path.glob("*.png")} == {f"utilisation_{SAMPLE.stem}_16.png", f"queue_cdf_{SAMPLE.stem}_16.png"}


def test_a_renamed_policy_is_refused_with_its_new_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--policies", "easy-backfill", "--nodes", "4", "--limit", "10"])
    assert "easy-backfill is now easy-blind" in capsys.readouterr().err


def test_another_trace_is_measured_whole_and_the_bundled_month_from_day_20() -> None:
    from scheduling.sim.cli import busy_from, parser

    assert busy_from(parser().parse_args(["--trace", str(SAMPLE)])) == 0.0
    assert busy_from(parser().parse_args([])) == 20 * 86400.0
    assert busy_from(parser().parse_args(["--trace", str(SAMPLE), "--busy-from", "5"])) == 5.0


def test_a_verdict_is_a_tie_within_one_percent_or_half_a_point() -> None:
    from scheduling.sim.metrics import verdict

    # Times, lower is better: within 1 % of the best baseline is a tie.
    assert verdict(99.0, 100.0, False, "avg JCT (s)") == "tie"
    assert verdict(98.0, 100.0, False, "avg JCT (s)") == "ahead"
    assert verdict(102.0, 100.0, False, "avg JCT (s)") == "behind"
    # Shares, higher is better: within 0.5 points is a tie.
    assert verdict(0.896, 0.900, True, "GPU util") == "tie"
    assert verdict(0.890, 0.900, True, "GPU util") == "behind"
    assert verdict(0.910, 0.900, True, "GPU util") == "ahead"


def test_nodes_0_leaves_the_trace_out_and_both_gang_heavy_workloads_are_replayed_by_default() -> None:
    from scheduling.sim.cli import parser, tasks

    work = tasks(parser().parse_args(["--nodes", "0", "--policies", "yardmaster", "--time-limits", "estimate"]))
    assert {(t.workload, t.nodes) for t in work} == {("gang-heavy", 100), ("gang-heavy-b", 100)}
    assert len(work) == 2 * 3  # each at the three spanning slowdowns
    one = tasks(parser().parse_args(["--nodes", "0", "--gang-heavy", "gang-heavy-b", "--policies", "fifo"]))
    assert {t.workload for t in one} == {"gang-heavy-b"}


def test_the_targets_and_verdicts_tables_set_each_metric_against_its_best_baseline() -> None:
    from scheduling.sim import cli
    from scheduling.sim.metrics import TARGETS, targets_table, verdicts_table

    args = cli.parser().parse_args(
        ["--trace", str(SAMPLE), "--limit", "300", "--nodes", "8", "--busy-from", "0", "--jobs", "1",
         "--time-limits", "estimate", "--gang-heavy-nodes", "0", "--slowdowns", "0", "--policies", "yardmaster,easy-blind"]
    )  # fmt: skip
    rows = [cli._replay(t) for t in cli.tasks(args)]
    for table in (targets_table(rows), verdicts_table(rows)):
        lines = [line for line in table.splitlines() if line.startswith(f"| {SAMPLE.stem} |")]
        assert len(lines) == 1  # one row: Yardmaster's, never the baseline's own
        cells = [c.strip() for c in lines[0].strip("|").split("|")][4:]
        assert len(cells) == len(TARGETS)
    verdicts = [c.strip() for c in verdicts_table(rows).splitlines()[-1].strip("|").split("|")][4:]
    assert set(verdicts) <= {"ahead", "tie", "behind easy-blind", "–"}
    assert all(" vs easy-blind" in c or "easy-blind" in c for c in targets_table(rows).splitlines()[-1].split("|")[5:-1])


def test_trace_slowdowns_apply_to_the_trace_alone() -> None:
    from scheduling.sim.cli import parser, tasks

    args = ["--nodes", "192", "--policies", "yardmaster", "--time-limits", "estimate", "--trace-slowdowns", "0,0.25"]
    got = {(t.workload, t.slowdown) for t in tasks(parser().parse_args(args))}
    assert got == {("philly", 0.0), ("philly", 0.25)} | {(w, s) for w in ("gang-heavy", "gang-heavy-b") for s in (0.0, 0.1, 0.25)}
    plain = {(t.workload, t.slowdown) for t in tasks(parser().parse_args(args[:-2]))}
    assert ("philly", 0.1) in plain and len(plain) == 9


def test_make_eval_asks_every_policy_on_every_workload_it_names() -> None:
    import shlex

    from scheduling.sim.cli import parser, tasks
    from scheduling.sim.policies import NAMES

    line = next(ln for ln in (Path(__file__).parents[2] / "Makefile").read_text().splitlines() if "--out docs/eval " in ln + " ")
    argv = shlex.split(line.split("-m scheduling.sim", 1)[1].replace("$(EVAL_JOBS)", "2"))
    work = tasks(parser().parse_args(argv))
    rows = {(t.workload, t.nodes, t.slowdown) for t in work}
    assert {(w, n) for w, n, _ in rows} == {("philly", 192), ("philly", 160), ("gang-heavy", 100), ("gang-heavy-b", 100)}
    # Every policy on every row: no baseline left out of a verdict.
    assert {(t.workload, t.nodes, t.slowdown, t.policy) for t in work} == {(*r, p) for r in rows for p in NAMES}
    assert {s for w, _, s in rows if w.startswith("gang-heavy")} == {0.0, 0.1, 0.25}
    assert {s for w, _, s in rows if w == "philly"} == {0.0, 0.25}
