#!/usr/bin/env python3
"""Unmodified perftest through libsoftiwarp against iwperf, side by side.

Both on the same path: two processes on one UDP link on 127.0.0.1 (the library's
`link=udp:`, iwperf's `--udp`), MTU as given; or, with `--netdev lo`, both on the host's
kernel TCP over lo (the library with no configuration, whose devices are the host's
interfaces, against `iwperf --netdev lo`; perftest and iwperf connect to 127.0.0.1;
`--mtu` is lo's and ignored). Each round runs, alternating:
  ib_write_bw -R, ib_read_bw -R (64 KiB, --report_gbits, -D seconds) and
  ib_send_lat -R (2 bytes, -n iterations) with LD_PRELOAD=libsoftiwarp.so, then
  iwperf client --op write / --op read (64 KiB, --duration) and --lat --op send
  (2 bytes, --iters).
Prints the medians over the rounds: bandwidth in Gbit/s, latency t_typical in us, and
the library as a share (bandwidth) or a multiple (latency) of iwperf.

Usage: scripts/perftest-vs-iwperf.py --lib target/release/libsoftiwarp.so
        [--iwperf target/release/iwperf] [--rounds 5] [--duration 3] [--mtu 1500]
        [--netdev lo]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("--lib", default="target/release/libsoftiwarp.so")
p.add_argument("--iwperf", default="target/release/iwperf")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--duration", type=float, default=3.0)
p.add_argument("--lat-iters", type=int, default=10000)
p.add_argument("--mtu", type=int, default=1500)
p.add_argument("--netdev", help="kernel TCP on this interface (lo) instead of a UDP link")
a = p.parse_args()

tmp = tempfile.mkdtemp(prefix="pt-vs-iwperf-")
os.chmod(tmp, 0o755)
lib = os.path.join(tmp, "libsoftiwarp.so")
shutil.copy(a.lib, lib)
port = 42000


def line(ip, local, peer):
    return f"link=udp:127.0.0.1:{local},peer=127.0.0.1:{peer},ip={ip}/24,mtu={a.mtu}"


def perftest(prog, args):
    global port
    port += 2
    env = dict(os.environ, LD_PRELOAD=lib)
    env.pop("SOFTIWARP_DEVICE", None)
    if a.netdev:
        senv, cenv, dst = env, env, "127.0.0.1"
        args = args + ["-p", str(port)]
    else:
        senv = dict(env, SOFTIWARP_DEVICE=line("10.77.70.1", port, port + 1))
        cenv = dict(env, SOFTIWARP_DEVICE=line("10.77.70.2", port + 1, port))
        dst = "10.77.70.1"
    srv = subprocess.Popen([prog, "-R"] + args, env=senv,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    out = subprocess.run([prog, "-R"] + args + [dst], env=cenv,
                         capture_output=True, text=True, timeout=120).stdout
    srv.wait(timeout=60)
    rows = out.splitlines()
    i = next(k for k, l in enumerate(rows) if l.strip().startswith("#bytes"))
    return [float(v) for v in rows[i + 1].split()]


def iwperf(args):
    global port
    port += 2
    if a.netdev:
        sdev = cdev = ["--netdev", a.netdev, "--port", str(port)]
        peer = "127.0.0.1"
    else:
        sdev = ["--udp", f"127.0.0.1:{port}", "--udp-peer", f"127.0.0.1:{port + 1}",
                "--ip", "10.77.71.1/24", "--mtu", str(a.mtu)]
        cdev = ["--udp", f"127.0.0.1:{port + 1}", "--udp-peer", f"127.0.0.1:{port}",
                "--ip", "10.77.71.2/24", "--mtu", str(a.mtu)]
        peer = "10.77.71.1"
    srv = subprocess.Popen([a.iwperf, "server"] + sdev + ["--timeout", "60"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert srv.stdout.readline().strip() == "READY"
    out = subprocess.run([a.iwperf, "client"] + cdev + ["--peer", peer, "--json"] + args,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    srv.wait(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


d = str(int(a.duration))
res = {k: [] for k in ["pt_write", "iw_write", "pt_read", "iw_read", "pt_lat", "iw_lat"]}
for r in range(a.rounds):
    # BW average is the 4th column (Gb/sec with --report_gbits).
    res["pt_write"].append(perftest("ib_write_bw", ["-D", d, "--report_gbits"])[3])
    res["iw_write"].append(iwperf(["--op", "write", "--size", "65536", "--duration", d])
                           ["bandwidth"][0]["gbps"])
    res["pt_read"].append(perftest("ib_read_bw", ["-D", d, "--report_gbits"])[3])
    res["iw_read"].append(iwperf(["--op", "read", "--size", "65536", "--duration", d])
                          ["bandwidth"][0]["gbps"])
    # t_typical is the 5th column of ib_send_lat's row.
    res["pt_lat"].append(perftest("ib_send_lat", ["-n", str(a.lat_iters)])[4])
    res["iw_lat"].append(iwperf(["--lat", "--op", "send", "--size", "2", "--iters",
                                 str(a.lat_iters)])["latency"]["t_typical"])
m = {k: statistics.median(v) for k, v in res.items()}
path = f"kernel TCP on {a.netdev}" if a.netdev else f"UDP link on 127.0.0.1, MTU {a.mtu}"
print(f"{path}, {a.rounds} rounds alternated, medians:")
print("| test | perftest through libsoftiwarp | iwperf | library / iwperf |")
print("|---|---:|---:|---:|")
print(f"| Write 64 KiB (Gbit/s) | {m['pt_write']:.2f} | {m['iw_write']:.2f} | {m['pt_write'] / m['iw_write']:.0%} |")
print(f"| Read 64 KiB (Gbit/s) | {m['pt_read']:.2f} | {m['iw_read']:.2f} | {m['pt_read'] / m['iw_read']:.0%} |")
print(f"| Send 2 B latency, typical (us) | {m['pt_lat']:.1f} | {m['iw_lat']:.1f} | {m['pt_lat'] / m['iw_lat']:.2f}x |")
print("raw:", {k: [round(x, 2) for x in v] for k, v in res.items()})
shutil.rmtree(tmp)
