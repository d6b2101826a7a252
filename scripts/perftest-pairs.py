#!/usr/bin/env python3
"""Unmodified perftest through libsoftiwarp, a feature beside its counterpart, side by side.

Both programs of a pair run with LD_PRELOAD=libsoftiwarp.so and no configuration (the
library's devices are the host's interfaces: kernel TCP over lo), server and client on
127.0.0.1, rounds alternated (each an RDMA CM connection whose client speaks first: a
server that speaks first, as ib_write_lat's, needs the client's `p2p=on`); prints the median of each and their ratio:
  ib_send_bw -R --use-srq  beside  ib_send_bw -R          (64 KiB, -D seconds, Gbit/s)
  ib_atomic_lat -R         beside  ib_read_lat -R         (8 bytes, -n iterations, t_typical us)
  ib_atomic_bw -R          beside  ib_read_bw -R          (8 bytes, -D seconds, Mpps)

Usage: scripts/perftest-pairs.py [--lib target/release/libsoftiwarp.so] [--rounds 5]
        [--duration 3] [--lat-iters 10000]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("--lib", default="target/release/libsoftiwarp.so")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--duration", type=float, default=3.0)
p.add_argument("--lat-iters", type=int, default=10000)
a = p.parse_args()

tmp = tempfile.mkdtemp(prefix="perftest-pairs-")
os.chmod(tmp, 0o755)
lib = os.path.join(tmp, "libsoftiwarp.so")
shutil.copy(a.lib, lib)
port = 43500


def run(prog, args, col):
    """One server/client pair of `prog`; the client's first result row's column `col`."""
    global port
    port += 1
    env = dict(os.environ, LD_PRELOAD=lib)
    env.pop("SOFTIWARP_DEVICE", None)
    full = [prog, "-R", "-p", str(port)] + args
    srv = subprocess.Popen(full, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        out = subprocess.run(full + ["127.0.0.1"], env=env, capture_output=True, text=True,
                             timeout=180).stdout
        srv.wait(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    rows = out.splitlines()
    i = next(k for k, l in enumerate(rows) if l.strip().startswith("#bytes"))
    return float(rows[i + 1].split()[col])


d = str(int(a.duration))
n = str(a.lat_iters)
# (name, prog, args, column, unit); BW average is column 3 (Gb/s with --report_gbits,
# Mpps is column 4), t_typical column 4 of the latency rows.
pairs = [
    (("Send 64 KiB, SRQ", "ib_send_bw", ["--use-srq", "-D", d, "--report_gbits"], 3),
     ("Send 64 KiB", "ib_send_bw", ["-D", d, "--report_gbits"], 3), "Gbit/s"),
    (("Fetch-and-Add 8 B latency", "ib_atomic_lat", ["-A", "FETCH_AND_ADD", "-n", n], 4),
     ("Read 8 B latency", "ib_read_lat", ["-s", "8", "-n", n], 4), "us"),
    (("Fetch-and-Add 8 B rate", "ib_atomic_bw", ["-A", "FETCH_AND_ADD", "-D", d], 4),
     ("Read 8 B rate", "ib_read_bw", ["-s", "8", "-D", d], 4), "Mpps"),
]
res = {}
for r in range(a.rounds):
    for feat, base, _ in pairs:
        for name, prog, args, col in (feat, base):
            res.setdefault(name, []).append(run(prog, args, col))
print(f"perftest through libsoftiwarp, kernel TCP on lo, {a.rounds} rounds alternated, medians:")
print("| feature | figure | counterpart | figure | ratio |")
print("|---|---:|---|---:|---:|")
for feat, base, unit in pairs:
    f, b = statistics.median(res[feat[0]]), statistics.median(res[base[0]])
    print(f"| {feat[0]} | {f:.2f} {unit} | {base[0]} | {b:.2f} {unit} | {f / b:.2f} |")
print("raw:", {k: [round(x, 2) for x in v] for k, v in res.items()})
shutil.rmtree(tmp)
