#!/usr/bin/env python3
"""Summary table of bench/run_http.sh's measurements.

    python3 bench/http/summarise.py RESULTS.tsv

RESULTS.tsv has one line per measurement (run_http.sh writes it; the same lines are in the
raw log, prefixed with "RESULT\t"):
    run threads conns server rps p50_us p99_us connect read write timeout non2xx rss_kib
"NA" marks a measurement that failed (server did not answer, wrk failed); it is left out of
the medians and counted in the "failed" column.
"""
import statistics
import sys

FIELDS = "run threads conns server rps p50_us p99_us connect read write timeout non2xx rss_kib".split()
ORDER = ["bus", "direct", "nginx", "hs256", "es256", "rs256", "hs256-new", "es256-new", "rs256-new"]


def num(s):
    return None if s == "NA" else float(s)


def fmt_ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts and parts[0] == "RESULT":
                parts = parts[1:]
            if len(parts) != len(FIELDS) or parts[0] == "run":
                continue
            rows.append(dict(zip(FIELDS, parts)))

    groups = {}
    for r in rows:
        groups.setdefault((int(r["threads"]), int(r["conns"])), {}).setdefault(r["server"], []).append(r)

    out = []
    out.append("Medians over runs; req/s also (min-max). errors: socket errors (connect+read+write+"
               "timeout) and non-2xx/3xx responses, summed over runs.")
    out.append("RSS: greeting_server VmHWM; nginx the largest sum of VmRSS of master + workers, "
               "sampled every 0.5 s during the run.")
    for (threads, conns) in sorted(groups):
        by_server = groups[(threads, conns)]
        out.append("")
        out.append(f"threads={threads} connections={conns}")
        out.append(f"  {'server':<9} {'runs':>4} {'req/s (min-max)':>28} {'p50 us':>9} {'p99 us':>9}"
                   f" {'sock err':>9} {'non-2xx':>8} {'RSS MiB':>8} {'failed':>6}")
        med = {}
        for server in sorted(by_server, key=lambda s: (ORDER.index(s) if s in ORDER else 99, s)):
            ok = [r for r in by_server[server] if r["rps"] != "NA"]
            failed = len(by_server[server]) - len(ok)
            if not ok:
                out.append(f"  {server:<9} {0:>4} {'-':>28} {'-':>9} {'-':>9} {'-':>9} {'-':>8}"
                           f" {'-':>8} {failed:>6}")
                continue
            rps = [num(r["rps"]) for r in ok]
            p50 = statistics.median(num(r["p50_us"]) for r in ok)
            p99 = statistics.median(num(r["p99_us"]) for r in ok)
            sock = sum(int(r[k]) for r in ok for k in ("connect", "read", "write", "timeout"))
            non2xx = sum(int(r["non2xx"]) for r in ok)
            rss_values = [num(r["rss_kib"]) / 1024 for r in ok if r["rss_kib"] != "NA"]
            rss = statistics.median(rss_values) if rss_values else None
            med[server] = (statistics.median(rps), p99, rss)
            rps_text = f"{statistics.median(rps):.0f} ({min(rps):.0f}-{max(rps):.0f})"
            rss_text = "-" if rss is None else f"{rss:.1f}"
            out.append(f"  {server:<9} {len(ok):>4} {rps_text:>28} {p50:>9.0f} {p99:>9.0f}"
                       f" {sock:>9} {non2xx:>8} {rss_text:>8} {failed:>6}")
        if "bus" in med:
            # The token kinds against bus (the same route, no token): the ratio of req/s, and
            # what a request costs more on the server's one core (1/req/s).
            b = med["bus"]
            for server in ORDER[3:]:
                if server in med:
                    s = med[server]
                    extra = 1e6 / s[0] - 1e6 / b[0]
                    out.append(f"  {server}/bus: req/s {fmt_ratio(s[0], b[0])}  p99 {fmt_ratio(s[1], b[1])}"
                               f"  (+{extra:.1f} us per request)")
        if "nginx" in med:
            n = med["nginx"]
            for server in ("bus", "direct"):
                if server in med:
                    s = med[server]
                    out.append(f"  {server}/nginx: req/s {fmt_ratio(s[0], n[0])}  p99 {fmt_ratio(s[1], n[1])}"
                               f"  RSS {fmt_ratio(s[2], n[2])}")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
