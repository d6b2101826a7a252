//! Resident memory of an unmodified `rping` under libsoftiwarp: no
//! leak per WR and none per connection. A persistent rping server (`-P`) on the UDP
//! link serves, in turn, a warm-up (a client of 1,000 pings and 20 short clients), a
//! long client (`-C 10000`), and 20 more short clients (10 pings each). The server's
//! `VmRSS` after the long client must be within [`PER_WR_SLACK`] of its value after the
//! warm-up (10,000 ping round trips, each a Send, an RDMA Read, an RDMA Write and a
//! Send with their receives, hold no memory), and within [`PER_CONN_SLACK`] after the
//! 20 connections; the long client's own `VmRSS`, sampled as it runs, within
//! [`PER_WR_SLACK`] from a quarter of its run to its end.
//!
//! The warm-up matters: the first 20 connections raise the server by about 3 MiB
//! (rping -P runs each connection on a thread of its own: thread stacks and malloc
//! arenas reach their high-water mark), and 40 more then added 8 KiB (measured).

mod support;

use std::time::Duration;
use support::{assert_rping_client, link_pair, require, spawn, LibDir, Mode, Proc};

/// Connections of the warm-up and of the measured batch.
const CONNS: usize = 20;
/// Allowed growth over 10,000 round trips (~40,000 WRs), bytes: under 7 bytes a WR;
/// what the allocator keeps of a transient burst fits.
const PER_WR_SLACK: u64 = 256 * 1024;
/// Allowed growth over 20 connections, bytes (~26 KiB each); a connection's own
/// buffers (256 KiB of TCP buffers per side) leaking would show many times over.
const PER_CONN_SLACK: u64 = 512 * 1024;

/// The pid of the `rping` in `p`'s process group (under runuser when root).
fn rping_pid(p: &Proc) -> u32 {
    let pgid = p.child.id();
    for _ in 0..100 {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid pgrp ...
            let Some((comm, rest)) = stat.split_once(") ") else {
                continue;
            };
            let pgrp = rest
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u32>().ok());
            if comm.ends_with("(rping") && pgrp == Some(pgid) {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no rping in process group {pgid}");
}

/// `VmRSS` of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn a_persistent_rping_server_stays_flat_over_10000_pings_and_20_connections() {
    if !require("rping") {
        return;
    }
    let lib = LibDir::new("rss");
    let (srv_dev, cli_dev, addr) = link_pair(7420);
    let mut server = spawn(
        &lib,
        Mode::DropIn,
        &srv_dev,
        "rping",
        &["-s", "-P", "-a", &addr],
    );
    let pid = rping_pid(&server);
    std::thread::sleep(Duration::from_millis(700));
    let client = |count: usize| {
        // `-v` (each ping printed, then checked) up to 100 pings: more would fill the
        // pipe nobody reads while the client runs.
        let verbose = count <= 100;
        let count_arg = count.to_string();
        let mut args = vec!["-c", "-a", &addr, "-C", &count_arg];
        if verbose {
            args.push("-v");
        }
        let c = spawn(&lib, Mode::DropIn, &cli_dev, "rping", &args).wait(Duration::from_secs(120));
        assert_rping_client(&c, verbose.then_some(count), &format!("client -C {count}"));
    };
    let settle = || std::thread::sleep(Duration::from_millis(300));
    // Warm-up: what the allocator and the thread stacks reach under both kinds of use.
    client(1000);
    for _ in 0..CONNS {
        client(10);
    }
    settle();
    let warm = rss(pid);
    // The long client: its own VmRSS sampled every 200 ms while it runs.
    let mut long = spawn(
        &lib,
        Mode::DropIn,
        &cli_dev,
        "rping",
        // No `-v`: 10,000 ping lines would fill the pipe nobody reads while it runs.
        &["-c", "-a", &addr, "-C", "10000"],
    );
    let cpid = rping_pid(&long);
    let mut samples = Vec::new();
    while long.child.try_wait().unwrap().is_none() && samples.len() < 600 {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{cpid}/status")) {
            if s.contains("VmRSS:") {
                samples.push(rss(cpid));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = long.wait(Duration::from_secs(60));
    assert_rping_client(&c, None, "client -C 10000");
    settle();
    let after_wrs = rss(pid);
    assert!(
        samples.len() >= 10,
        "the long client ran {} samples",
        samples.len()
    );
    // Warmed up after the first quarter of the run (measured: the client reaches its
    // plateau about 4 s into a 24 s run, then stays there to the KiB).
    let (c_warm, c_end) = (samples[samples.len() / 4], *samples.last().unwrap());
    println!(
        "rping -C 10000 client VmRSS: {} KiB after a quarter of the run, {} KiB at the end ({} samples)",
        c_warm / 1024,
        c_end / 1024,
        samples.len()
    );
    assert!(
        c_end <= c_warm + PER_WR_SLACK,
        "the client grew {} KiB while pinging",
        (c_end - c_warm) / 1024
    );
    for _ in 0..CONNS {
        client(10);
    }
    settle();
    let after_conns = rss(pid);
    server.kill();
    let _ = server.wait(Duration::from_secs(5));
    println!(
        "rping -P server VmRSS: after warm-up {} KiB, after 10,000 pings {} KiB, after 20 more connections {} KiB",
        warm / 1024,
        after_wrs / 1024,
        after_conns / 1024
    );
    assert!(
        after_wrs <= warm + PER_WR_SLACK,
        "grew {} KiB over 10,000 pings",
        (after_wrs - warm) / 1024
    );
    assert!(
        after_conns <= after_wrs + PER_CONN_SLACK,
        "grew {} KiB over 20 connections",
        (after_conns - after_wrs) / 1024
    );
}
