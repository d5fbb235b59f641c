#!/usr/bin/env python3
"""The medians of bench/run_shm.sh's samples as two charts side by side: round-trip p50 per
payload size (log scale, spinning), and 1 -> 1 throughput per payload size.

  python3 bench/shm_chart.py SHM_OUTPUT.txt CHART.png
"""
import collections
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = ["64B", "1KiB", "64KiB", "4MiB"]


def medians(path):
    values = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            if not line.startswith("sample|"):
                continue
            parts = line.split("|")
            if parts[3] != "1":
                continue
            values[parts[2]].append(float(parts[4]))
    return {case: statistics.median(v) for case, v in values.items()}


def main():
    data = medians(sys.argv[1])
    fig, (rtt, tp) = plt.subplots(1, 2, figsize=(13, 5))
    systems = collections.OrderedDict()
    for case in data:
        kind, system = case.split(".", 1)
        systems.setdefault(system, None)
    width = 0.8 / max(1, len(systems))
    for panel, prefix, scale, label in ((rtt, "rtt", 1e3, "round trip p50, us (log)"),
                                        (tp, "tp1x", 1e6, "1 -> 1, M msgs/s")):
        shown = [s for s in systems if any(f"{prefix}{z}.{s}" in data for z in SIZES)]
        for i, system in enumerate(shown):
            xs, ys = [], []
            for j, z in enumerate(SIZES):
                v = data.get(f"{prefix}{z}.{system}")
                if v:
                    xs.append(j + i * width)
                    ys.append(v / scale)
            panel.bar(xs, ys, width, label=system)
        panel.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(SIZES))])
        panel.set_xticklabels(SIZES)
        panel.set_ylabel(label)
        if prefix == "rtt":
            panel.set_yscale("log")
        panel.legend(fontsize=8)
    rtt.set_title("two processes, one host: round trip (lower is better)")
    tp.set_title("publisher -> subscriber process (higher is better)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
