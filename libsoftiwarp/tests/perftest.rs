//! Unmodified perftest (Debian 12, 4.5) over libsoftiwarp with `-R` (rdma_cm), as an
//! unprivileged user, two processes on one UDP link (issue 18, test 1): write, read and
//! send bandwidth and write and send latency, at the default sizes and at
//! `-s 1048576 -n 200`. Drop-in mode (the harder one: perftest's libmlx5/libefa need
//! rdma-core's provider symbols at load time).

mod support;

use std::time::Duration;
use support::{link_pair, require, spawn, LibDir, Mode};

/// Runs `prog -R extra` as server and client; both must exit 0 and the client must
/// print its result row for `size` bytes with `iters` iterations. Returns the next
/// free port base.
///
/// perftest's server creates its data listener only after a handshake on the control
/// connection, and its client connects right after that handshake: a client that wins
/// the race is refused (`RDMA_CM_EVENT_REJECTED`, error -111; kernel devices refuse it
/// the same way) and perftest then gives up (its retry path reuses freed ids). That
/// run is repeated, on new ports, up to twice; anything else fails the test.
fn run(lib: &LibDir, mut base: u16, prog: &str, extra: &[&str], size: u64, iters: u64) -> u16 {
    for attempt in 1..=3 {
        let (srv_dev, cli_dev, addr) = link_pair(base);
        // MPA peer-to-peer mode: ib_write_lat's passive side writes first, which plain
        // MPA forbids until the initiator's first FPDU (RFC 5044 7.1.2); the RTR is it.
        let (srv_dev, cli_dev) = (format!("{srv_dev},p2p=on"), format!("{cli_dev},p2p=on"));
        base += 2;
        let mut sargs = vec!["-R"];
        sargs.extend_from_slice(extra);
        let mut cargs = sargs.clone();
        cargs.push(&addr);
        let server = spawn(lib, Mode::DropIn, &srv_dev, prog, &sargs);
        std::thread::sleep(Duration::from_millis(700));
        let client = spawn(lib, Mode::DropIn, &cli_dev, prog, &cargs);
        let c = client.wait(Duration::from_secs(180));
        let raced = c.stdout.contains("RDMA_CM_EVENT_REJECTED; error: -111")
            || c.stderr.contains("RDMA_CM_EVENT_REJECTED; error: -111");
        let s = server.wait(Duration::from_secs(if raced { 3 } else { 30 }));
        if raced && attempt < 3 {
            eprintln!("{prog} {extra:?}: the client connected before the server listened; again");
            continue;
        }
        assert!(c.ok(), "{prog} {extra:?} client: {c:?}");
        assert!(s.ok(), "{prog} {extra:?} server: {s:?}");
        assert!(c.stdout.contains("Transport type : IW"), "{}", c.stdout);
        for (side, o) in [("client", &c), ("server", &s)] {
            let all = format!("{}{}", o.stdout, o.stderr);
            assert!(
                !all.contains("Failed") && !all.contains("libsoftiwarp:"),
                "{prog} {extra:?} {side}: {all}"
            );
        }
        let row = c
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
            .unwrap_or_else(|| panic!("{prog} {extra:?}: no result row: {}", c.stdout));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], iters.to_string(), "{row}");
        return base;
    }
    unreachable!("the last attempt asserts")
}

#[test]
fn perftest_rdma_cm_tests_complete_at_default_sizes_and_at_1_mib() {
    let progs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_write_lat",
        "ib_send_lat",
    ];
    if !progs.iter().all(|p| require(p)) {
        return;
    }
    let lib = LibDir::new("perftest");
    // (program, default size, default iterations)
    let defaults = [
        ("ib_write_bw", 65536, 5000),
        ("ib_read_bw", 65536, 1000),
        ("ib_send_bw", 65536, 1000),
        ("ib_write_lat", 2, 1000),
        ("ib_send_lat", 2, 1000),
    ];
    let mut base = 7400;
    for (prog, size, iters) in defaults {
        run(&lib, base, prog, &[], size, iters);
        base += 2;
        run(
            &lib,
            base,
            prog,
            &["-s", "1048576", "-n", "200"],
            1_048_576,
            200,
        );
        base += 2;
    }
}
