"""Every bench, over a named commit's code and over this checkout's, in one sitting: figures and ratios.

    python bench/compare.py --base b9ece15              # all benches (make bench)
    python bench/compare.py --base b9ece15 heartbeat core_plan --quick
    python bench/compare.py --base b9ece15 --repeat 3 apply_bulk   # base, head, base, head, ...: medians
    python bench/compare.py --base ''                   # this checkout only

The base commit's tree is `git archive`d into a temporary directory and each bench script of this
checkout runs twice, with BENCH_CODE set to that tree and then unset (bench/benchlib.py): the same
measurement over the old code and the new. The two runs of a bench follow each other, so whatever
load the machine carries moves both alike; run it again with other load on the cores to see how far.
A figure the base cannot produce (a feature it lacks) is printed as n/a. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import HERE, results

# Each bench with the arguments `make bench` gives it, and the smaller ones --quick gives it.
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "heartbeat": ([], ["--quick"]),
    "heartbeat_cpu": ([], ["--beats", "100"]),
    "core_plan": ([], ["--quick"]),
    "cycle": ([], ["--quick"]),
    "api_submit": ([], ["--quick"]),
    "array_submit": ([], ["--quick"]),
    "submit_cpu": ([], ["--posts", "100", "--rounds", "1"]),
    "apply_bulk": ([], ["--jobs", "1000", "--nodes", "125"]),
    "fill_e2e": ([], ["--quick"]),
    "container_start": ([], ["--runs", "3"]),
    "service_proxy": ([], ["--quick"]),
    "whatif": ([], ["--quick"]),
    "sim_replay": ([], ["--quick"]),
}


def archive(base: str, into: Path) -> str:
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{base}^{{commit}}"], cwd=HERE, capture_output=True, text=True, check=True
    )
    commit = sha.stdout.strip()
    tar = subprocess.Popen(["git", "archive", commit], cwd=HERE, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=tar.stdout, check=True)
    if tar.wait() != 0:
        raise SystemExit(f"git archive {base} failed")
    return commit


def run(bench: str, args: list[str], code: Path | None) -> tuple[int, str, float]:
    env = dict(__import__("os").environ)
    env.pop("BENCH_CODE", None)
    if code is not None:
        env["BENCH_CODE"] = str(code)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(HERE / "bench" / f"{bench}.py"), *args],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def median(values: list[float | None] | None) -> float | None:
    """The median of a figure's rounds; None where any round could not produce it."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4g}"


def ratio(base: float | None, head: float | None, better: str) -> str:
    if base is None or head is None or base == 0 or head == 0:
        return "n/a"
    # Always "how many times better the head is": > 1 is an improvement whichever way the figure points.
    times = base / head if better == "lower" else head / base
    return f"{times:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="", help="the commit to compare against ('' for none)")
    parser.add_argument("--quick", action="store_true", help="the smaller sizes (minutes, not tens of minutes)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of base and head, alternating; the table shows medians")
    parser.add_argument("--verbose", action="store_true", help="each run's whole output")
    parser.add_argument("benches", nargs="*", help=f"a subset of: {', '.join(BENCHES)}")
    opts = parser.parse_args()
    chosen = opts.benches or [b for b in BENCHES if (HERE / "bench" / f"{b}.py").exists()]
    unknown = [b for b in chosen if b not in BENCHES or not (HERE / "bench" / f"{b}.py").exists()]
    if unknown:
        raise SystemExit(
            f"no such bench: {', '.join(unknown)} (choose from {', '.join(b for b in BENCHES if (HERE / 'bench' / f'{b}.py').exists())})"
        )
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE, capture_output=True, text=True, check=False
    ).stdout.strip()
    rows: list[tuple[str, str, str, str, str, str]] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="yard-bench-base-") as tmp:
        base_code = None
        if opts.base:
            base_code = Path(tmp)
            commit = archive(opts.base, base_code)
            print(f"base: {opts.base} ({commit[:12]}), archived to {base_code}")
        print(f"head: {head}{' with uncommitted changes' if dirty else ''} ({HERE})", flush=True)
        for bench in chosen:
            full, quick = BENCHES[bench]
            args = quick if opts.quick else full
            print(f"== bench/{bench}.py {' '.join(args)}", flush=True)
            figures: dict[str, dict] = {}
            # Base and head alternate, so a load that comes and goes moves both alike.
            for round_ in range(opts.repeat):
                for side, code in (("base", base_code), ("head", None)):
                    if side == "base" and code is None:
                        continue
                    rc, out, took = run(bench, args, code)
                    lines = out.splitlines()
                    last = round_ == opts.repeat - 1
                    if opts.verbose or rc != 0:
                        shown = lines
                    else:
                        shown = [line for line in lines if not line.startswith("RESULT ")][-25:] if last else []
                    print(f"-- {side}{f' (round {round_ + 1})' if opts.repeat > 1 else ''}: rc {rc}, {took:.0f} s")
                    for line in shown:
                        print(f"   {line}")
                    if rc != 0:
                        failed.append(f"{bench} ({side})")
                    for figure in results(out):
                        entry = figures.setdefault(
                            figure["name"], {"unit": figure["unit"], "better": figure["better"], "over": figure["over"]}
                        )
                        entry.setdefault(side, []).append(figure["value"])
            for name, f in figures.items():
                base, head_ = median(f.get("base")), median(f.get("head"))
                rows.append((name, f["unit"], fmt(base), fmt(head_), ratio(base, head_, f["better"]), f["over"]))
    print()
    print(f"{'figure':44} {'unit':8} {'base':>10} {'head':>10} {'better by':>9}  over")
    for name, unit, b, h, r, over in rows:
        print(f"{name:44} {unit:8} {b:>10} {h:>10} {r:>9}  {over}")
    print("('better by' is base/head for a figure where lower is better, head/base where higher is: > 1 is an improvement)")
    if failed:
        print(f"failed: {', '.join(failed)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
