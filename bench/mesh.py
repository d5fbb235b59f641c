#!/usr/bin/env python3
"""A full mesh of N bus_fixture_node processes on 127.0.0.1, each exporting and importing one
topic, every node listening to every other: how long until every node sees every other (from
the first process started), what each node costs idle (CPU of all its threads, RSS), and how many
deliveries per second one publisher fans out to the N-1 others.

  python3 bench/mesh.py FIXTURE [--nodes 2,8,32] [--membership static|etcd] [--seconds 10]
                        [--heartbeat-ms 200] [--fanout 100000] [--etcd http://127.0.0.1:2379]

static: each node is started with every other's publish endpoint (--peer, fixed ports);
etcd: each knows only the etcd endpoint (a fresh key prefix per run).

CPU comes from /proc/<pid>/task/*/schedstat (nanoseconds on the CPU, every thread) and, as a
cross-check, /proc/<pid>/stat utime+stime (clock ticks, 10 ms). Heartbeats received per node
are (N-1) peers x seconds / heartbeat period; CPU per heartbeat is the node's CPU over them.
"""
import argparse
import concurrent.futures
import os
import random
import re
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def task_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


class Node:
    def __init__(self, fixture, name, heartbeat_ms, dead_after, extra):
        self.p = subprocess.Popen(
            [fixture, f"--name={name}", f"--heartbeat-ms={heartbeat_ms}",
             f"--dead-after={dead_after}", "--export-readings", "--import-readings",
             f"--parent={os.getpid()}", *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.name = name

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.read()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited ({self.p.wait()})")
        return line.strip()

    def stop(self):
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass


def field(line, key):
    m = re.search(rf"\b{key}=(\S+)", line)
    return m.group(1) if m else None


def membership_flags(n, membership, etcd, base_port):
    """Per node: how it finds the others."""
    if membership == "etcd":
        prefix = f"/bus-mesh/{os.getpid()}-{n}-{random.randrange(1 << 30)}/"
        return [[f"--publish-on=tcp://127.0.0.1:*", f"--etcd={etcd}", f"--etcd-prefix={prefix}"]
                for _ in range(n)]
    eps = [f"tcp://127.0.0.1:{base_port + i}" for i in range(n)]
    return [[f"--publish-on={eps[i]}"] + [f"--peer={e}" for j, e in enumerate(eps) if j != i]
            for i in range(n)]


def run(a, n):
    med = statistics.median
    flags = membership_flags(n, a.membership, a.etcd, a.base_port)
    start = time.monotonic()
    nodes = [Node(a.fixture, f"n{i}", a.heartbeat_ms, a.dead_after, flags[i] + a.node_flag)
             for i in range(n)]
    try:
        for node in nodes:
            ready = node.read()
            if not ready.startswith("ready"):
                raise RuntimeError(f"{node.name}: {ready}")
        seen = []
        for node in nodes:
            line = node.ask(f"wait-peers {n - 1} 60000")
            seen.append(int(field(line, "n")))
        converged = time.monotonic() - start
        if min(seen) < n - 1:
            for node, k in zip(nodes, seen):
                if k < n - 1:
                    print(f"incomplete: {node.name}: {node.ask('report')}", flush=True)
            raise RuntimeError(f"membership incomplete after 60 s: {seen}")
        time.sleep(a.settle)  # connections and subscriptions settle; first heartbeats answered
        pids = [node.p.pid for node in nodes]
        ns0 = [task_ns(p) for p in pids]
        t0 = [ticks(p) for p in pids]
        w0 = time.monotonic()
        time.sleep(a.seconds)
        wall = time.monotonic() - w0
        ns1 = [task_ns(p) for p in pids]
        t1 = [ticks(p) for p in pids]
        rss = [rss_kb(p) for p in pids]
        nthreads = [threads(p) for p in pids]
        # Still a full mesh at the end (nobody declared dead while idle).
        lost, dropped, registrations = [], [], []
        for node in nodes:
            line = node.ask("report")
            lost.append(int(field(line, "peers_lost")))
            dropped.append(int(field(line, "members_dropped") or 0))
            registrations.append(int(field(line, "etcd_registrations") or 0))
            if int(field(line, "peers")) != n - 1:
                raise RuntimeError(f"{node.name} lost peers while idle: {line}")
        cpu = [(b - a) / 1e9 / wall * 100 for a, b in zip(ns0, ns1)]
        cpu_ticks = [(b - a) / TICK / wall * 100 for a, b in zip(t0, t1)]
        beats = (n - 1) * wall * 1000 / a.heartbeat_ms  # heartbeats received per node
        us_per_beat = [(b - a) / 1e3 / beats for a, b in zip(ns0, ns1)]
        fan = ""
        if a.fanout > 0:
            # One publisher, every other node a subscriber: until the last has them all.
            nodes[0].ask(f"wait-subscribers {n - 1} 60000")
            f0 = time.monotonic()
            sent = nodes[0].ask(f"publish {a.fanout}")
            # Asked of every subscriber at once (each answers when it has them all, or after
            # 10 s: one passed over by send_stall_limit never gets them all).
            for node in nodes[1:]:
                node.p.stdin.write(f"wait-received {a.fanout} 10000\n")
                node.p.stdin.flush()
            def answer(node):
                got = int(field(node.read(), "n"))
                return got, time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(len(nodes) - 1) as pool:
                answers = list(pool.map(answer, nodes[1:]))
            got = [g for g, _ in answers]
            # Until the last subscriber that got them all had them (the others: what they got).
            done = [t for g, t in answers if g >= a.fanout] or [t for _, t in answers]
            took = max(done) - f0
            fan = (f" fanout_msgs={a.fanout} fanout_s={took:.3f} "
                   f"fanout_deliveries_per_s={sum(min(g, a.fanout) for g in got if g >= a.fanout) / took:.0f} "
                   f"fanout_refused={field(sent, 'refused')} fanout_short={sum(a.fanout - g for g in got)}")
        print(f"membership={a.membership} nodes={n} peers={n - 1} converge_s={converged:.2f} "
              f"window_s={wall:.1f} "
              f"cpu_pct_median={med(cpu):.4f} cpu_pct_min={min(cpu):.4f} "
              f"cpu_pct_max={max(cpu):.4f} cpu_pct_ticks_median={med(cpu_ticks):.3f} "
              f"heartbeats_in_per_s={(n - 1) * 1000 / a.heartbeat_ms:.0f} "
              f"us_cpu_per_heartbeat_in={med(us_per_beat):.2f} "
              f"rss_mb_median={med(rss) / 1024:.1f} rss_mb_max={max(rss) / 1024:.1f} "
              f"threads={med(nthreads):.0f} peers_lost={sum(lost)} members_dropped={sum(dropped)} "
              f"etcd_registrations={sum(registrations)}{fan}", flush=True)
        if a.hold > 0:  # time to attach strace, perf or gdb to the idle nodes
            print(f"holding {a.hold} s: pids={','.join(map(str, pids))}", flush=True)
            time.sleep(a.hold)
    finally:
        for node in nodes:
            node.stop()
        for node in nodes:
            try:
                node.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture")
    ap.add_argument("--nodes", default="2,8,32")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--settle", type=float, default=2)
    ap.add_argument("--heartbeat-ms", type=int, default=200)
    ap.add_argument("--dead-after", type=int, default=3)
    ap.add_argument("--hold", type=float, default=0, help="seconds to keep the mesh up after")
    ap.add_argument("--membership", choices=["static", "etcd"], default="static")
    ap.add_argument("--etcd", default="http://127.0.0.1:2379")
    ap.add_argument("--base-port", type=int, default=27100, help="static: node i publishes here + i")
    ap.add_argument("--fanout", type=int, default=0, help="messages for the fan-out figure (0: none)")
    ap.add_argument("--node-flag", action="append", default=[],
                    help="one more bus_fixture_node flag (repeatable), e.g. --node-flag=--x=1")
    a = ap.parse_args()
    with open("/proc/cpuinfo") as f:
        model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    print(f"machine: {os.cpu_count()} cpus, {model}; membership {a.membership}; heartbeat "
          f"{a.heartbeat_ms} ms, dead_after {a.dead_after}; CPU from /proc/<pid>/task/*/schedstat over {a.seconds} s "
          f"after {a.settle} s to settle, % of one core per node; node flags: "
          f"{' '.join(a.node_flag) or '-'}", flush=True)
    for n in [int(x) for x in a.nodes.split(",")]:
        run(a, n)


if __name__ == "__main__":
    sys.exit(main())
