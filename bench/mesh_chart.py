#!/usr/bin/env python3
"""Medians of bench/mesh.py's lines per (membership, nodes) over the runs in one output file, as
a table and a PNG of four curves: time to full membership, idle CPU and RSS per node, fan-out
deliveries per second.

  python3 bench/mesh_chart.py MESH_OUTPUT.txt CHART.png
"""
import collections
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KEYS = ["converge_s", "cpu_pct_median", "us_cpu_per_heartbeat_in", "rss_mb_median",
        "fanout_deliveries_per_s", "fanout_short", "peers_lost"]


def main(src, png):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(src):
        if not line.startswith("membership="):
            continue
        f = dict(re.findall(r"(\w+)=(\S+)", line))
        key = (f["membership"], int(f["nodes"]))
        for k in KEYS:
            if k in f:
                rows[key][k].append(float(f[k]))
    med = {key: {k: statistics.median(v) for k, v in ks.items()} for key, ks in rows.items()}
    print("medians over the runs above:")
    print(f"{'membership':<10} {'nodes':>5} {'converge s':>10} {'idle CPU %':>10} "
          f"{'us/heartbeat':>12} {'RSS MB':>7} {'fan-out deliveries/s':>21} {'short':>6} "
          f"{'runs':>4}")
    for (m, n), v in sorted(med.items()):
        print(f"{m:<10} {n:>5} {v.get('converge_s', 0):>10.2f} {v.get('cpu_pct_median', 0):>10.3f} "
              f"{v.get('us_cpu_per_heartbeat_in', 0):>12.1f} {v.get('rss_mb_median', 0):>7.1f} "
              f"{v.get('fanout_deliveries_per_s', 0):>21,.0f} {v.get('fanout_short', 0):>6.0f} "
              f"{len(rows[(m, n)]['converge_s']):>4}")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("converge_s", "time to full membership (s)"),
              ("cpu_pct_median", "idle CPU per node (% of a core)"),
              ("rss_mb_median", "RSS per node (MB)"),
              ("fanout_deliveries_per_s", "fan-out deliveries/s (1 publisher -> N-1)")]
    for ax, (k, title) in zip(axes.flat, panels):
        for m in sorted({m for m, _ in med}):
            pts = sorted((n, v[k]) for (mm, n), v in med.items() if mm == m and k in v)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("bus::net full mesh on one 2-core VM (127.0.0.1), medians")
    fig.tight_layout()
    fig.savefig(png, dpi=90)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
