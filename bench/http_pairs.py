#!/usr/bin/env python3
"""Pools the interleaved pairs of several bench/run_http.sh outputs.

Each run of run_http.sh measures every server once per round, so a round's bus and nginx lines
are a pair taken minutes apart on the same machine state. This pairs them in every file given
and reports, per thread count, the ratio of each server's p99 (or req/s) to nginx's: the median
and geometric mean over all pairs, an approximate 95% interval of the geometric mean (t with
n-1 degrees of freedom, on the logs), and in how many pairs the server was above nginx.

    python3 bench/http_pairs.py --conns 10000 bench/results/http-2026-12-0[456]-*.txt
"""
import argparse
import collections
import math
import statistics
import sys

# Two-sided 97.5% quantiles of Student's t, by degrees of freedom (beyond 30: 2.0).
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 14: 2.14, 16: 2.12, 18: 2.10, 20: 2.09, 25: 2.06, 30: 2.04}


def t975(df):
    keys = [k for k in sorted(T975) if k <= df]
    return T975[keys[-1]] if df <= 30 else 2.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", default="10000", help="connections (RESULT column 4)")
    ap.add_argument("--measure", choices=["p99", "p50", "rps"], default="p99")
    ap.add_argument("--peer", default="nginx")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    column = {"rps": 5, "p50": 6, "p99": 7}[args.measure]

    # RESULT <run> <threads> <conns> <server> <req/s> <p50 us> <p99 us> ...
    pairs = collections.defaultdict(dict)
    for path in args.files:
        with open(path) as f:
            for line in f:
                cols = line.split("\t")
                if cols[0] != "RESULT" or cols[3] != args.conns:
                    continue
                pairs[(path, cols[1], cols[2])][cols[4]] = float(cols[column])

    print(f"{args.measure} / {args.peer}'s at {args.conns} connections, pooled over "
          f"{len(args.files)} file(s): {' '.join(args.files)}")
    for threads in sorted({k[2] for k in pairs}, key=int):
        rows = [v for k, v in pairs.items() if k[2] == threads and args.peer in v]
        servers = sorted({s for v in rows for s in v if s != args.peer})
        for server in servers:
            ratios = [v[server] / v[args.peer] for v in rows if server in v]
            n = len(ratios)
            if n < 2:
                continue
            logs = [math.log(r) for r in ratios]
            mean, sd = statistics.mean(logs), statistics.stdev(logs)
            half = t975(n - 1) * sd / math.sqrt(n)
            above = sum(r > 1 for r in ratios)
            print(f"  threads={threads} {server:7s} pairs {n:2d}  median {statistics.median(ratios):.3f}"
                  f"  geomean {math.exp(mean):.3f} (95% {math.exp(mean - half):.3f}-"
                  f"{math.exp(mean + half):.3f})  above {args.peer} in {above} of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
