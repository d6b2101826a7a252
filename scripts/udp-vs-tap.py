#!/usr/bin/env python3
"""iwperf on the UDP link against iwperf on TAPs, side by side in one run.

For each MTU, alternating the two links in every round:
  TAP: `iwperf demo --mtu M --rounds 1 --duration D --json` (two namespaces, TAPs on
       bridges joined by a veth pair: the README's main job), its Write/Read/Send rows;
  UDP: `iwperf server` and `iwperf client` as two processes on 127.0.0.1 with
       `--udp/--udp-peer --mtu M`, one run per op of D seconds, 64 KiB messages.
Prints the medians over the rounds (Gbit/s) and UDP as a share of TAP.

Usage (root, for the TAP side): scripts/udp-vs-tap.py [--rounds 3] [--duration 3]
        [--mtu 1500 --mtu 65000] [--iwperf target/release/iwperf]
"""
import argparse
import json
import statistics
import subprocess
import time

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--duration", type=float, default=3.0)
p.add_argument("--mtu", type=int, action="append")
p.add_argument("--iwperf", default="target/release/iwperf")
a = p.parse_args()
mtus = a.mtu or [1500, 65000]
OPS = ["write", "read", "send"]


def tap_round(mtu):
    out = subprocess.run([a.iwperf, "demo", "--mtu", str(mtu), "--rounds", "1",
                          "--duration", str(a.duration), "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return {r["op"]: r["gbps"] for r in j["results"]}


def udp_run(mtu, op, port):
    srv = subprocess.Popen([a.iwperf, "server", "--udp", f"127.0.0.1:{port}",
                            "--udp-peer", f"127.0.0.1:{port + 1}", "--ip", "10.77.60.1/24",
                            "--mtu", str(mtu), "--timeout", "60"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert srv.stdout.readline().strip() == "READY"
    out = subprocess.run([a.iwperf, "client", "--udp", f"127.0.0.1:{port + 1}",
                          "--udp-peer", f"127.0.0.1:{port}", "--ip", "10.77.60.2/24",
                          "--mtu", str(mtu), "--peer", "10.77.60.1", "--op", op,
                          "--size", "65536", "--duration", str(a.duration), "--json"],
                         capture_output=True, text=True, check=True).stdout
    srv.wait(timeout=60)
    j = json.loads(out.strip().splitlines()[-1])
    return j["bandwidth"][0]["gbps"]


port = 41000
for mtu in mtus:
    tap = {op: [] for op in OPS}
    udp = {op: [] for op in OPS}
    for r in range(a.rounds):
        for op, g in tap_round(mtu).items():
            tap[op].append(g)
        for op in OPS:
            port += 2
            udp[op].append(udp_run(mtu, op, port))
            time.sleep(0.2)
    print(f"MTU {mtu}, {a.rounds} rounds of {a.duration} s, medians (Gbit/s):")
    print("| op | TAP (demo) | UDP link | UDP / TAP |")
    print("|---|---:|---:|---:|")
    for op in OPS:
        t, u = statistics.median(tap[op]), statistics.median(udp[op])
        print(f"| {op} | {t:.2f} | {u:.2f} | {u / t:.0%} |")
    print("raw TAP:", {k: [round(x, 2) for x in v] for k, v in tap.items()})
    print("raw UDP:", {k: [round(x, 2) for x in v] for k, v in udp.items()})
