"""PNG plots of a replay. The only module of the simulator that uses matplotlib,
imported lazily so that the replay itself needs nothing beyond the standard library."""

from __future__ import annotations

from pathlib import Path

from scheduling.sim.metrics import Summary, label


def write_plots(rows: list[Summary], out: Path, *, busy_from: float) -> list[Path]:
    """One utilisation-over-time and one queueing-delay-CDF plot per cluster size.

    Returns the files written; an empty list (and a message) without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping plots")
        return []
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for nodes in sorted({s.nodes for s in rows}, reverse=True):
        group = [s for s in rows if s.nodes == nodes]
        fig, ax = plt.subplots(figsize=(10, 4))
        first_hour = int(busy_from // 3600)
        # The metrics window and two days of the drain after the last submission.
        last_hour = int(group[0].window_end // 3600) + 48
        for s in group:
            hours = sorted(h for h in s.util_series if first_hour <= h <= last_hour)
            smooth = [sum(s.util_series.get(k, 0.0) for k in range(h - 5, h + 1)) / 6 for h in hours]
            ax.plot([h / 24 for h in hours], [100 * v for v in smooth], label=label(s), linewidth=1)
        ax.axvline(group[0].window_end / 86400, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("trace day (dotted: last submission, end of the metrics window)")
        ax.set_ylabel("GPUs allocated (%), 6 h mean")
        ax.set_ylim(0, 101)
        ax.set_title(f"GPU utilisation, {nodes} nodes, from day {busy_from / 86400:.0f}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"utilisation_{nodes}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in group:
            v = sorted(max(d, 1.0) for d in s.queue_delays)
            if v:
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label(s), linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("queueing delay (s, log; 0 shown as 1)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"Queueing-delay CDF, {nodes} nodes (jobs submitted from day 20)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"queue_cdf_{nodes}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
