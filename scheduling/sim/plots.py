"""PNG plots of a replay. The only module of the simulator that uses matplotlib,
imported lazily so that the replay itself needs nothing beyond the standard library."""

from __future__ import annotations

from pathlib import Path

from scheduling.sim.metrics import Summary, label, slowdown_label


def write_plots(rows: list[Summary], out: Path, *, busy_from: float = 0.0) -> list[Path]:
    """Per workload and cluster size, one utilisation-over-time and one queueing-delay-CDF figure, with
    one panel per spanning slowdown. ``busy_from`` is kept for callers; each replay's own window is used.

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
    for workload, nodes in sorted({(s.workload, s.nodes) for s in rows}, key=lambda k: (k[0] != "philly", -k[1])):
        group = [s for s in rows if (s.workload, s.nodes) == (workload, nodes)]
        slowdowns = sorted({s.slowdown for s in group})
        stem = f"{nodes}" if workload == "philly" else f"{workload}_{nodes}"
        n = len(slowdowns)

        fig, axes = plt.subplots(n, 1, figsize=(10, 3.2 * n), squeeze=False, sharex=True)
        for ax, slow in zip(axes[:, 0], slowdowns, strict=True):
            panel = [s for s in group if s.slowdown == slow]
            first_hour = int(panel[0].window_start // 3600)
            # The metrics window and two days of the drain after the last submission.
            last_hour = int(panel[0].window_end // 3600) + 48
            for s in panel:
                hours = sorted(h for h in s.util_series if first_hour <= h <= last_hour)
                smooth = [sum(s.util_series.get(k, 0.0) for k in range(h - 5, h + 1)) / 6 for h in hours]
                ax.plot([h / 24 for h in hours], [100 * v for v in smooth], label=label(s), linewidth=1)
            ax.axvline(panel[0].window_end / 86400, color="grey", linestyle=":", linewidth=1)
            ax.set_ylabel("GPUs allocated (%)")
            ax.set_ylim(0, 101)
            ax.set_title(f"{workload}, {nodes} nodes, spanning slowdown {slowdown_label(slow)} (6 h mean)", fontsize=10)
            ax.legend(fontsize=7, ncol=2)
        axes[-1, 0].set_xlabel("trace day (dotted: last submission, end of the metrics window)")
        fig.tight_layout()
        path = out / f"utilisation_{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

        fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False, sharey=True)
        for ax, slow in zip(axes[0], slowdowns, strict=True):
            for s in (s for s in group if s.slowdown == slow):
                v = sorted(max(d, 1.0) for d in s.queue_delays)
                if v:
                    ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label(s), linewidth=1)
            ax.set_xscale("log")
            ax.set_xlabel("queueing delay (s, log; 0 shown as 1)")
            ax.set_title(f"slowdown {slowdown_label(slow)}", fontsize=10)
            ax.legend(fontsize=7)
        axes[0, 0].set_ylabel("fraction of jobs")
        fig.suptitle(f"Queueing-delay CDF, {workload}, {nodes} nodes (jobs in the metrics window)")
        fig.tight_layout()
        path = out / f"queue_cdf_{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
